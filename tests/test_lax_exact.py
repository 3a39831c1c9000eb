"""The lax path keeps the kernels' guarantees: bit-exact inside the fusions users write,
batch dims kept as lax batching dims, and sharded programs that lower and stay exact.

Exactness is checked against numpy (plain gathers and selects) and against the native
path running the same program (fused neighbourhoods, where the user's own ops decide the
bits and only the gather/select must not). The sharding checks run in a child process
started with 4 forced host devices (this file, run as a script)."""
import json
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_ext
from jax_ext import _compat_sharding

# bfloat16 (moved as bytes), the 8-bit floats (as uint8), float16 and float32 (as is).
DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e4m3, np.float16, np.float32]
# NaN payloads, signalling NaNs, -0.0, denormals, infinities, per width.
PATTERNS = {1: [0x7d, 0x7e, 0xfd, 0x80, 0x01, 0x81, 0x7c, 0x3c],
            2: [0x7fc5, 0x7f90, 0xffe5, 0x8000, 0x0001, 0x8001, 0x7f81, 0x7c01],
            4: [0x7fc00005, 0x7f800011, 0xffc00001, 0x80000000, 0x00000001, 0x7f800000,
                0xff800001, 0x3f800000]}


def _bits(x):
    x = np.ascontiguousarray(np.asarray(x))
    return x.view(f"uint{8 * x.dtype.itemsize}")


def _hard(dt, shape, seed):
    """Values of dtype `dt` drawn from the patterns XLA:CPU rewrites."""
    it = np.dtype(dt).itemsize
    raw = np.random.default_rng(seed).choice(np.array(PATTERNS[it], f"uint{8 * it}"), shape)
    return raw.view(dt)


def _ref_gather(src, off0, index, *, num=None, pad, align_bytes=32):
    """numpy: dim 0, offset off0, pad rows (out of range, past num) and pad columns."""
    n, last = len(index), src.shape[-1]
    it = src.dtype.itemsize
    L = last if align_bytes is None else -(-last * it // align_bytes) * align_bytes // it
    out = np.empty((n,) + src.shape[1:-1] + (L,), src.dtype)
    out[...] = pad
    for i, r in enumerate(index):
        r = off0 + int(r)
        if (num is None or i < num) and 0 <= r < src.shape[0]:
            out[i, ..., :last] = src[r]
    return out


def _with(impl, fn, *args):
    """fn's result under `impl`; "native" runs on the CPU device, where the kernels are, so
    that on a GPU (the GPU check) the device's lax path is compared with the CPU kernels."""
    if impl == "native":
        args = jax.device_put(args, jax.devices("cpu")[0])
    with jax_ext.implementation(impl):
        return np.asarray(jax.jit(fn)(*args))


# Pad rows, padding columns of every width, a NaN pad_value, num_indices, offsets.
GATHERS = {
    "align32": dict(align_bytes=32),
    "align64_num": dict(align_bytes=64, num=3),
    "align128_off": dict(align_bytes=128, off0=1),
    "none_oob": dict(align_bytes=None, off0=3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GATHERS))
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_lax_gather_exact(dt, case):
    kw = dict(GATHERS[case])
    off0, num, ab = kw.pop("off0", 0), kw.pop("num", None), kw.pop("align_bytes")
    src, pad = _hard(dt, (6, 2, 7), 0), _hard(dt, (), 1)
    idx = np.array([0, 5, 2, 7, -1, 3], np.int32)
    got = _with("lax", lambda s, i, p: jax_ext.gather(s, [off0], 0, i, num_indices=num,
                                                        pad_value=p, align_bytes=ab),
                src, idx, pad)
    want = _ref_gather(src, off0, idx, num=num, pad=pad, align_bytes=ab)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", DTYPES[:3], ids=lambda d: np.dtype(d).name)
def test_lax_vmap_batched_pad_exact(dt):
    """A pad value per batch element: the pad columns are one broadcast block per batch
    element, concatenated (a fused concatenate of a same-width view lost bf16 bits)."""
    src, pad = _hard(dt, (2, 6, 7), 9), _hard(dt, (2,), 10)
    idx = np.array([[0, 5, 2, 7, -1], [1, 1, 9, 4, 0]], np.int32)
    got = _with("lax", jax.vmap(lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p,
                                                             num_indices=4)), src, idx, pad)
    for b in range(2):
        want = _ref_gather(src[b], 0, idx[b], num=4, pad=pad[b])
        np.testing.assert_array_equal(_bits(got[b]), _bits(want))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 16), (300, 3)])
