"""Loads the compiled FFI module and registers its targets for the CPU platform.

A missing or broken module must not break ``import jax_ext``: everything then runs on lax,
``native_available()`` is False, and one RuntimeWarning (also ``native_error()``) names
the cause and the cure. The three causes a user meets, each with its own cure:

* the imported ``jax_ext`` is a source folder without the compiled ``_jax_ext`` module
  (typically: Python was started from a clone's root, whose ``jax_ext/`` shadows the
  installed package);
* the compiled module is there but does not load (built for another Python or jaxlib, an
  undefined symbol, a broken file);
* it loads, but jaxlib refuses to register its FFI handlers (an FFI API version mismatch).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings

import jax

_AVAILABLE = False
_ERROR: str | None = None
TARGETS: tuple[str, ...] = ()
# The largest rank the kernels walk (their index state is fixed arrays of this size): the
# compiled module says; a call past it is routed at lowering (jax_ext._lowering).
MAX_RANK = 64

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_MODULE = "_jax_ext"


def _build_info() -> dict[str, str]:
    """What the compiled module was built against (written by CMake next to it); empty in
    a source tree or a hand-copied development build."""
    try:
        from . import _build_info as b  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return {}
    return {k: str(getattr(b, k)) for k in ("JAXLIB_VERSION", "FFI_API_VERSION")
            if hasattr(b, k)}


def _built_against() -> str:
    info = _build_info()
    if not info:
        # pyproject.toml pins the build's jaxlib to the oldest that installs on its Python.
        from ._compat import oldest_jaxlib
        jaxlib_version, api = oldest_jaxlib()
        return (f"the XLA FFI headers of jaxlib {'.'.join(map(str, jaxlib_version))} (FFI API "
                f"{api}; the build requirement in pyproject.toml for this Python)")
    return (f"the XLA FFI headers of jaxlib {info.get('JAXLIB_VERSION', '?')} "
            f"(FFI API {info.get('FFI_API_VERSION', '?')})")


def _running_with() -> str:
    import jaxlib
    jaxlib_version = getattr(jaxlib, "__version__", "?")
    return (f"jax {jax.__version__}, jaxlib {jaxlib_version}, Python "
            f"{sys.version_info.major}.{sys.version_info.minor}")


def _compiled_files(directory: str) -> list[str]:
    """Every file in `directory` that looks like a build of the module, for any Python."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(_MODULE + ".")
                  and (n.endswith(".so") or n.endswith(".pyd")))


