"""jax.export with symbolic shapes: every op, its grad and a vmap of it, exported with
symbolic batch and inner dims, serialized, deserialized and called in a fresh process at
three or more sizes, bit-equal to the unexported function. Plus the v2 targets called
directly: sizes come from the buffers, bad dim maps are errors, never crashes."""
import os
import pickle
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from references import IMPLS, assert_bits_equal

def _rng(seed):
    return np.random.default_rng(seed)


def _vals(shape, seed, dtype=np.float32):
    return _rng(seed).standard_normal(shape).astype(dtype)


def _cond(shape, seed):
    return _rng(seed).integers(0, 2, shape).astype(bool)


def _idx(n, seed, hi=9):
    return _rng(seed).integers(-2, hi, n).astype(np.int32)


# name -> (function, specs, [args at several concrete sizes]). Symbolic names: b (batch),
# n (index length), r / c (inner dims).
def _cases():
    g = jax_ext.gather
    cases = {}
    sizes = (1, 3, 8)
    cases["where"] = (
        lambda c, x, y: jax_ext.where(c, x, y), ["r, c", "r, c", "c"],
        [(_cond((r, 4), r), _vals((r, 4), r), _vals((4,), 9)) for r in sizes]
        + [(_cond((2, c), 5), _vals((2, c), 6), _vals((c,), 7)) for c in (1, 5)])
    cases["where_vmap"] = (
        jax.vmap(lambda x, y: jax_ext.where(x > 0.5, x, y), in_axes=[0, None]), ["b, ...", None],
        [(_vals((b, 3), b), _vals((3,), 1)) for b in (1, 7, 16)])
    cases["where_grad"] = (
        jax.grad(lambda x, y: jax_ext.where(x > 0, x * 2, y).sum(), argnums=(0, 1)),
        ["r, c", "c"], [(_vals((r, c), r + c), _vals((c,), c)) for r, c in ((1, 1), (3, 4), (6, 2))])
    cases["select"] = (
        lambda c, x, y: jax_ext.select(c, x, y), ["c", "r, c", "r, c"],
        [(_cond((c,), c), _vals((r, c), r), _vals((r, c), r + 1)) for r, c in ((1, 2), (4, 3), (5, 7))])
    cases["select_vmap_grad"] = (
        jax.vmap(jax.grad(lambda c, x, y: jax_ext.select(c, x, y).sum(), argnums=1)),
        ["b, c", "b, r, c", "b, r, c"],
        [(_cond((b, 3), b), _vals((b, r, 3), b), _vals((b, r, 3), r)) for b, r in ((1, 2), (3, 1), (4, 5))])
    cases["where3_rows"] = (
        lambda c, x, y: jax_ext.where3(c, x, y), ["r", "r, c", "r, c"],
        [(_cond((r,), r), _vals((r, c), r), _vals((r, c), c)) for r, c in ((1, 3), (4, 2), (9, 5))])
    cases["where3_vmap"] = (
        jax.vmap(lambda c, x, y: jax_ext.where3(c, x, y), in_axes=(0, 0, None)),
        ["b, r", "b, r, c", "r, c"],
        [(_cond((b, 2), b), _vals((b, 2, c), b), _vals((2, c), c)) for b, c in ((1, 1), (5, 3), (2, 8))])
    cases["where3_grad"] = (
        jax.grad(lambda x, y: jax_ext.where3(x > 0, x, y * 3).sum(), argnums=(0, 1)),
        ["r, c", "r, c"], [(_vals((r, c), r), _vals((r, c), c)) for r, c in ((1, 1), (2, 7), (5, 3))])
    src = lambda r, c, k=2: _vals((r, k, c), r * c)  # noqa: E731
    cases["gather"] = (
        lambda s, i: g(s, [0], 0, i), ["r, k, c", "n"],
        [(src(r, c), _idx(n, n, r + 2)) for r, c, n in ((1, 1, 1), (6, 3, 4), (9, 8, 11), (4, 13, 2))])
    cases["gather_dim1_traced"] = (
        lambda s, i, o, p: g(s, [o, 1], 1, i, num_indices=o + 1, pad_value=p, check_bounds=True),
        ["r, k, c", "n", None, None],
        [(src(r, c, 4), _idx(n, n, 5), np.int32(1), np.float32(-2)) for r, c, n in ((2, 1, 3), (3, 7, 5), (5, 2, 1))])
    cases["gather_noalign_clamp"] = (
        lambda s, i: g(s, [0], 0, i, align_bytes=None, check_bounds=False), ["r, k, c", "n"],
        [(src(r, c), _idx(n, n, r + 3)) for r, c, n in ((1, 2, 2), (5, 5, 6), (7, 1, 3))])
    cases["gather_static_num"] = (
        lambda s, i: g(s, [0], 0, i, num_indices=2, pad_value=7.0), ["r, k, c", "n"],
        [(src(r, c), _idx(n, n, r)) for r, c, n in ((3, 1, 2), (4, 3, 5), (2, 6, 9))])
    cases["gather_grad"] = (
        jax.grad(lambda s, i: (g(s, [0], 0, i) * 1.5).sum()), ["r, k, c", "n"],
        [(src(r, c), _idx(n, n, r)) for r, c, n in ((1, 1, 4), (4, 3, 9), (8, 6, 2))])
    cases["gather_grad_src_and_pad"] = (
        jax.grad(lambda s, p, i: g(s, [0], 0, i, pad_value=p).sum(), argnums=(0, 1)),
        ["r, k, c", None, "n"],
        [(src(r, c), np.float32(2), _idx(n, n, r + 2)) for r, c, n in ((5, 3, 3), (2, 9, 1), (7, 1, 6))])
    cases["gather_vmap"] = (
        jax.vmap(lambda s, i: g(s, [0], 0, i), in_axes=(None, 0)), ["r, k, c", "b, n"],
        [(src(r, 3), np.stack([_idx(n, b + j, r) for j in range(b)])) for r, n, b in ((2, 1, 1), (5, 4, 3), (3, 6, 7))])
    cases["gather_vmap_grad"] = (
        jax.vmap(jax.grad(lambda s, i: g(s, [0], 0, i).sum())), ["b, r, k, c", "b, n"],
        [(np.stack([src(r, c)] * b), np.stack([_idx(n, j, r) for j in range(b)]))
         for b, r, c, n in ((1, 2, 2, 2), (3, 4, 5, 6), (6, 1, 3, 3))])
    return cases