def test_lax_gather_exact_constant_pad_no_columns(shape):
    """Pad rows of a constant NaN pad_value and no padding column: the gather and the
    select fused in one loop lost bf16 bits through a same-width view."""
    src = _hard(ml_dtypes.bfloat16, shape, 11)
    pad = np.array(0x7f91, np.uint16).view(ml_dtypes.bfloat16)
    idx = np.random.default_rng(12).integers(-5, shape[0] + 5, 40).astype(np.int32)
    got = _with("lax", lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=pad,
                                                   align_bytes=None), src, idx)
    np.testing.assert_array_equal(_bits(got), _bits(_ref_gather(src, 0, idx, pad=pad,
                                                                align_bytes=None)))


@pytest.mark.gpu
def test_issue_snippet_bf16_payload():
    src = np.full((2, 8), 0x7fc5, np.uint16).view(ml_dtypes.bfloat16)
    for impl in ("lax", "auto"):
        out = _with(impl, lambda s, i: jax_ext.gather(s, [0], 0, i), src,
                    np.array([0, 1], np.int32))
        assert (_bits(out)[:, :8] == 0x7fc5).all() and (_bits(out)[:, 8:] == 0).all(), impl


# Fused neighbourhoods: the user's ops fuse with ours on the lax path; the native path
# runs them on the kernel's exact result, so both must give the same bits.
FUSED = {
    "src*1": lambda s, i, p: jax_ext.gather(s * 1, [0], 0, i, pad_value=p),
    "+0": lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p) + jnp.zeros((), s.dtype),
    "into_where": lambda s, i, p: jax_ext.where(
        (jnp.arange(16) % 3 == 0)[:16], jax_ext.gather(s, [0], 0, i, pad_value=p,
                                                       align_bytes=None)[..., :1], p),
    "into_concat": lambda s, i, p: jnp.concatenate(
        [jax_ext.gather(s, [0], 0, i, pad_value=p), jax_ext.gather(s, [0], 0, i[::-1])], -1),
}


@pytest.mark.gpu
@pytest.mark.skipif(not jax_ext.native_available(), reason="compares with the native path")
@pytest.mark.parametrize("case", sorted(FUSED))
@pytest.mark.parametrize("dt", [ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, np.float16],
                         ids=lambda d: np.dtype(d).name)
def test_lax_gather_exact_inside_fusions(dt, case):
    src, pad = _hard(dt, (6, 2, 7), 2), _hard(dt, (), 3)
    idx = np.array([0, 5, 2, 7, -1, 3], np.int32)
    f = FUSED[case]
    np.testing.assert_array_equal(_bits(_with("lax", f, src, idx, pad)),
                                  _bits(_with("native", f, src, idx, pad)))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn],
                         ids=lambda d: np.dtype(d).name)