def _loadable_name() -> str | None:
    """The module file this interpreter would import from the package folder, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.isfile(os.path.join(_PKG_DIR, _MODULE + suffix)):
            return _MODULE + suffix
    return None


def _other_installs() -> list[str]:
    """Other jax_ext folders on sys.path that hold a module this interpreter can load:
    the installed package a source tree is shadowing."""
    found = []
    for entry in sys.path:
        d = os.path.join(os.path.abspath(entry or os.curdir), "jax_ext")
        try:
            if os.path.samefile(d, _PKG_DIR):
                continue
        except OSError:
            continue  # no such folder
        if any(os.path.isfile(os.path.join(d, _MODULE + s))
               for s in importlib.machinery.EXTENSION_SUFFIXES):
            found.append(d)
    return found


def _is_source_tree() -> bool:
    parent = os.path.dirname(_PKG_DIR)
    return (os.path.isfile(os.path.join(parent, "pyproject.toml"))
            and os.path.isdir(os.path.join(parent, "xla_ffi")))


# (`pip install -e .` does not do it: scikit-build-core's editable install puts the module
# in site-packages, and a source folder first on sys.path still shadows it.)
_BUILD_IN_PLACE = ("build the module into it: cmake -S . -B build/dev "
                   "-DCMAKE_BUILD_TYPE=Release && cmake --build build/dev && "
                   "cp build/dev/_jax_ext*.so jax_ext/ (CONTRIBUTING.md, Build)")


def _explain_missing() -> str:
    """Cause (a): no module file this interpreter can import."""
    parts = [f"jax_ext was imported from {_PKG_DIR}, which has no compiled module "
             f"({_MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]})"]
    others = _compiled_files(_PKG_DIR)
    if others:
        parts.append(f"; the build there ({', '.join(others)}) is for another Python "
                     f"(this is {sys.implementation.cache_tag})")
    source = _is_source_tree()
    if source:
        parts.append(". This is a source tree, which holds no build")
    installed = _other_installs()
    if installed:
        parts.append(f". An installed jax_ext with its compiled module is at {installed[0]}, "
                     "but this folder comes first on sys.path (Python puts the current "
                     "directory first, so running from a clone's root imports the source "
                     "tree). Cure: run from another directory, use the `jax-ext-bench` "
                     "command for the benchmark, or start Python with -P")
        if source:
            parts.append("; to work on this tree itself, " + _BUILD_IN_PLACE)
    elif source:
        parts.append(". Cure: install the package (`pip install .`, or a wheel) and run "
                     "from another directory; to work on this tree itself, " + _BUILD_IN_PLACE)
    else:
        parts.append(". The package is incomplete: reinstall it "
                     "(`pip install --force-reinstall jax_ext`)")
    return "".join(parts)


def _explain_load_failure(e: BaseException, filename: str) -> str:
    """Cause (b): the file exists and this interpreter tried to load it."""
    msg = (f"the compiled module {os.path.join(_PKG_DIR, filename)} exists but failed to "
           f"load ({type(e).__name__}: {e}). It was built against {_built_against()}; this "
           f"process runs {_running_with()}.")
    text = str(e)
    if "undefined symbol" in text or "version" in text.lower():
        msg += (" An undefined symbol or a version error means it was built for another "
                "Python, jaxlib or nanobind ABI.")
    return msg + (" Cure: rebuild it for this environment (`pip install --force-reinstall "
                  "--no-cache-dir .` from a clone, or reinstall the wheel that matches this "
                  "Python)")


def _explain_registration_failure(e: BaseException) -> str:
    """Cause (c): loaded, but jaxlib would not take its handlers."""
    return (f"the compiled module loaded but registering its FFI targets failed "
            f"({type(e).__name__}: {e}). It was built against {_built_against()}; this "
            f"process runs {_running_with()}. A jaxlib whose XLA FFI API is older than the "
            "headers the module was built with rejects its handlers. Cure: install a jaxlib "
            "at least as new as the one it was built against, or rebuild jax_ext against "
            "the installed jaxlib (`pip install --force-reinstall --no-cache-dir .`)")


def _load() -> tuple[str, ...]:
    """Imports the module and registers its targets; raises _NativeError with the cause."""
    filename = _loadable_name()
    if filename is None:
        raise _NativeError(_explain_missing())
    try:
        from . import _jax_ext  # the nanobind module built from xla_ffi/
    except Exception as e:  # ImportError (bad ELF, undefined symbol) or anything it raised
        raise _NativeError(_explain_load_failure(e, filename)) from e
    global MAX_RANK
    MAX_RANK = int(getattr(_jax_ext, "MAX_RANK", MAX_RANK))
    try:
        regs = _jax_ext.registrations()
        for name, capsule in regs.items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    except Exception as e:
        raise _NativeError(_explain_registration_failure(e)) from e
    return tuple(sorted(regs))


class _NativeError(Exception):
    pass


try:
    TARGETS = _load()
    _AVAILABLE = True
except _NativeError as e:
    _ERROR = str(e)
if _ERROR is not None:
    warnings.warn(f"jax_ext: native module unavailable, every operation runs through lax "
                  f"(exact, slower): {_ERROR}", RuntimeWarning, stacklevel=2)


def native_available() -> bool:
    """Whether the native CPU kernels are available.

    Returns:
        ``True`` when the compiled FFI module loaded and its CPU targets are registered with
        XLA. ``False`` otherwise; everything then runs through lax, with the same bits, and
        :func:`native_error` says why.

    Example:
        >>> import jax_ext
        >>> jax_ext.native_available() in (True, False)
        True
    """
    return _AVAILABLE


def native_error() -> str | None:
    """Why the native module is unavailable, with the cure.

    The causes it names: a source folder without its compiled module (typically Python
    started in a clone's root, whose ``jax_ext/`` shadows the installed package), a module
    that does not load (built for another Python or jaxlib), or a jaxlib that refuses its
    handlers.

    Returns:
        ``None`` when the native module loaded; otherwise the cause and the cure, the same
        text as the ``RuntimeWarning`` that ``import jax_ext`` gave.

    Example:
        >>> import jax_ext
        >>> jax_ext.native_error() is None or isinstance(jax_ext.native_error(), str)
        True
    """
    return _ERROR