_CHILD = textwrap.dedent("""
    import pickle, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[3])  # the tests folder
    import future_defaults
    future_defaults.apply()  # where JAX_EXT_FUTURE_DEFAULTS=1 asks for jax's future defaults
    import jax_ext  # registers the targets the exports name
    import numpy as np
    with open(sys.argv[1], "rb") as f:
        jobs = pickle.load(f)
    out = {}
    for name, (blob, calls) in jobs.items():
        exp = jax.export.deserialize(bytearray(blob))
        out[name] = [[np.asarray(r) for r in jax.tree.leaves(exp.call(*a))] for a in calls]
    with open(sys.argv[2], "wb") as f:
        pickle.dump(out, f)
""")


def _run_child(tmp_path, jobs):
    src, dst = tmp_path / "jobs.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(jobs, f)
    # The child imports the jax_ext this process imported (the sanitized build under
    # .ci/sanitize.sh, which runs python -P), not whatever lies on its working directory.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(jax_ext.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg_parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # -P and a working directory of its own: `python -c` would otherwise put the directory
    # pytest started in first on sys.path, and a clone's root holds the unbuilt source tree.
    r = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(src), str(dst),
                        os.path.dirname(os.path.abspath(__file__))], env=env,
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(dst, "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("impl", IMPLS)
def test_symbolic_exports_run_in_a_fresh_process(tmp_path, impl):
    if impl != "lax" and not jax_ext.native_available():
        pytest.skip("needs the native module")
    jobs, want = {}, {}
    for name, (fn, spec, calls) in _cases().items():
        specs = jax.export.symbolic_args_specs(calls[0], spec)
        with jax_ext.implementation(impl):
            exp = jax.export.export(jax.jit(fn), disabled_checks=jax_ext.export_checks())(*specs)
        text = exp.mlir_module()
        if impl == "native":  # the targets whose sizes come from the buffers at run time
            assert "_v2" in text and "_v1" not in text, name
            assert any(f"jax_ext_{t}_v2" in text for t in ("select", "gather", "scatter_add"))
        elif impl == "lax":  # a portable program: no jax_ext custom call
            assert "custom_call @jax_ext_" not in text, name
        else:  # auto: per call site, and never a target that takes shapes as attributes
            assert "_v1" not in text, name
        assert len(calls) >= 3
        jobs[name] = (bytes(exp.serialize()), calls)
        want[name] = [[np.asarray(r) for r in jax.tree.leaves(jax.jit(fn)(*a))] for a in calls]
    # a static export calls the same targets and runs in the same fresh process (programs
    # exported with the *_v1 targets: tests/test_released_targets.py)
    c, x = _cond((3, 4), 0), _vals((3, 4), 1)
    with jax_ext.implementation("native" if jax_ext.native_available() else "lax"):
        static = jax.export.export(jax.jit(lambda c, x: jax_ext.where(c, x, -x)),
                                   disabled_checks=jax_ext.export_checks())(c, x)
    text = static.mlir_module()
    assert ("jax_ext_select_v2" in text and "_v1" not in text) or not jax_ext.native_available()
    jobs["static"] = (bytes(static.serialize()), [(c, x)])
    want["static"] = [[np.asarray(jax_ext.where(c, x, -x))]]
    got = _run_child(tmp_path, jobs)
    for name in jobs:
        for g_call, w_call in zip(got[name], want[name]):
            for a, b in zip(g_call, w_call):
                assert_bits_equal(a, b)


def test_issue_snippet_symbolic_batch():
    f = jax.vmap(lambda x, y: jax_ext.where(x > 5., x, y), in_axes=[0, None])
    specs = jax.export.symbolic_args_specs([np.zeros((7, 3), np.float32), np.ones(3, np.float32)],
                                           ["b, ...", None])
    exp = jax.export.export(jax.jit(f), disabled_checks=jax_ext.export_checks())(*specs)
    for b in (1, 2, 7, 30):
        x = np.arange(b * 3, dtype=np.float32).reshape(b, 3)
        y = np.full(3, -1, np.float32)
        assert_bits_equal(exp.call(x, y), jnp.where(x > 5., x, y))


def test_export_checks_cover_every_target():
    names = {c.custom_call_target_name if hasattr(c, "custom_call_target_name") else str(c)
             for c in jax_ext.export_checks()}
    text = " ".join(map(str, jax_ext.export_checks())) + " ".join(names)
    for t in ("select", "gather", "scatter_add"):
        for v in ("v1", "v2"):
            assert f"jax_ext_{t}_{v}" in text


# --- the v2 targets called directly ----------------------------------------------------

def _i64(v):
    return np.asarray(v, np.int64).reshape(-1)


@pytest.mark.skipif(not jax_ext.native_available(), reason="needs the native module")
def test_v2_direct_calls_and_bad_maps():
    c, x, y = _cond((3, 1), 0), _vals((3, 4), 1), _vals((4,), 2)
    f = jax.ffi.ffi_call("jax_ext_select_v2", jax.ShapeDtypeStruct((3, 4), np.float32))
    got = f(c, x, y, cond_dims=_i64([0, 1]), x_dims=_i64([0, 1]), y_dims=_i64([1]))
    assert_bits_equal(got, np.where(c, x, y))
    maps = lambda c, x, y: dict(cond_dims=_i64(c), x_dims=_i64(x), y_dims=_i64(y))  # noqa: E731
    for bad, msg in ((maps([0], [0, 1], [1]), r"cond has rank 2 but its dim map \(0,\) names 1"),
                     (maps([0, 1], [1, 0], [1]), r"x \(3, 4\) does not map onto the result "
                                                 r"\(3, 4\) with dims \(1, 0\)"),
                     (maps([0, 1], [0, 1], [0]), r"y \(4,\) does not map onto the result"),
                     (maps([0, 5], [0, 1], [1]), r"cond dim map \(0, 5\) does not fit the result "
                                                 r"rank 2"),
                     (maps([0, 0], [0, 1], [1]), r"cond dim map \(0, 0\) does not fit")):
        with pytest.raises(Exception, match="jax_ext select: " + msg):
            jax.block_until_ready(f(c, x, y, **bad))
    src, idx = _vals((5, 2, 3), 3), np.array([0, 4, 7, -1], np.int32)
    offs, num, pad = np.array([0], np.int64), np.int64(4), np.float32(0)
    gf = jax.ffi.ffi_call("jax_ext_gather_v2", jax.ShapeDtypeStruct((4, 2, 3), np.float32))
    got = gf(src, offs, idx, num, pad, dim=np.int64(0), nbatch=np.int64(0),
             check_bounds=np.bool_(True))
    assert_bits_equal(got, jax_ext.gather(src, [0], 0, idx, align_bytes=None))
    for kw, shape in ((dict(dim=np.int64(1)), (4, 2, 3)), (dict(dim=np.int64(2)), (4, 3)),
                      (dict(nbatch=np.int64(1)), (4, 2, 3)), (dict(), (4, 5, 3)),
                      (dict(), (3, 2, 3)), (dict(), (4, 2, 2))):
        a = dict(dict(dim=np.int64(0), nbatch=np.int64(0), check_bounds=np.bool_(True)), **kw)
        bad = jax.ffi.ffi_call("jax_ext_gather_v2", jax.ShapeDtypeStruct(shape, np.float32))
        with pytest.raises(Exception, match="gather"):
            jax.block_until_ready(bad(src, offs, idx, num, pad, **a))
    sf = jax.ffi.ffi_call("jax_ext_scatter_add_v2", jax.ShapeDtypeStruct((5, 2, 3), np.float32))
    ct = _vals((4, 2, 3), 4)
    got = sf(ct, offs, idx, num, dim=np.int64(0), nbatch=np.int64(0), check_bounds=np.bool_(True))
    want = jax.linear_transpose(lambda s: jax_ext.gather(s, [0], 0, idx, align_bytes=None),
                                src)(ct)[0]
    assert_bits_equal(got, want)
    for kw, ctshape in ((dict(nbatch=np.int64(2)), (4, 2, 3)), (dict(dim=np.int64(-1)), (4, 2, 3)),
                        (dict(), (4, 3)), (dict(), (5, 2, 3))):
        a = dict(dict(dim=np.int64(0), nbatch=np.int64(0), check_bounds=np.bool_(True)), **kw)
        with pytest.raises(Exception, match="scatter_add"):
            jax.block_until_ready(sf(_vals(ctshape, 5), offs, idx, num, **a))


@pytest.mark.parametrize("name", ["where", "where_vmap", "where_grad", "select", "where3_rows"]
                         + [n for n in _cases() if n.startswith("gather")][:6])
def test_symbolic_exports_on_the_lax_path(name):
    """implementation("lax") (and "auto" where it takes lax) exports with symbolic dims too:
    no static size is asked of a symbolic dim, and the call agrees at every size."""
    fn, spec, calls = _cases()[name]
    specs = jax.export.symbolic_args_specs(calls[0], spec)
    with jax_ext.implementation("lax"):
        exp = jax.export.export(jax.jit(fn), disabled_checks=jax_ext.export_checks())(*specs)
        assert "custom_call @jax_ext" not in exp.mlir_module()
        for args in calls:
            for got, want in zip(jax.tree.leaves(exp.call(*args)),
                                 jax.tree.leaves(jax.jit(fn)(*args))):
                assert_bits_equal(got, want)


def _hard_bits(dtype, shape, seed):
    """Values with NaN payloads, signalling NaNs, -0.0 and denormals among random bits."""
    dt = np.dtype(dtype)
    raw = _rng(seed).integers(0, 256, size=tuple(shape) + (dt.itemsize,), dtype=np.uint8)
    out = raw.view(dt).reshape(shape).copy()
    if dt.itemsize == 2:
        special = np.array([0x7f91, 0xffc1, 0x0001, 0x8000, 0x7f81], np.uint16).view(dt)
        out.reshape(-1)[:special.size] = special[:out.size]
    return out


@pytest.mark.parametrize("platforms", [("cpu",), ("cpu", "cuda")])
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2", "float16"])
def test_symbolic_exact_views_refine(dtype, platforms):
    """The lax path's exact views (bfloat16 moved as bytes through the gather, as uint16
    through the select; float8 as uint8) keep shape refinement possible with symbolic dims,
    for a portable export and under implementation("lax"), and keep every bit."""
    import ml_dtypes
    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    scope = jax.export.SymbolicScope()
    sds = lambda s, d: jax.ShapeDtypeStruct(jax.export.symbolic_shape(s, scope=scope), d)  # noqa: E731
    pad = _hard_bits(dt, (), 3)
    fns = {
        "gather": (lambda s, i: jax_ext.gather(s, [0], 0, i, num_indices=3, pad_value=pad),
                   [sds("r, 5", dt), sds("n", np.int32)],
                   lambda r, n: (_hard_bits(dt, (r, 5), r), _idx(n, n, r + 2))),
        "where": (lambda c, x, y: jax_ext.where(c, x, y),
                  [sds("r, c", np.bool_), sds("r, c", dt), sds("c", dt)],
                  lambda r, c: (_cond((r, c), r), _hard_bits(dt, (r, c), c),
                                _hard_bits(dt, (c,), r))),
    }
    for name, (fn, specs, make) in fns.items():
        with jax_ext.implementation("lax"):
            exp = jax.export.export(jax.jit(fn), disabled_checks=jax_ext.export_checks(),
                                    platforms=platforms)(*specs)
        for r, n in ((1, 3), (4, 6), (9, 4)):
            args = make(r, n)
            with jax_ext.implementation("lax"):
                want = jax.jit(fn)(*args)
            assert_bits_equal(exp.call(*args), want)
            if name == "where":
                assert_bits_equal(want, np.where(args[0], args[1], args[2]).view(dt))