def test_lax_select_exact_inside_fusions(dt):
    c = np.random.default_rng(4).integers(0, 2, (5, 8)).astype(bool)
    x, y = _hard(dt, (5, 8), 5), _hard(dt, (1, 8), 6)
    s = _hard(dt, (), 7)
    progs = {  # bit-moving neighbours; the reference is numpy where XLA's ops are exact
        "where": (lambda c, x, y: jax_ext.where(c, x, y), np.where(c, x, y)),
        "scalar": (lambda c, x, y: jax_ext.where(c, x, s), np.where(c, x, s)),
        # XLA's own concatenate and pad are not exact for these dtypes: compared natively.
        "concat": (lambda c, x, y: jnp.concatenate([jax_ext.where(c, x, y), x], 1), None),
        "pad": (lambda c, x, y: jnp.pad(jax_ext.select(c, x, y), ((0, 0), (0, 3))), None),
        "where3_rows": (lambda c, x, y: jax_ext.where3(c[:, 0], x, jnp.broadcast_to(y, x.shape)),
                        np.where(c[:, :1], x, y)),
        "slices": (lambda c, x, y: jax_ext.where(c[:, ::2], x[::-1, 1::2], y[:, ::2]),
                   np.where(c[:, ::2], x[::-1, 1::2], y[:, ::2])),
        "transposed": (lambda c, x, y: jax_ext.where(c.T, x.T, s), np.where(c.T, x.T, s)),
        "chain": (lambda c, x, y: jax_ext.where(c, jax_ext.where(~c, y, x), s)[::-1],
                  np.where(c, np.where(~c, y, x), s)[::-1]),
    }
    for name, (f, want) in progs.items():
        got = _with("lax", f, c, x, y)
        if want is None:
            if not jax_ext.native_available():
                continue
            want = _with("native", f, c, x, y)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)


def test_lax_vmap_keeps_batching_dims():
    """vmapped gather and its gradient (scatter-add) lower to one lax gather/scatter with
    batching dims, as vmap of jnp.take does: the batch is not folded into the rows."""
    src = np.ones((3, 10, 4), np.float32)
    idx = np.zeros((3, 5), np.int32)

    def loss(s, i):
        return jnp.sum(jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i))(s, i) ** 2)
    with jax_ext.implementation("lax"):
        text = jax.jit(jax.grad(loss)).lower(src, idx).as_text()
    assert re.search(r"operand_batching_dims = \[0\]", text), text
    assert re.search(r"input_batching_dims = \[0\]", text), text
    # A src shared by the batch (in_axes None) is read without one, nothing broadcast.
    with jax_ext.implementation("lax"):
        text = jax.jit(jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i), (None, 0))
                       ).lower(src[0], idx).as_text()
    assert "operand_batching_dims" not in text and "stablehlo.gather" in text


# The index operand of every XLA gather and scatter in a lowered program.
_INDEX_TYPE = re.compile(r'"stablehlo\.(gather|scatter)".*?(?:\)|\}>)\s*:\s*\(tensor<[^>]*>,'
                         r'\s*tensor<([^>]*)>', re.S)


def _index_types(f, *args):
    return [m.group(2).rsplit("x", 1)[-1]
            for m in _INDEX_TYPE.finditer(jax.jit(f).lower(*args).as_text())]


@pytest.mark.parametrize("impl", ["native", "lax", "auto"])
def test_row_ids_reach_xla_as_int32(impl):
    """With x64 on (as in this suite), the row ids XLA gathers and scatters by are int32
    whenever the flat row count fits, as jnp's indices are: XLA's SPMD partitioner aborts
    the process on a scatter whose int64 indices are sharded unevenly. (The native path
    hands XLA no gather or scatter: nothing to check there but that.)"""
    assert jax.config.jax_enable_x64
    src = np.ones((5, 7, 6), np.float32)
    idx = np.array([1, 3, 9, -2], np.int64)
    bidx = np.zeros((5, 3), np.uint64)

    def loss(s, i):
        return jnp.sum(jax_ext.gather(s, [2, 1], 1, i, pad_value=1.0) ** 2)

    def vloss(s, i):
        return jnp.sum(jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i))(s, i) ** 2)

    def jvp(s, i):  # a gather of the tangent too
        return jax.jvp(lambda s: jax_ext.gather(s, [0], 0, i), (s,), (s,))
    found = []
    with jax_ext.implementation(impl):
        for f, a in ((lambda s, i: jax_ext.gather(s, [2, 1], 1, i), (src, idx)),
                     (jax.grad(loss), (src, idx)), (jax.grad(vloss), (src, bidx)),
                     (jvp, (src, idx))):
            found += _index_types(f, *a)
    assert set(found) <= {"i32"}, found
    assert found or impl != "lax"


