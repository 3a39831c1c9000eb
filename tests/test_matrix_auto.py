"""One matrix for the three implementations: "native", "lax" and "auto" (the default, which
picks per call site), against independent numpy references, bit for bit.

* auto's two sides: for select, gather and scatter-add (gather's gradient) a small and a
  large standalone call; jax_ext.explain must report lax for the small one and native for
  the large one (the large size is searched for, not written down: the thresholds belong
  to auto's cost model), and both must give numpy's bits.
* every dtype, at both sizes, with NaN payloads, signalling NaNs and -0.0;
* inside fusions: integer producers and consumers bitcast around the op, padding columns
  (align_bytes 32/64/128), pad rows (num_indices, out-of-range indices), a NaN pad value,
  a vmapped gather with one pad value per batch element;
* transforms: jit everywhere, vmap, the vjp of select and gather;
* x64 on (the suite's default) and off (``jax.enable_x64(False)``).
"""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jax_ext
from references import (ALL_DTYPES, IMPLS, assert_bits_equal, np_select, random_values,
                        ref_gather, special_values)

BF16 = np.dtype(ml_dtypes.bfloat16)
LAST = 21  # gather row length: padded to a multiple of 32 bytes for every itemsize but 8
WIDE = {np.dtype(d) for d in (np.int64, np.uint64, np.float64, np.complex128)}


def setup_module(module):
    assert jax_ext.native_available(), "the compiled module must be installed (pip install .)"


def _values(rng, shape, dtype):
    """Random bits, half of them overwritten with -0.0, +-inf, NaN payloads, sNaNs."""
    v = random_values(rng, shape, dtype)
    sp = special_values(dtype, v.size)
    if sp is not None and v.size:
        v.reshape(-1)[::2] = sp[::2]
    return v


def _nan_payload(dtype):
    """A pad value with bits a float normalisation would change (a signalling NaN with a
    payload where the dtype has one), or random bits."""
    dtype = np.dtype(dtype)
    sp = special_values(dtype, 5)
    if sp is None or dtype.kind == "c":
        return _values(np.random.default_rng(1), (), dtype)
    return sp[4]


# --- cases: one standalone call of each op, sized in rows ------------------------------

def _select_case(rows, dtype, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, (rows, 64)).astype(bool)
    return c, _values(rng, (rows, 64), dtype), _values(rng, (rows, 64), dtype)


def _gather_case(rows, dtype, seed=0):
    """src (rows, LAST); rows indices with out-of-range ones, two pad rows at the end
    (num_indices), a NaN pad value, padding columns."""
    rng = np.random.default_rng(seed)
    src = _values(rng, (rows, LAST), dtype)
    idx = rng.integers(-2, rows + 2, rows).astype(np.int32)
    return src, idx, np.int32(max(rows - 2, 0)), _nan_payload(dtype)


def _gather(src, idx, num, pad):
    return jax_ext.gather(src, [0], 0, idx, num_indices=num, pad_value=pad)


def _gather_want(src, idx, num, pad):
    return ref_gather(src, [0], 0, idx, num_indices=num, pad_value=pad)


def _scatter_case(rows, seed=0):
    """The vjp of a gather for src (rows, 64): small integers, so every sum is exact
    in any order; duplicate and out-of-range indices."""
    rng = np.random.default_rng(seed)
    src = rng.integers(-4, 5, (rows, 64)).astype(np.float32)
    idx = rng.integers(-1, rows + 1, rows).astype(np.int32)
    ct = rng.integers(-4, 5, (rows, 64)).astype(np.float32)
    return src, idx, ct


def _scatter(src, idx, ct):
    _, vjp = jax.vjp(lambda s: jax_ext.gather(s, [0], 0, idx, align_bytes=None), src)
    return vjp(ct)[0]


def _scatter_want(src, idx, ct):
    out = np.zeros_like(src)
    ok = (idx >= 0) & (idx < src.shape[0])
    np.add.at(out, idx[ok], ct[ok])
    return out


OPS = {  # op: (case(rows, dtype), function, reference)
    "select": (_select_case, jax_ext.where, lambda c, x, y: np_select(c, x, y, x.shape)),
    "gather": (_gather_case, _gather, _gather_want),
    "scatter_add": (lambda rows, dtype: _scatter_case(rows), _scatter, _scatter_want),
}
SMALL_ROWS = 2  # a few hundred bytes: below any threshold worth having
# The search's end, at float32: 16 / 12 / 64 MiB.
MAX_ROWS = {"select": 1 << 16, "gather": 1 << 17, "scatter_add": 1 << 18}


