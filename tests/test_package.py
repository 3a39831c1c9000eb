"""The package as a newcomer meets it: import-time behaviour, the JAX_EXT_IMPL default,
a missing native module, the public surface."""
import importlib.machinery
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax_ext

PKG = os.path.dirname(os.path.abspath(jax_ext.__file__))
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
IMPL_MESSAGE = "implementation: name must be one of ('auto', 'native', 'lax'), got "


def _child_env(**env):
    """The environment for a child Python that imports the jax_ext this process tests
    (the worktree's or the installed one), whatever its working directory."""
    path = [os.path.dirname(PKG)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **env)


def _run(code, **env):
    e = _child_env(**env)
    # -P: the working directory ("/") is not searched, PYTHONPATH is.
    r = subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr


def test_public_api():
    for name in ("select", "where", "where3", "gather", "native_available", "implementation",
                 "export_checks"):
        assert name in jax_ext.__all__ and callable(getattr(jax_ext, name))


def test_env_var_sets_the_default_implementation():
    code = """
        import jax, numpy as np, jax_ext
        c, x = np.ones(1 << 16, bool), np.ones(1 << 16, np.float32)
        print(jax_ext._config.current(),
              "custom_call" in jax.jit(jax_ext.where).lower(c, x, x).as_text())
        with jax_ext.implementation("native"):
            print("custom_call" in jax.jit(jax_ext.where).lower(c, x, x).as_text())
        with jax_ext.implementation("lax"):
            print("custom_call" in jax.jit(jax_ext.where).lower(c, x, x).as_text())
    """
    out, _ = _run(code, JAX_EXT_IMPL="native")
    assert out.split() == ["native", "True", "True", "False"]
    out, _ = _run(code, JAX_EXT_IMPL="lax")
    assert out.split() == ["lax", "False", "True", "False"]
    # the shipped thresholds: a standalone call on arguments takes the kernel (test_auto.py)
    out, _ = _run(code, JAX_EXT_IMPL="auto")
    assert out.split() == ["auto", "True", "True", "False"]


def test_missing_native_module_warns_once_and_runs_on_lax():
    out, err = _run("""
        import sys, warnings
        sys.modules["jax_ext._jax_ext"] = None  # as if the build had failed
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import jax_ext
        msgs = [str(x.message) for x in w if "native module" in str(x.message)]
        import jax, numpy as np
        c = np.array([True, False, True])
        x, y = np.arange(3.0, dtype=np.float32), np.full(3, -0.0, np.float32)
        with jax_ext.implementation("native"):  # asked for, not available: lax, no crash
            r = jax_ext.where(c, x, y)
            g = jax_ext.gather(np.arange(12, dtype=np.int32).reshape(4, 3), [0], 0,
                               np.array([3, 9, 0]), align_bytes=None)
        print(len(msgs), jax_ext.native_available(), np.asarray(r).tolist(),
              np.signbit(np.asarray(r))[1], np.asarray(g).tolist(),
              "custom_call" in jax.jit(jax_ext.where).lower(c, x, y).as_text())
    """)
    assert out.split("\n")[0] == ("1 False [0.0, -0.0, 2.0] True [[9, 10, 11], [0, 0, 0], "
                                  "[0, 1, 2]] False")