def test_row_ids_stay_wide_when_the_row_count_does_not_fit():
    """2**31 rows: the ids keep the offsets' 64-bit carrier (exact), as jnp's would."""
    big = jax.ShapeDtypeStruct((2 ** 16, 2 ** 15, 1), np.float32)
    fits = jax.ShapeDtypeStruct((2 ** 16, 2 ** 15 - 1, 1), np.float32)
    idx = jax.ShapeDtypeStruct((4,), np.int32)

    def loss(s, i):
        return jnp.sum(jax_ext.gather(s, [1, 0], 1, i, align_bytes=None))
    with jax_ext.implementation("lax"):
        assert set(_index_types(jax.grad(loss), big, idx)) == {"i64"}
        assert set(_index_types(jax.grad(loss), fits, idx)) == {"i32"}


@pytest.mark.gpu
def test_lax_vmap_gather_and_grad_match_jnp():
    rng = np.random.default_rng(8)
    src = rng.standard_normal((3, 10, 4)).astype(np.float32)
    idx = rng.integers(-2, 12, (3, 6)).astype(np.int32)
    pad = np.array([0.5, -1.0, 2.0], np.float32)

    def ours(s, i, p):
        return jax.vmap(lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p,
                                                       align_bytes=None))(s, i, p)

    def twin(s, i, p):
        ok = (i >= 0) & (i < s.shape[1])
        g = jax.vmap(lambda s, i: jnp.take(s, i, axis=0, mode="clip"))(s, i)
        return jnp.where(ok[..., None], g, p[:, None, None])
    with jax_ext.implementation("lax"):
        got = jax.jit(ours)(src, idx, pad)
        gs, gp = jax.jit(jax.grad(lambda s, p: jnp.sum(ours(s, idx, p) ** 3), (0, 1)))(src, pad)
    ws, wp = jax.jit(jax.grad(lambda s, p: jnp.sum(twin(s, idx, p) ** 3), (0, 1)))(src, pad)
    np.testing.assert_array_equal(got, twin(src, idx, pad))
    np.testing.assert_allclose(gs, ws, rtol=1e-6)
    np.testing.assert_allclose(gp, wp, rtol=1e-6)


# --- sharding, in a child with 4 host devices --------------------------------------

COLL = re.compile(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)\b")


