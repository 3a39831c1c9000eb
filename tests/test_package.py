"""The package as a newcomer meets it: import-time behaviour, the JAX_EXT_IMPL default,
a missing native module, the public surface."""
import os
import subprocess
import sys
import textwrap

import jax_ext


def _run(code, **env):
    e = dict(os.environ, **env)
    # -P: never import the source tree (it has no compiled module) instead of the install.
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
        c, x = np.ones(1 << 16, bool), np.ones(1 << 16, np.float32)  # enough work for auto
        print("custom_call" in jax.jit(jax_ext.where).lower(c, x, x).as_text())
        with jax_ext.implementation("native"):
            print("custom_call" in jax.jit(jax_ext.where).lower(c, x, x).as_text())
    """
    out, _ = _run(code, JAX_EXT_IMPL="lax")
    assert out.split() == ["False", "True"]
    out, _ = _run(code, JAX_EXT_IMPL="auto")
    assert out.split() == ["True", "True"]


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