def _impls(fn, *args):
    with jax_ext.implementation("auto"):
        return [d.impl for d in jax_ext.explain(fn, *args)]


@functools.cache
def native_rows(op, dtype=np.float32):
    """The fewest rows (powers of 4 from 16) at which auto runs op's case of dtype
    natively: whatever the cost model, the matrix then runs both of its sides."""
    case, fn, _ = OPS[op]
    rows, cap = 16, MAX_ROWS[op] * 4 // np.dtype(dtype).itemsize
    while rows <= cap:
        if _impls(jax.jit(fn), *case(rows, dtype))[-1:] == ["native"]:
            return rows
        rows *= 4
    raise AssertionError(f"auto never ran {op} on {np.dtype(dtype).name} natively up to "
                         f"{cap} rows")


def _fused_consumer(fn):
    """fn with its result read by a fusing integer consumer (bits ^ 0, bitcast back): the
    same bits, but a call site whose result XLA would fuse."""
    def g(*args):
        out = fn(*args)
        u = np.dtype(f"uint{8 * out.dtype.itemsize}")
        return lax.bitcast_convert_type(lax.bitcast_convert_type(out, u) ^ u.type(0), out.dtype)
    return g


@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x32"])
@pytest.mark.parametrize("op", list(OPS))
def test_auto_runs_both_sides(op, x64):
    """A small call whose result would fuse -> lax, a large standalone one -> native
    (jax_ext.explain), both exact. (A standalone gather can take the kernel at any size:
    the cost model measured its fixed cost below XLA's gather loop's.)"""
    case, fn, ref = OPS[op]
    big = native_rows(op)
    with jax.enable_x64(x64):
        for rows, want_impl in ((SMALL_ROWS, "lax"), (big, "native")):
            args = case(rows, np.float32)
            if want_impl == "lax" and op != "scatter_add":
                fn = _fused_consumer(OPS[op][1])
            else:
                fn = OPS[op][1]
            impls = _impls(jax.jit(fn), *args)
            assert impls[-1:] == [want_impl], (op, rows, impls)
            with jax_ext.implementation("auto"):
                got = jax.jit(fn)(*args)
            assert_bits_equal(got, ref(*args))


def _dtype_id(d):
    return np.dtype(d).name


def _both_sizes(dtype):
    """select and gather at a small and a large size, four standalone calls in one program
    (auto decides each call site on its own)."""
    sizes = [("select", SMALL_ROWS), ("select", native_rows("select", dtype)),
             ("gather", SMALL_ROWS), ("gather", native_rows("gather", dtype))]
    return [(op, OPS[op][0](rows, dtype, seed=k)) for k, (op, rows) in enumerate(sizes)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dtype_id)
def test_every_dtype_both_sizes_exact(dtype, impl):
    cases = _both_sizes(dtype)

    def f(*flat):
        outs, k = [], 0
        for op, args in cases:
            outs.append(OPS[op][1](*flat[k:k + len(args)]))
            k += len(args)
        return outs

    flat = [a for _, args in cases for a in args]
    if impl == "auto":  # the large call sites run the kernel, and some site runs lax
        impls = _impls(f, *flat)
        assert impls[1] == impls[3] == "native" and "lax" in impls, impls
    with jax_ext.implementation(impl):
        got = jax.jit(f)(*flat)
    for (op, args), g in zip(cases, got):
        assert_bits_equal(g, OPS[op][2](*args))


# --- inside fusions ---------------------------------------------------------------------

FUSION_DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
                 np.float16, np.float32, np.float64]


def _uint(dtype):
    return np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")