def _child_checks(gspmd=False):
    """Runs in the child: {check name: result}, every check under lax and auto, on a mesh
    with auto axes and one with explicit axes. `gspmd`: XLA's GSPMD partitioner, where the
    lax ops are partitioned by XLA alone (as on other platforms): only the batch checks,
    which the batching dims must pass by themselves."""
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    out = {}

    def colls(f, *a):
        return sorted(set(COLL.findall(jax.jit(f).lower(*a).compile().as_text())))

    def record(name, fn):
        try:
            out[name] = {"ok": True, **fn()}
        except Exception as e:  # reported, not raised: the parent names the check
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}

    rng = np.random.default_rng(0)
    src_np = rng.standard_normal((8, 64, 16)).astype(np.float32)
    idx_np = rng.integers(0, 64, (8, 32)).astype(np.int32)
    raw = np.zeros((16, 8), np.uint32)
    raw[::2], raw[1::2] = 0x80000000, 0x7f800001  # -0.0 and a signalling NaN
    rows_idx = np.array([0, 1, 5, 14, 3, 20], np.int32)

    def vg(s, i):
        return jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))(s, i)

    def loss(s, i):
        return jnp.sum(vg(s, i) ** 2)

    def twin_loss(s, i):
        return jnp.sum(jax.vmap(lambda s, i: jnp.take(s, i, axis=0))(s, i) ** 2)

    def cgather(s, i):
        return jax_ext.gather(s, [0], 0, i)

    for kind in ("auto", "explicit"):
        if kind == "auto":
            mesh = Mesh(np.array(jax.devices()), ("d",))
        else:
            mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
        put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))  # noqa: E731
        src, idx = put(src_np, "d", None, None), put(idx_np, "d", None)
        cs = put(rng.integers(0, 2, (8, 16)).astype(bool), "d", None)
        xs = put(rng.standard_normal((8, 16)).astype(np.float32), "d", None)
        rs = put(raw.view(np.float32), "d", None)
        want_grad = np.asarray(jax.jit(jax.grad(twin_loss))(src, idx))
        want_rows = np.zeros((6, 8), np.uint32)
        want_rows[:5] = raw[rows_idx[:5]]
        for impl in ("lax",) if gspmd else ("lax", "auto"):
            ctx = jax.set_mesh(mesh) if kind == "explicit" else mesh
            with ctx, jax_ext.implementation(impl):
                tag = f"[{kind},{impl}{',gspmd' if gspmd else ''}]"
                record("vmap_gather_batch_sharded" + tag, lambda: {
                    "collectives": colls(vg, src, idx),
                    "equal": bool(np.array_equal(
                        np.asarray(jax.jit(vg)(src, idx)),
                        np.take_along_axis(src_np, idx_np[..., None], 1)))})
                record("vmap_gather_grad_batch_sharded" + tag, lambda: {
                    "collectives": colls(jax.grad(loss), src, idx),
                    "equal": bool(np.array_equal(
                        np.asarray(jax.jit(jax.grad(loss))(src, idx)), want_grad))})
                if gspmd:
                    continue
                record("where_scalar" + tag, lambda: {
                    "collectives": colls(lambda c, x: jax_ext.where(c, x, 0.0), cs, xs),
                    "equal": bool(np.array_equal(
                        np.asarray(jax.jit(lambda c, x: jax_ext.where(c, x, 0.0))(cs, xs)),
                        np.where(np.asarray(cs), np.asarray(xs), np.float32(0))))})
                record("gather_src_rows_sharded" + tag, lambda: {
                    "collectives": colls(cgather, rs, rows_idx),
                    "equal": bool(np.array_equal(
                        np.asarray(jax.jit(cgather)(rs, rows_idx)).view(np.uint32),
                        want_rows))})
    return out


@pytest.fixture(scope="module")
def sharded():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=4").strip()
    env.pop("JAX_EXT_IMPL", None)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "child"], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"child failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


CHECKS = [f"{c}[{k},{i}]" for c in ("vmap_gather_batch_sharded", "vmap_gather_grad_batch_sharded",
                                    "where_scalar", "gather_src_rows_sharded")
          for k in ("auto", "explicit") for i in ("lax", "auto")] + [
    f"{c}[{k},lax,gspmd]" for c in ("vmap_gather_batch_sharded",
                                    "vmap_gather_grad_batch_sharded")
    for k in ("auto", "explicit") if _compat_sharding.GSPMD_SELECTABLE]
# The GSPMD checks run only where jax can still select that partitioner: jax 0.12 made
# jax_use_shardy_partitioner a no-op (Shardy is the only partitioner), so there they would
# repeat the Shardy checks above.


@pytest.mark.parametrize("name", CHECKS)
def test_lax_sharded(sharded, name):
    rec = sharded.get(name)
    assert rec is not None, sorted(sharded)
    assert rec["ok"], rec["error"]
    assert rec["equal"], rec  # exact: -0.0 and the signalling NaN kept for row shards
    if name.startswith("gather_src_rows_sharded"):
        # Kept sharded along the rows, as the kernels have it: one all-reduce of integers
        # (the index, and so the result, replicated), exact as "equal" shows; never an
        # all-gather of src.
        assert rec["collectives"] == ["all-reduce"], rec
    else:
        assert rec["collectives"] == [], rec


if __name__ == "__main__" and sys.argv[1:] == ["child"]:
    jax.config.update("jax_enable_x64", True)
    res = _child_checks()
    if _compat_sharding.GSPMD_SELECTABLE:  # see CHECKS
        jax.config.update("jax_use_shardy_partitioner", False)
        res.update(_child_checks(gspmd=True))
    print(json.dumps(res))