@pytest.mark.parametrize("value", ["LAX", "bogus", "", "Native"])
def test_unknown_env_value_raises_at_import_like_implementation(value):
    e = _child_env(JAX_EXT_IMPL=value)
    r = subprocess.run([sys.executable, "-P", "-c", "import jax_ext"], env=e, cwd="/",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: " + IMPL_MESSAGE + repr(value)), r.stderr[-2000:]
    assert "JAX_EXT_IMPL" in last
    with pytest.raises(ValueError) as exc:  # the same message, in-process
        jax_ext.implementation(value)
    assert last.startswith("ValueError: " + str(exc.value))


def _package_copy(root, *, with_module):
    """A copy of the jax_ext package (its Python files, subpackages and data) under
    root/jax_ext, with the compiled module or without it."""
    d = os.path.join(root, "jax_ext")

    def skip(where, names):
        return [n for n in names if n == "__pycache__" or n.endswith(".pyi")
                or (n.startswith("_jax_ext.") and not (with_module and where == PKG))]
    shutil.copytree(PKG, d, ignore=skip)
    return d


def _import_report(cwd, pythonpath="", pre=""):
    """Imports jax_ext in a child process started in `cwd` (which, as for any `python -c`,
    comes first on sys.path); returns (native_available, native_error, warnings)."""
    code = textwrap.dedent(f"""
        import json, warnings
        {pre}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import jax_ext
        print(json.dumps([jax_ext.__file__, jax_ext.native_available(),
                          jax_ext.native_error(),
                          [str(x.message) for x in w if x.category is RuntimeWarning]]))
    """)
    e = dict(os.environ, PYTHONPATH=pythonpath)
    e.pop("JAX_EXT_IMPL", None)
    r = subprocess.run([sys.executable, "-c", code], env=e, cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    file, ok, err, warns = json.loads(r.stdout.strip().splitlines()[-1])
    assert file.startswith(str(cwd)) or pythonpath, file
    return ok, err, warns


def _check_reported(ok, err, warns):
    assert ok is False and err
    native = [x for x in warns if "native module" in x]
    assert len(native) == 1 and err in native[0], warns  # one warning, with the cause


def test_cause_source_tree_shadowing_the_installed_package(tmp_path):
    # A clone's root: jax_ext/ without the compiled module, found before the install.
    src = _package_copy(tmp_path / "clone", with_module=False)
    installed = _package_copy(tmp_path / "site", with_module=True)
    ok, err, warns = _import_report(tmp_path / "clone", pythonpath=str(tmp_path / "site"))
    _check_reported(ok, err, warns)
    assert f"imported from {src}, which has no compiled module (_jax_ext{SUFFIX})" in err
    assert f"An installed jax_ext with its compiled module is at {installed}" in err
    assert "run from another directory" in err and "jax-ext-bench" in err


def test_cause_source_tree_without_any_build(tmp_path):
    clone = tmp_path / "clone"
    src = _package_copy(clone, with_module=False)
    (clone / "pyproject.toml").write_text("")
    (clone / "xla_ffi").mkdir()
    ok, err, warns = _import_report(clone)
    _check_reported(ok, err, warns)
    assert f"imported from {src}, which has no compiled module" in err
    assert "This is a source tree" in err and "cp build/dev/_jax_ext*.so jax_ext/" in err


def test_cause_module_for_another_python(tmp_path):
    src = _package_copy(tmp_path, with_module=False)
    open(os.path.join(src, "_jax_ext.cpython-39-x86_64-linux-gnu.so"), "wb").close()
    ok, err, warns = _import_report(tmp_path)
    _check_reported(ok, err, warns)
    assert "_jax_ext.cpython-39-x86_64-linux-gnu.so) is for another Python" in err


def test_cause_module_that_fails_to_load(tmp_path):
    src = _package_copy(tmp_path, with_module=False)
    with open(os.path.join(src, "_jax_ext" + SUFFIX), "wb") as f:
        f.write(b"not a shared library")  # as a truncated or foreign-ABI build would fail
    with open(os.path.join(src, "_build_info.py"), "w") as f:
        f.write('JAXLIB_VERSION = "0.10.9"\nFFI_API_VERSION = "0.7"\n')
    ok, err, warns = _import_report(tmp_path)
    _check_reported(ok, err, warns)
    assert f"the compiled module {os.path.join(src, '_jax_ext' + SUFFIX)} exists but failed " \
           "to load (ImportError: " in err
    import jax
    import jaxlib
    assert "built against the XLA FFI headers of jaxlib 0.10.9 (FFI API 0.7)" in err
    assert f"this process runs jax {jax.__version__}, jaxlib {jaxlib.__version__}" in err
    assert "Cure: rebuild it" in err


def test_a_build_without_its_record_is_said_to_use_this_pythons_oldest_headers(monkeypatch):
    """A module without _build_info.py (a hand-copied development build) is described as
    built on the headers the build requirement names for this Python."""
    from jax_ext import _compat, _native
    monkeypatch.setattr(_native, "_build_info", lambda: {})
    version, api = _compat.oldest_jaxlib()
    assert _native._built_against() == (
        f"the XLA FFI headers of jaxlib {'.'.join(map(str, version))} (FFI API {api}; the "
        "build requirement in pyproject.toml for this Python)")


def test_cause_registration_refused(tmp_path):
    _package_copy(tmp_path, with_module=True)
    pre = """
        import jax.ffi
        def refuse(name, capsule, platform):
            raise RuntimeError("FFI handler's API version (0, 9) is newer than the runtime's")
        jax.ffi.register_ffi_target = refuse
    """
    ok, err, warns = _import_report(tmp_path, pre=textwrap.indent(textwrap.dedent(pre), "        "))
    _check_reported(ok, err, warns)
    assert err.startswith("the compiled module loaded but registering its FFI targets failed "
                          "(RuntimeError: FFI handler's API version (0, 9) is newer")
    assert "install a jaxlib at least as new as the one it was built against" in err


def test_native_error_is_none_when_loaded():
    if jax_ext.native_available():
        assert jax_ext.native_error() is None
    else:
        assert jax_ext.native_error()


def test_benchmark_console_script():
    """`jax-ext-bench` (the README's benchmark command) runs jax_ext.bench:main of the
    installed package, also when started in the clone's root."""
    import importlib.metadata
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent
    assert 'jax-ext-bench = "jax_ext.bench:main"' in (root / "pyproject.toml").read_text()
    from jax_ext import bench
    assert callable(bench.main)
    try:
        dist = importlib.metadata.distribution("jax_ext")
        installed_here = os.path.samefile(str(dist.locate_file("jax_ext")), PKG)
    except (importlib.metadata.PackageNotFoundError, OSError):
        installed_here = False
    if not installed_here:
        return  # testing a source tree: the script belongs to some other install
    (ep,) = [e for e in dist.entry_points if e.name == "jax-ext-bench"]
    assert ep.group == "console_scripts" and ep.value == "jax_ext.bench:main"
    script = os.path.join(os.path.dirname(sys.executable), "jax-ext-bench")
    # Started in the clone's root, whose jax_ext/ has no compiled module: importing that
    # would warn (an error here), so success means the installed package was used.
    r = subprocess.run([script, "--help"], cwd=root, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONWARNINGS="error::RuntimeWarning"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "usage" in r.stdout


def test_public_signatures_are_annotated():
    import typing

    import jax
    from jax.typing import ArrayLike
    for fn in (jax_ext.select, jax_ext.where, jax_ext.where3, jax_ext.gather):
        hints = typing.get_type_hints(fn)  # resolvable at run time, not only for mypy
        assert hints.pop("return") is jax.Array, fn.__name__
        assert all(hints[a] == ArrayLike for a in list(hints)[:1]), (fn.__name__, hints)
    assert typing.get_args(typing.get_type_hints(jax_ext.select)["auto_broadcast"]) == (
        "numpy", "none")
    assert typing.get_args(typing.get_type_hints(jax_ext.implementation)["name"]) == (
        "auto", "native", "lax")
    assert os.path.isfile(os.path.join(PKG, "py.typed"))
    assert os.path.isfile(os.path.join(PKG, "_jax_ext.pyi"))


def _ffi_api_version(include_dir):
    """XLA_FFI_API_MAJOR.MINOR of the FFI headers under `include_dir`."""
    import re
    with open(os.path.join(include_dir, "xla", "ffi", "api", "c_api.h")) as f:
        text = f.read()
    return tuple(int(re.search(rf"^#define XLA_FFI_API_{part} (\d+)", text, re.M).group(1))
                 for part in ("MAJOR", "MINOR"))


def test_build_requirements_pin_the_oldest_jaxlib_of_each_python():
    """pyproject.toml's build requirements pin, by environment marker, the jaxlib (and the
    jax) that _compat.OLDEST_JAXLIB names for each Python the package supports: the two are
    the one table, written twice, and must agree."""
    import pathlib
    import tomllib

    from packaging.requirements import Requirement

    from jax_ext import _compat
    root = pathlib.Path(__file__).resolve().parent.parent
    requires = [Requirement(r) for r in
                tomllib.loads((root / "pyproject.toml").read_text())["build-system"]["requires"]]
    assert _compat.OLDEST_JAXLIB[0][1] == _compat.MIN_JAX  # the oldest supported release
    for minor in range(11, 16):
        env = {"python_version": f"3.{minor}", "python_full_version": f"3.{minor}.0"}
        pins = {r.name: str(r.specifier) for r in requires
                if r.name in ("jax", "jaxlib") and (r.marker is None or r.marker.evaluate(env))}
        want = ".".join(map(str, _compat.oldest_jaxlib((3, minor))[0]))
        assert pins == {"jax": f"=={want}", "jaxlib": f"=={want}"}, (minor, pins)


def test_module_built_on_the_oldest_ffi_headers_registers_in_this_jaxlib():
    """Every build is compiled against the XLA FFI headers of the oldest jaxlib that installs
    on the Python it is built for (pyproject.toml pins it as a build requirement, by
    environment marker; _compat.OLDEST_JAXLIB names it): a handler built with newer headers
    can be rejected by an older runtime, while a newer one accepts older handlers. A wheel
    built on an earlier Python (the cp312-abi3 one) carries that Python's headers, which are
    no newer. CI runs this suite at both ends of the support window, so one build loads and
    registers in the oldest jaxlib and in the newest."""
    import jax
    import jaxlib
    from jax_ext import _compat, _names, _native
    assert jax_ext.native_available(), jax_ext.native_error()
    info = _native._build_info()
    oldest = {".".join(map(str, v)): api for _, v, api in _compat.OLDEST_JAXLIB}
    built = info["JAXLIB_VERSION"]
    # the headers of some Python's oldest jaxlib, and no newer than this Python's oldest
    assert built in oldest and info["FFI_API_VERSION"] == oldest[built], info
    here, _ = _compat.oldest_jaxlib()
    assert _compat._version_tuple(built) <= here, (info, here)
    running = _ffi_api_version(jax.ffi.include_dir())
    assert running >= _compat._version_tuple(info["FFI_API_VERSION"])[:2], (running, info)
    if _compat._version_tuple(jaxlib.__version__) > _compat._version_tuple(built):
        # the newest end: the newer jaxlib has a newer FFI API, and it took the module
        assert running > _compat._version_tuple(info["FFI_API_VERSION"])[:2], (
            jaxlib.__version__, running)
    with jax_ext.implementation("native"):  # and its handlers run here
        text = jax.jit(jax_ext.where).lower(np.array([True]), np.ones(1), np.zeros(1))
        assert _names.SELECT.target in text.as_text()
        assert np.asarray(jax_ext.where(np.array([True, False]), np.ones(2), -0.0)).tolist() \
            == [1.0, -0.0]


@pytest.mark.parametrize("version,env,warns", [
    ("0.10.2", {}, False), ("0.12.0.1", {}, False), ("0.12.7", {}, False),
    ("0.13.0", {}, True), ("1.0.0", {}, True), ("0.13.0.dev20270101", {}, True),
    ("0.13.0", {"JAX_EXT_NO_VERSION_WARNING": "1"}, False),
    ("0.13.0", {"JAX_EXT_NO_VERSION_WARNING": "0"}, True),
    ("0.13.0", {"JAX_EXT_NO_VERSION_WARNING": ""}, True),
])
def test_version_warning_only_past_the_newest_tested_jax(version, env, warns):
    from jax_ext import _compat
    msg = _compat.version_warning(version, env)
    assert (msg is not None) == warns, msg
    if warns:
        assert f"jax {version} is newer" in msg and "tested with jax up to 0.12.x" in msg
        assert "set JAX_EXT_NO_VERSION_WARNING=1 to silence" in msg


def test_version_warning_at_import_and_its_switch():
    """A child whose jax says it is a release newer than the newest tested one warns once at
    `import jax_ext`; JAX_EXT_NO_VERSION_WARNING=1 silences it."""
    code = """
        import json, warnings
        import jax
        jax.__version__ = "0.99.0"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import jax_ext
        print(json.dumps([str(x.message) for x in w if x.category is RuntimeWarning]))
    """
    env = {k: v for k, v in os.environ.items() if k != "JAX_EXT_NO_VERSION_WARNING"}
    import json
    r = subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(code)], cwd="/",
                       env=dict(_child_env(), **env), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (msg,) = json.loads(r.stdout.strip().splitlines()[-1])
    assert "jax 0.99.0 is newer" in msg and "JAX_EXT_NO_VERSION_WARNING=1" in msg
    out, _ = _run(code, JAX_EXT_NO_VERSION_WARNING="1")
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_import_is_silent_on_this_jax():
    """CI's jax (either end of the support window) is tested, so importing jax_ext and
    running it warns about nothing, not even under -W error."""
    e = {k: v for k, v in _child_env().items() if k != "JAX_EXT_NO_VERSION_WARNING"}
    code = ("import jax_ext, numpy as np; "
            "jax_ext.where(np.array([True]), np.ones(1), np.zeros(1)).block_until_ready()")
    r = subprocess.run([sys.executable, "-P", "-W", "error", "-c", code], cwd="/", env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