def _fused_program(dtype, neighbours):
    """neighbours "int": every op fed by an integer producer (bits ^ k, bitcast to dtype)
    and read by an integer consumer (bitcast back, ^ k); with k = 0 passed at run time the
    program is the identity on bits, and XLA fuses each op with both sides. "none": the
    same program taking and returning dtype values (the ops fuse with each other and with
    the bitcasts the lax path itself adds)."""
    U = _uint(dtype)
    if neighbours == "int":
        to = lambda u, k: lax.bitcast_convert_type(u ^ k, dtype)  # noqa: E731
        back = lambda v, k: lax.bitcast_convert_type(v, U) ^ k  # noqa: E731
    else:
        to = back = lambda v, k: v  # noqa: E731

    def f(k, cu, xu, yu, su, off, idx, num, padu, bsu, bidx, bpadu):
        c = (cu & 1) == 1
        out = [back(jax_ext.where(c, to(xu, k), to(yu, k)), k)]
        for align in (32, 64, 128):  # padding columns: 21 elements -> 32 / 64 / 128 bytes
            o = 1 if align == 32 else off  # a static and a traced offset
            out.append(back(jax_ext.gather(to(su, k), [o], 0, idx, num_indices=num,
                                           pad_value=to(padu, k), align_bytes=align), k))
        vg = jax.vmap(lambda s, i, p: jax_ext.gather(s, [0], 0, i, num_indices=5, pad_value=p,
                                                     align_bytes=64))
        out.append(back(vg(to(bsu, k), bidx, to(bpadu, k)), k))
        return out
    return f


def _fused_args(dtype):
    U = _uint(dtype)
    rng = np.random.default_rng(3)
    bits = lambda shape: _values(rng, shape, dtype).view(U)  # noqa: E731
    pads = np.stack([_nan_payload(dtype)] * 3).view(U)
    pads[1] ^= 1  # per batch element: different payloads
    return dict(k=U.type(0), cu=rng.integers(0, 256, (24, 40)).astype(np.uint8),
                xu=bits((24, 40)), yu=bits((1, 40)), su=bits((30, LAST)),
                off=np.int32(1), idx=rng.integers(-3, 33, 12).astype(np.int32), num=np.int32(9),
                padu=np.asarray(_nan_payload(dtype)).view(U), bsu=bits((3, 10, LAST)),
                bidx=rng.integers(-1, 12, (3, 8)).astype(np.int32), bpadu=pads)


def _fused_want(dtype, a):
    U = _uint(dtype)
    v = lambda u: np.asarray(u).view(dtype)  # noqa: E731
    c = (a["cu"] & 1) == 1
    want = [np_select(c, v(a["xu"]), v(a["yu"]), c.shape).view(U)]
    for align in (32, 64, 128):
        want.append(ref_gather(v(a["su"]), [1], 0, a["idx"], num_indices=9,
                               pad_value=v(a["padu"]), align_bytes=align).view(U))
    want.append(np.stack([ref_gather(v(a["bsu"][b]), [0], 0, a["bidx"][b], num_indices=5,
                                     pad_value=v(a["bpadu"][b]), align_bytes=64)
                          for b in range(3)]).view(U))
    return want


# x64 off: no 64-bit arrays exist, so float64 runs with x64 on only.
FUSION_CASES = [pytest.param(d, x64, id=f"{_dtype_id(d)}-{'x64' if x64 else 'x32'}")
                for d in FUSION_DTYPES for x64 in (True, False)
                if x64 or np.dtype(d) not in WIDE]


@pytest.mark.parametrize("neighbours", ["int", "none"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype, x64", FUSION_CASES)
def test_fused_neighbours_keep_bits(dtype, x64, impl, neighbours):
    f, args = _fused_program(dtype, neighbours), _fused_args(dtype)
    if neighbours == "none":  # values arrive as dtype arrays
        args = {k: (np.asarray(v).view(dtype) if k in ("xu", "yu", "su", "padu", "bsu", "bpadu")
                    else v) for k, v in args.items()}
    with jax.enable_x64(x64):
        if impl == "auto" and neighbours == "int":  # fused call sites: auto takes lax
            impls = _impls(f, *args.values())
            assert impls and set(impls) == {"lax"}, impls
        with jax_ext.implementation(impl):
            got = jax.jit(f)(*args.values())
    names = ["where", "gather[align 32]", "gather[align 64]", "gather[align 128]",
             "vmap gather[per-batch pad]"]
    bad = []
    U = _uint(dtype)
    for name, g, w in zip(names, got, _fused_want(dtype, _fused_args(dtype))):
        try:
            assert_bits_equal(np.asarray(g).view(U), w)
        except AssertionError as e:
            bad.append(f"{name}: {e}")
    assert not bad, "\n".join(bad)


def test_issue_snippet_bf16_payload_through_padded_gather():
    """bfloat16 0x7fc5 gathered under jit into rows padded 8 -> 16 (the issue's snippet)."""
    src = np.full((2, 8), 0x7FC5, np.uint16).view(BF16)
    idx = np.array([0, 1], np.int32)
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            got = jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i))(src, idx)
        got = np.asarray(got).view(np.uint16)
        assert (got[:, :8] == 0x7FC5).all() and (got[:, 8:] == 0).all(), (impl, got[0])


