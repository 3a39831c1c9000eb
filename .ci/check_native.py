"""The installed jax_ext loaded its native module and registered it with this jaxlib, and the
module was built on the FFI headers the build rule names (pyproject.toml's build
requirements, jax_ext._compat.OLDEST_JAXLIB: the oldest jaxlib that installs on the Python it
was built for, so never newer than any jaxlib this Python can run).

    python -P .ci/check_native.py oldest|newest

oldest: the oldest end of the support window, which runs the very jaxlib the headers came
from; newest: a newer jaxlib, the newest the package registry serves, whose minor release
must be NEWEST_TESTED. Needs only jax_ext and its run-time dependencies.
"""
import sys

import jax
import jaxlib

import jax_ext
from jax_ext import _build_info, _compat

end = sys.argv[1]
assert end in ("oldest", "newest"), end
assert jax_ext.native_available(), jax_ext.native_error()
V = _compat._version_tuple
built, running = _build_info.JAXLIB_VERSION, jaxlib.__version__
python = ".".join(map(str, sys.version_info[:2]))
print(f"ci: Python {sys.version.split()[0]}, jax {jax.__version__}, jaxlib {running}: the "
      f"native module built on jaxlib {built}'s FFI headers (FFI API "
      f"{_build_info.FFI_API_VERSION}) loaded and registered")
headers = {".".join(map(str, v)): api for _, v, api in _compat.OLDEST_JAXLIB}
here = ".".join(map(str, _compat.oldest_jaxlib()[0]))
assert built in headers and headers[built] == _build_info.FFI_API_VERSION, (
    f"the module was built on jaxlib {built}'s headers (FFI API {_build_info.FFI_API_VERSION}), "
    f"which no entry of jax_ext/_compat.py's OLDEST_JAXLIB names: {headers}")
assert V(built) <= V(here), (
    f"the module was built on jaxlib {built}'s headers, newer than {here}, the oldest jaxlib "
    f"that installs on Python {python}: an older runtime could refuse its handlers")
if end == "oldest":
    assert built == running == here, (
        f"the oldest end on Python {python} should run jaxlib {here}, the oldest that installs "
        f"there, with a module built on its headers; it runs {running} with {built}'s")
else:
    assert V(built) < V(running), (
        f"the newest end should run a jaxlib newer than {built}, not {running}")
    # The version warning's bound follows what CI runs (a newer jax warns at import and
    # fails the suite; this catches a bound raised past what CI has run).
    newest = ".".join(map(str, _compat.NEWEST_TESTED))
    assert _compat.JAX_VERSION[:2] == _compat.NEWEST_TESTED, (
        f"the newest end runs jax {jax.__version__}, but jax_ext/_compat.py's NEWEST_TESTED "
        f"says {newest}: once the suite passes on it, set NEWEST_TESTED and the window in "
        "README.md and docs/getting-started.md to it")
