"""Lowering for platforms other than CPU, and for several platforms at once (a
``jax.export`` artifact that must run on CPU and GPU): every jax_ext op takes the lax path
there, even under implementation("native"), and a multi-platform export run on CPU gives
the same bits as numpy. The CPU-only lowering of the same functions holds the kernels, so
each test can fail both ways. These run on any machine: jax lowers for a platform without
its device."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from references import assert_bits_equal

_CALL = re.compile(r"custom_call @jax_ext_")


def _np_gather(src, idx):
    out = np.zeros((idx.size,) + src.shape[1:], src.dtype)
    ok = (idx >= 0) & (idx < src.shape[0])
    out[ok] = src[idx[ok]]
    return out


def _cases():
    rng = np.random.default_rng(5)
    c = rng.integers(0, 2, 300).astype(bool)
    x = rng.standard_normal(300).astype(np.float32)
    x[:3] = [np.nan, -0.0, np.inf]
    y = rng.standard_normal(300).astype(np.float32)
    rows_c = rng.integers(0, 2, 40).astype(bool)
    rows_x = rng.standard_normal((40, 8)).astype(np.float32)
    rows_y = rng.standard_normal((40, 8)).astype(np.float32)
    src = rng.standard_normal((50, 8)).astype(np.float32)
    idx = rng.integers(-3, 55, 70).astype(np.int32)
    bsrc = rng.standard_normal((3, 20, 8)).astype(np.float32)
    bidx = rng.integers(0, 20, (3, 9)).astype(np.int32)
    g = jax_ext.gather
    return {
        "where": (jax_ext.where, (c, x, y), lambda c, x, y: np.where(c, x, y)),
        "select broadcast": (jax_ext.select, (rows_c[:, None], rows_x, rows_y[:1]),
                             lambda c, x, y: np.where(c, x, y)),
        "where3 rows": (jax_ext.where3, (rows_c, rows_x, rows_y),
                        lambda c, x, y: np.where(c[:, None], x, y)),
        "gather": (lambda s, i: g(s, [0], 0, i), (src, idx), _np_gather),
        "gather grad": (jax.grad(lambda s, i: jnp.sum(g(s, [0], 0, i) * 2.0)), (src, idx),
                        lambda s, i: np.bincount(i[(i >= 0) & (i < 50)], minlength=50)
                        .astype(np.float32)[:, None].repeat(8, 1) * np.float32(2.0)),
        "vmap gather": (jax.vmap(lambda s, i: g(s, [0], 0, i)), (bsrc, bidx),
                        lambda s, i: np.stack([s[k][i[k]] for k in range(3)])),
    }


CASES = _cases()


def _lowered(f, args, platforms):
    with jax_ext.implementation("native"):
        return jax.jit(f).trace(*args).lower(lowering_platforms=platforms).as_text()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("platform", ["cuda", "rocm", "tpu"])
def test_other_platforms_lower_to_lax(platform, name):
    f, args, _ = CASES[name]
    assert _CALL.search(_lowered(f, args, ("cpu",))), "the CPU lowering runs the kernel"
    assert not _CALL.search(_lowered(f, args, (platform,)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_export_for_cpu_and_gpu_is_portable_and_exact(name):
    f, args, ref = CASES[name]
    with jax_ext.implementation("native"):
        exp = jax.export.export(jax.jit(f), platforms=("cpu", "cuda"),
                                disabled_checks=jax_ext.export_checks())(*args)
    assert exp.platforms == ("cpu", "cuda")
    assert not _CALL.search(exp.mlir_module())
    back = jax.export.deserialize(exp.serialize())
    assert_bits_equal(back.call(*args), ref(*args))


@pytest.mark.gpu
def test_explain_reports_a_multi_platform_lowering_as_lax():
    rng = np.random.default_rng(0)
    c, x = rng.integers(0, 2, 1 << 14).astype(bool), rng.standard_normal(1 << 14)
    with jax_ext.auto.explain.recording() as decisions, jax_ext.implementation("native"):
        jax.jit(jax_ext.where).trace(c, x, -x).lower(lowering_platforms=("cpu", "cuda"))
    assert [(d.op, d.impl) for d in decisions] == [("select", "lax")]
    assert "several platforms" in decisions[0].reason


# --- the exactness views are the same on every platform ----------------------------------
# XLA:CPU rewrites the bits of these floats in select, pad, concatenate and broadcast
# (tests/test_lax_exact.py); the lax path moves them as unsigned integers instead. A GPU or
# TPU program must carry the same views: these compare each platform's lowering with the
# CPU lax lowering, and check that no value-moving op of the program sees the float type.
_VIEWED = {"bfloat16": "bf16", "float8_e5m2": "f8E5M2"}
_MOVERS = re.compile(r"stablehlo\.(select|pad|concatenate|broadcast_in_dim)\b")


def _view_cases(dtype):
    rng = np.random.default_rng(6)
    v = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    c = rng.integers(0, 2, (6, 5)).astype(bool)
    src, idx = v(9, 5), np.array([0, 3, -1, 12, 4], np.int32)
    bsrc, bidx = v(3, 9, 5), rng.integers(-1, 10, (3, 4)).astype(np.int32)
    g = jax_ext.gather
    return {
        "where scalar and row": (lambda c, x, y: jax_ext.where(c, x, y[0, 0]) +
                                 jax_ext.where(c, y, x), (c, v(6, 5), v(1, 5))),
        "where3 rows": (jax_ext.where3, (c[:, 0], v(6, 5), v(6, 5))),
        "gather pad rows and columns": (
            lambda s, i, p: g(s, [0], 0, i, num_indices=4, pad_value=p, align_bytes=64),
            (src, idx, src[0, 0])),
        "vmap gather per-batch pad": (
            jax.vmap(lambda s, i, p: g(s, [0], 0, i, pad_value=p)), (bsrc, bidx, bsrc[:, 0, 0])),
    }


@pytest.mark.parametrize("dtype", list(_VIEWED))
@pytest.mark.parametrize("platform", ["cuda", "rocm", "tpu"])
def test_exactness_views_on_every_platform(platform, dtype):
    mlir_type = _VIEWED[dtype]
    for name, (f, args) in _view_cases(np.dtype(dtype)).items():
        with jax_ext.implementation("lax"):
            cpu = jax.jit(f).trace(*args).lower(lowering_platforms=("cpu",)).as_text()
        other = _lowered(f, args, (platform,))
        assert other == cpu, f"{name}: the {platform} program differs from CPU's lax path"
        moving = [ln.strip() for ln in other.splitlines() if _MOVERS.search(ln)]
        assert moving, name
        bare = [ln for ln in moving if f"x{mlir_type}>" in ln or f"<{mlir_type}>" in ln]
        assert not bare, f"{name}: {dtype} values moved as floats on {platform}: {bare[:3]}"
        assert f"tensor<{mlir_type}>" in other or f"x{mlir_type}>" in other  # the operands
        assert "stablehlo.bitcast_convert" in other, name