# --- transforms: vmap and vjp -----------------------------------------------------------

@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=_dtype_id)
def test_vmap_select_and_gather_exact(dtype, impl, size):
    """vmap with mixed in_axes, against a loop of numpy references."""
    rng = np.random.default_rng(7)
    for op in ("select", "gather"):
        rows = SMALL_ROWS if size == "small" else native_rows(op, dtype)
        if op == "select":
            c = rng.integers(0, 2, (rows, 64)).astype(bool)
            x = _values(rng, (rows, 3, 64), dtype)  # batched along axis 1
            y = _values(rng, (rows, 64), dtype)     # unbatched
            f = jax.vmap(jax_ext.where, in_axes=(None, 1, None))
            want = np.stack([np_select(c, x[:, b], y, c.shape) for b in range(3)])
            args = (c, x, y)
        else:
            s = _values(rng, (3, rows, LAST), dtype)
            i = rng.integers(-1, rows + 1, (rows, 3)).astype(np.int32)  # batched along 1
            pad = np.stack([_nan_payload(dtype)] * 3)
            f = jax.vmap(lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p),
                         in_axes=(0, 1, 0))
            want = np.stack([ref_gather(s[b], [0], 0, i[:, b], pad_value=pad[b])
                             for b in range(3)])
            args = (s, i, pad)
        with jax_ext.implementation(impl):
            got = jax.jit(f)(*args)
        assert_bits_equal(got, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_vjp_select_and_gather_exact(impl):
    """The vjp of select moves the cotangent's bits (NaN payloads, -0.0 included); the vjp
    of gather sums small integers (exact in any order), for src and pad_value."""
    rng = np.random.default_rng(9)
    for rows in (SMALL_ROWS, native_rows("select")):
        c = rng.integers(0, 2, (rows, 64)).astype(bool)
        x, y = _values(rng, (rows, 64), np.float32), _values(rng, (rows, 64), np.float32)
        ct = _values(rng, (rows, 64), np.float32)
        f = lambda x, y, ct: jax.vjp(lambda x, y: jax_ext.where(c, x, y), x, y)[1](ct)  # noqa
        with jax_ext.implementation(impl):
            gx, gy = jax.jit(f)(x, y, ct)
        zero = np.zeros_like(ct)
        assert_bits_equal(gx, np_select(c, ct, zero, ct.shape))
        assert_bits_equal(gy, np_select(c, zero, ct, ct.shape))
    for rows in (SMALL_ROWS, native_rows("gather")):
        src = rng.integers(-4, 5, (rows, LAST)).astype(np.float32)
        idx = rng.integers(-1, rows + 1, rows).astype(np.int32)
        num = max(rows - 1, 0)
        ct = rng.integers(-4, 5, (rows, 24)).astype(np.float32)

        def g(s, p, ct):
            return jax.vjp(lambda s, p: jax_ext.gather(s, [0], 0, idx, num_indices=num,
                                                       pad_value=p), s, p)[1](ct)
        with jax_ext.implementation(impl):
            gs, gp = jax.jit(g)(src, np.float32(0), ct)
        ok = (idx >= 0) & (idx < rows) & (np.arange(rows) < num)
        want_s = np.zeros_like(src)
        np.add.at(want_s, idx[ok], ct[ok, :LAST])
        want_p = ct[~ok].sum() + ct[ok, LAST:].sum()
        assert_bits_equal(gs, want_s)
        assert_bits_equal(gp, np.float32(want_p))


def test_grad_of_vmapped_gather_exact():
    """grad(sum(vmap(gather)**2)) -- the issue's sharded program, here on one device --
    on every implementation, against numpy."""
    rng = np.random.default_rng(4)
    s = rng.integers(-3, 4, (4, 16, 8)).astype(np.float32)
    i = rng.integers(0, 16, (4, 6)).astype(np.int32)

    def loss(s, i):
        g = jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))(s, i)
        return jnp.sum(g ** 2)
    want = np.zeros_like(s)
    for b in range(4):
        np.add.at(want[b], i[b], 2 * s[b][i[b]])
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            got = jax.jit(jax.grad(loss))(s, i)
        assert_bits_equal(got, want)
