"""gather (Ascend asctile.gather): native and lax against an independent numpy loop, bit
for bit; errors; gradients (scatter-add); vmap; lowering."""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.test_util import check_grads

import jax_ext
from references import (ALL_DTYPES, GRAD_DTYPES, IMPL_PAIRS, IMPLS, INDEX_DTYPES,
                        SUB_BYTE_DTYPES, assert_bits_equal, bit_width, hlo, random_values,
                        ref_gather, ref_rows, row_len)

def setup_module(module):
    assert jax_ext.native_available(), "the compiled module must be installed (pip install .)"


# --- helpers -------------------------------------------------------------------------

def both(fn, *args, impls=IMPLS, **kw):
    """fn under every implementation (or `impls`); asserts they agree bit for bit, returns
    the result."""
    outs = []
    for impl in impls:
        with jax_ext.implementation(impl):
            outs.append(np.asarray(fn(*args, **kw)))
    for o in outs[1:]:
        assert_bits_equal(outs[0], o)
    return outs[0]


def check(src, offsets, dim, index, impls=IMPLS, **kw):
    want = ref_gather(src, offsets, dim, index, **kw)
    got = both(jax_ext.gather, src, offsets, dim, index, impls=impls, **kw)
    assert_bits_equal(got, want)
    return got




# --- the seed ---------------------------------------------------------------------------

def test_seed_example_every_other_row():
    src = np.arange(256, dtype=np.int32).reshape(32, 8)
    index = np.arange(0, 32, 2, dtype=np.int32)
    got = check(src, [0], 0, index)
    assert got.shape == (16, 8)  # 8 int32 = 32 bytes: no padding
    np.testing.assert_array_equal(got, src[::2])
    np.testing.assert_array_equal(got[-1], np.arange(240, 248))


def test_seed_full_rows_by_outermost_dim():
    rng = np.random.default_rng(0)
    src = rng.standard_normal((1024, 128)).astype(np.float32)
    index = rng.integers(0, 1024, 256).astype(np.int32)
    got = check(src, [0], 0, index)
    np.testing.assert_array_equal(got, src[index])


# --- geometry ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((7, 5), 0), ((4, 6, 3), 0), ((4, 6, 3), 1),
                                       ((3, 4, 5, 6), 0), ((3, 4, 5, 6), 1), ((3, 4, 5, 6), 2)])
def test_every_dim_rank_2_to_4(shape, dim):
    rng = np.random.default_rng(dim + len(shape))
    src = rng.standard_normal(shape).astype(np.float32)
    R = shape[dim]
    for offs in ([0] * (dim + 1), [s - 1 for s in shape[:dim]] + [1],
                 [1] * dim + [-2], [shape[0]] + [0] * dim, [-1] + [0] * dim):
        offs = offs[:dim + 1]
        index = np.array([0, R - 1, -1, R, 2, 1, -R, 3 * R], np.int32)
        check(src, offs, dim, index)
        check(src, offs, dim, index, check_bounds=False)


@pytest.mark.parametrize("idt", INDEX_DTYPES)
def test_every_index_dtype(idt):
    info = np.iinfo(idt)
    src = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    vals = [0, 1, 5, 6, 7, info.max, info.max - 1, info.min]
    if info.min < 0:
        vals += [-1, -6, info.min + 1]
    index = np.array(vals, idt)
    for off in (0, 1, -1, 3, max(-int(info.max) + 2, -2 ** 63), 2 ** 63 - 1, -2 ** 63):
        check(src, [off], 0, index)
        check(src, [off], 0, index, check_bounds=False)


def test_uint64_index_exact_with_negative_offset():
    # offsets[dim] + index[i] is exact: -2**63 + (2**63 + 2) == 2, in range.
    src = np.arange(10, dtype=np.int64).reshape(5, 2)
    index = np.array([2 ** 63 + 2, 2 ** 64 - 1, 2 ** 63 - 1, 3], np.uint64)
    got = check(src, [-2 ** 63], 0, index)
    np.testing.assert_array_equal(got[:, :2], [[4, 5], [0, 0], [0, 0], [0, 0]])
    got = check(src, [-(2 ** 64 - 1) + 2 ** 63 + 1 - 1], 0, index)  # 1 - 2**63
    check(src, [-5], 0, index, check_bounds=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_offsets_near_int64_limits_traced(impl):
    src = np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2)
    index = np.array([0, 1, -1, 2 ** 62, -2 ** 62, 2 ** 63 - 1, -2 ** 63], np.int64)
    f = jax.jit(lambda s, a, b, i: jax_ext.gather(s, [a, b], 1, i))
    with jax_ext.implementation(impl):
        for a, b in [(0, 0), (2, 3), (2 ** 63 - 1, 0), (-2 ** 63, 0), (1, 2 ** 63 - 1),
                     (1, -2 ** 63), (1, 2 ** 62), (-1, 1)]:
            got = f(src, np.int64(a), np.int64(b), index)
            assert_bits_equal(got, ref_gather(src, [a, b], 1, index))
            g2 = jax_ext.gather(src, [a, b], 1, index, check_bounds=False)
            assert_bits_equal(g2, ref_gather(src, [a, b], 1, index, check_bounds=False))
    assert f._cache_size() == 1


def test_traced_uint64_offset_saturates():
    src = np.arange(8, dtype=np.int32).reshape(4, 2)
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            got = jax_ext.gather(src, [jnp.uint64(2 ** 64 - 1)], 0, jnp.array([0, -1], jnp.int8))
            np.testing.assert_array_equal(np.asarray(got), np.zeros((2, 8), np.int32))


@pytest.mark.parametrize("num", [None, 0, 3, 8])
def test_num_indices_static(num):
    rng = np.random.default_rng(1)
    src = rng.standard_normal((6, 3, 5)).astype(np.float64)
    index = np.array([0, 5, 2, -1, 6, 1, 1, 3], np.int16)
    check(src, [2], 0, index, num_indices=num, pad_value=-7.5)
    check(src, [1, 0], 1, index, num_indices=num, check_bounds=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_num_indices_and_pad_traced_one_compilation(impl):
    rng = np.random.default_rng(2)
    src = rng.standard_normal((6, 5)).astype(np.float32)
    index = np.array([0, 5, 2, -1, 6, 1], np.int32)
    f = jax.jit(lambda s, k, p, o: jax_ext.gather(s, [o], 0, index, num_indices=k, pad_value=p))
    with jax_ext.implementation(impl):
        for k in [-3, 0, 2, 6, 100, np.iinfo(np.int64).max, np.iinfo(np.int64).min]:
            for p, o in [(0.5, 0), (np.nan, 1), (-np.inf, -1)]:
                got = f(src, np.int64(k), np.float32(p), np.int32(o))
                assert_bits_equal(got, ref_gather(src, [o], 0, index, num_indices=k,
                                            pad_value=np.float32(p)))
    assert f._cache_size() == 1
    with jax_ext.implementation(impl):  # a traced uint64 num_indices above n clamps to n
        got = jax_ext.gather(src, [0], 0, index, num_indices=jnp.uint64(2 ** 64 - 1))
        assert_bits_equal(got, ref_gather(src, [0], 0, index))


@pytest.mark.parametrize("pad", [None, 0, 2.5, float("nan"), -0.0, float("inf")])
def test_pad_values(pad):
    src = np.arange(12, dtype=np.float32).reshape(4, 3)
    index = np.array([0, 4, -1, 3], np.int64)
    got = check(src, [0], 0, index, pad_value=pad)
    assert got.shape == (4, 8)


def test_pad_nan_payload_bits_preserved():
    for dt, bits in [(np.float16, 0x7E01), (ml_dtypes.bfloat16, 0x7FC1), (np.float32, 0x7FC00123),
                     (np.float16, 0x7C01)]:
        pad = np.array(bits, {2: np.uint16, 4: np.uint32}[np.dtype(dt).itemsize]).view(dt)
        src = random_values(np.random.default_rng(3), (5, 3), dt)
        check(src, [0], 0, np.array([1, 9, 0], np.int32), pad_value=pad)


@pytest.mark.parametrize("align", [32, None, 64, 4, 128])
@pytest.mark.parametrize("last", [1, 3, 8, 16, 17])
def test_align_bytes(align, last):
    src = np.arange(5 * 2 * last, dtype=np.int32).reshape(5, 2, last)
    index = np.array([4, 0, 7], np.int8)
    got = check(src, [0], 0, index, align_bytes=align, pad_value=-1)
    assert got.shape[-1] == row_len(last, 4, align)
    assert (got.shape[-1] * 4) % (align or 4) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES + SUB_BYTE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_bit_exact(dtype):
    rng = np.random.default_rng(4)
    src = random_values(rng, (7, 3, 5), dtype)
    pad = random_values(rng, (), dtype)
    index = np.array([6, 0, -1, 3, 7, 3], np.int32)
    for align in (None, 32):
        check(src, [2, 1], 1, index, pad_value=pad, align_bytes=align, num_indices=4)
        got = check(src, [0], 0, index, pad_value=pad, align_bytes=align)
    itemsize = np.dtype(dtype).itemsize
    assert got.shape == (6, 3, row_len(5, itemsize, 32)) and got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("row_bytes", [32, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64,
                                   np.complex128], ids=lambda d: np.dtype(d).name)
def test_row_copy_sizes_bit_exact(row_bytes, dtype):
    """Rows of 32-512 bytes are copied by size-specialized loops (512 by 16-byte moves),
    1024 by the generic one: every element width, pads and NaN payloads, against the
    numpy loop."""
    rng = np.random.default_rng(row_bytes)
    last = row_bytes // np.dtype(dtype).itemsize
    src = random_values(rng, (9, last), dtype)
    index = np.array([8, 0, 9, -1, 4, 4, 2, 7, 1, 3], np.int32)
    got = check(src, [0], 0, index, pad_value=random_values(rng, (), dtype))
    assert got.shape == (10, last)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", SUB_BYTE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_sub_byte_every_code_through_the_fusions(dtype):
    """Every code of a packed dtype keeps its bits through the lax gather's fused ops (the
    gather, the select of pad rows, the padding columns), with each code as pad_value,
    eagerly and under jit, on every path; and under vmap, with a pad value and an index
    per example and with a table per example."""
    rng = np.random.default_rng(13)
    codes = 2 ** bit_width(dtype)
    src = random_values(rng, (9, 2, 5), dtype)  # 90 elements: every code
    index = np.array([8, 0, -1, 3, 9, 3, 5], np.int32)
    cases = [dict(num_indices=5), dict(align_bytes=None), dict(check_bounds=False, num_indices=6)]
    jitted = [jax.jit(functools.partial(
        lambda s, i, p, kw: jax_ext.gather(s, [0], 0, i, pad_value=p, **kw), kw=kw))
        for kw in cases]
    for code in range(codes):
        pad = np.array(code, np.uint8).view(dtype)
        for kw, f in zip(cases, jitted):
            want = check(src, [0], 0, index, pad_value=pad, **kw)  # eager, against numpy
            assert_bits_equal(both(f, src, index, pad), want)
    pads = random_values(rng, (codes,), dtype)
    idx = rng.integers(-2, 11, (codes, 7)).astype(np.int32)
    per_pad = jax.jit(jax.vmap(lambda i, p: jax_ext.gather(src, [1, 0], 1, i, pad_value=p)))
    got = both(per_pad, idx, pads)
    for b in range(codes):
        assert_bits_equal(got[b], ref_gather(src, [1, 0], 1, idx[b], pad_value=pads[b]))
    tables = random_values(rng, (3, 9, 2, 5), dtype)
    per_table = jax.jit(jax.vmap(lambda s: jax_ext.gather(s, [0], 0, index, pad_value=pads[1])))
    got = both(per_table, tables)
    for b in range(3):
        assert_bits_equal(got[b], ref_gather(tables[b], [0], 0, index, pad_value=pads[1]))


def test_what_jax_has_of_sub_byte_dtypes():
    """Every packed dtype jax names is routed to lax (_names.SUB_BYTE), and is gathered in
    the tests (SUB_BYTE_DTYPES) unless jax holds no arrays of it or gather refuses it:
    int1/uint1 (jax cannot move a numpy array of either onto a device), and the 6-bit floats
    (jax 0.11+ holds them, but XLA:CPU aborts on a constant of one, as in jnp.take): on
    every path, eagerly and under jit, gather raises a TypeError naming the dtype, and
    where gives numpy's bits (through lax)."""
    from jax_ext import _names
    packed = {n for n in dir(ml_dtypes) if hasattr(jnp, n) and isinstance(
        getattr(ml_dtypes, n), type) and np.dtype(getattr(ml_dtypes, n)).itemsize == 1
        and bit_width(getattr(ml_dtypes, n)) < 8}
    tested = {np.dtype(d).name for d in SUB_BYTE_DTYPES}
    assert packed <= _names.SUB_BYTE and tested <= packed
    assert packed - tested == {"int1", "uint1", "float6_e2m3fn", "float6_e3m2fn"}
    for name in sorted(packed - tested):
        dt = np.dtype(getattr(ml_dtypes, name))
        host = np.zeros((4, 3), np.uint8).view(dt)
        try:
            src = jnp.asarray(host)
        except Exception as e:  # jax has no arrays of it at this end
            assert name != "float6_e2m3fn" or jax.__version_info__ < (0, 11), e
            continue
        assert name in _names.NOT_GATHERED, name
        codes = np.arange(12, dtype=np.uint8).reshape(4, 3).view(dt)
        c = np.arange(12).reshape(4, 3) % 3 == 0
        for impl in IMPLS:
            with jax_ext.implementation(impl):
                for f in (jax_ext.gather, jax.jit(jax_ext.gather, static_argnums=2)):
                    with pytest.raises(TypeError, match=f"gather: src \\(4, 3\\) has dtype "
                                       f"{name}, which XLA cannot gather"):
                        f(src, [0], 0, np.array([1, 2]))
                for f in (jax_ext.where, jax.jit(jax_ext.where)):
                    assert_bits_equal(f(c, codes, codes[::-1]), np.where(
                        c, codes.view(np.uint8), codes[::-1].view(np.uint8)).view(dt))


def test_int4_goes_through_lax():
    src = jnp.arange(12, dtype=jnp.int8).reshape(4, 3).astype(jnp.int4) - 4
    got = both(jax_ext.gather, src, [0], 0, jnp.array([3, 0, 9]), align_bytes=None)
    np.testing.assert_array_equal(np.asarray(got, np.int8),
                                  [[5, 6, 7], [-4, -3, -2], [0, 0, 0]])


def test_zero_sizes():
    for shape, dim, index in [((0, 3), 0, [0, -1]), ((3, 0), 0, [0, 2]), ((2, 0, 4), 1, [0]),
                              ((4, 3), 0, []), ((0, 2, 3), 1, [0, 1])]:
        src = np.zeros(shape, np.float32)
        idx = np.array(index, np.int32)
        check(src, [0] * (dim + 1), dim, idx, pad_value=1.5)
        check(src, [0] * (dim + 1), dim, idx, pad_value=1.5, check_bounds=False)


def test_offsets_as_array_and_scalar_arrays():
    src = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    index = np.array([0, 3, 4], np.int32)
    want = ref_gather(src, [1, 1], 1, index)
    assert_bits_equal(both(jax_ext.gather, src, np.array([1, 1], np.int8), 1, index), want)
    assert_bits_equal(both(jax_ext.gather, src, (jnp.int16(1), np.uint8(1)), 1, index), want)


# --- errors -----------------------------------------------------------------------------

def test_errors():
    src = np.zeros((4, 5, 6), np.float32)
    idx = np.array([0, 1], np.int32)
    with pytest.raises(NotImplementedError, match=r"dim=2 is the last dimension of src \(4, 5, 6\)"):
        jax_ext.gather(src, [0, 0, 0], 2, idx)
    with pytest.raises(ValueError, match=r"dim.*got dim=3.*\(4, 5, 6\)"):
        jax_ext.gather(src, [0, 0, 0, 0], 3, idx)
    with pytest.raises(ValueError, match=r"dim=-1"):
        jax_ext.gather(src, [0], -1, idx)
    with pytest.raises(TypeError, match="dim must be a Python int"):
        jax_ext.gather(src, [0], 0.0, idx)
    with pytest.raises(NotImplementedError):
        jax_ext.gather(np.zeros(4), [0], 0, idx)
    with pytest.raises(ValueError, match=r"offsets must hold dim \+ 1 = 2 values.*got 1"):
        jax_ext.gather(src, [0], 1, idx)
    with pytest.raises(ValueError, match="offsets must hold"):
        jax_ext.gather(src, [0, 0, 0], 1, idx)
    with pytest.raises(TypeError, match=r"offsets\[0\] must be an integer"):
        jax_ext.gather(src, [0.5], 0, idx)
    with pytest.raises(TypeError, match=r"offsets\[1\] must have an integer dtype, got float32"):
        jax_ext.gather(src, [0, jnp.float32(1)], 1, idx)
    with pytest.raises(ValueError, match=r"offsets\[0\] must be a scalar, got shape \(2,\)"):
        jax_ext.gather(src, [jnp.zeros(2, jnp.int32)], 0, idx)
    with pytest.raises(TypeError, match="offsets must have an integer dtype"):
        jax_ext.gather(src, np.zeros(1, np.float32), 0, idx)
    with pytest.raises(ValueError, match=r"offsets\[0\]=.*int64"):
        jax_ext.gather(src, [2 ** 63], 0, idx)
    with pytest.raises(ValueError, match=r"index must have rank 1, got shape \(2, 1\)"):
        jax_ext.gather(src, [0], 0, idx.reshape(2, 1))
    with pytest.raises(ValueError, match=r"index must have rank 1, got shape \(\)"):
        jax_ext.gather(src, [0], 0, np.int32(1))
    with pytest.raises(TypeError, match="index must have an integer dtype, got float32"):
        jax_ext.gather(src, [0], 0, idx.astype(np.float32))
    with pytest.raises(TypeError, match="index must have an integer dtype, got bool"):
        jax_ext.gather(src, [0], 0, np.array([True, False]))
    with pytest.raises(ValueError, match=r"num_indices=3 must lie in \[0, n\] = \[0, 2\]"):
        jax_ext.gather(src, [0], 0, idx, num_indices=3)
    with pytest.raises(ValueError, match="num_indices=-1"):
        jax_ext.gather(src, [0], 0, idx, num_indices=-1)
    with pytest.raises(TypeError, match="num_indices must have an integer dtype"):
        jax_ext.gather(src, [0], 0, idx, num_indices=jnp.float32(1))
    with pytest.raises(TypeError, match="num_indices must be an integer"):
        jax_ext.gather(src, [0], 0, idx, num_indices=1.0)
    with pytest.raises(ValueError, match=r"pad_value must be a scalar, got shape \(2,\)"):
        jax_ext.gather(src, [0], 0, idx, pad_value=np.zeros(2))
    for bad in (0, -32, 6, 33.0, True):
        with pytest.raises(ValueError, match=r"align_bytes must be None or a positive multiple "
                                             r"of src's itemsize 4 \(float32\)"):
            jax_ext.gather(src, [0], 0, idx, align_bytes=bad)
    with pytest.raises(ValueError, match="itemsize 8"):
        jax_ext.gather(src.astype(np.float64), [0], 0, idx, align_bytes=4)
    with pytest.raises(ValueError, match="pad_value=300 does not fit"):
        jax_ext.gather(src.astype(np.uint8), [0], 0, idx, pad_value=300)


def test_errors_under_jit_name_traced_shapes():
    src = jnp.zeros((4, 5), jnp.float32)
    with pytest.raises(ValueError, match=r"index must have rank 1, got shape \(2, 2\)"):
        jax.jit(lambda i: jax_ext.gather(src, [0], 0, i))(jnp.zeros((2, 2), jnp.int32))


# --- derivatives ------------------------------------------------------------------------

def dense_grads(src, offsets, dim, index, ct, *, check_bounds=True, num_indices=None):
    """Reference VJP by a loop: src gets ct rows added (in float64/complex128), pad_value
    gets the sum over every other position."""
    src = np.asarray(src)
    acc = np.complex128 if src.dtype.kind == "c" else np.float64
    gs = np.zeros(src.shape, acc)
    ct = np.asarray(ct).astype(acc)
    last = src.shape[-1]
    mask = np.ones(ct.shape, bool)
    for i, pos in ref_rows(src.shape, offsets, dim, index, check_bounds, num_indices):
        gs[pos] += ct[i, ..., :last]
        mask[i, ..., :last] = False
    return gs, ct[mask].sum()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("impl", IMPLS)
def test_grad_against_dense_reference_with_duplicates(dtype, impl):
    rng = np.random.default_rng(5)
    shape, dim = (3, 6, 2, 5), 1
    src = rng.standard_normal(shape).astype(dtype)
    index = np.array([1, 1, 4, -2, 9, 0, 1, 5, 4], np.int32)
    L = row_len(5, np.dtype(dtype).itemsize, 32)
    ct = rng.standard_normal((9, 2, L)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        ct = (ct + 1j * rng.standard_normal(ct.shape)).astype(dtype)
    tol = {2: 2e-2}.get(np.dtype(dtype).itemsize, 1e-5)
    for cb, num in [(True, None), (True, 6), (False, 7)]:
        def f(s, p):
            return jax_ext.gather(s, [2, 1], dim, index, pad_value=p, num_indices=num,
                                  check_bounds=cb)

        def vjp(s, p, ct):
            return jax.vjp(f, s, p)[1](ct)
        with jax_ext.implementation(impl):
            gs, gp = jax.jit(vjp)(src, jnp.zeros((), dtype), ct)
        if np.dtype(dtype).kind != "c":  # jax.grad of a real loss gives the same
            with jax_ext.implementation(impl):
                gs2, gp2 = jax.grad(lambda s, p: jnp.sum(f(s, p) * ct).astype(jnp.float32),
                                    argnums=(0, 1))(src, jnp.zeros((), dtype))
            assert_bits_equal(gs2, gs)
        ws, wp = dense_grads(src, [2, 1], dim, index, ct, check_bounds=cb, num_indices=num)
        assert gs.dtype == np.dtype(dtype)
        np.testing.assert_allclose(np.asarray(gs).astype(ws.dtype), ws, rtol=tol, atol=tol * 10)
        np.testing.assert_allclose(complex(gp), complex(wp), rtol=tol, atol=tol * 10)


def test_grad_native_equals_lax_bitwise():
    # Both accumulate every element in index order (float16/bfloat16 in float32).
    rng = np.random.default_rng(6)
    index = rng.integers(-3, 40, 300).astype(np.int32)
    for dtype in (np.float32, np.float64, np.complex64, np.float16, ml_dtypes.bfloat16):
        src = jnp.asarray(rng.standard_normal((37, 3, 40)).astype(dtype))
        ct = jnp.asarray(rng.standard_normal((300, 3, row_len(40, np.dtype(dtype).itemsize, 32)))
                         .astype(dtype))

        def g(s):
            return jax.vjp(lambda s: jax_ext.gather(s, [0], 0, index), s)[1](ct)[0]
        both(jax.jit(g), src)


@pytest.mark.parametrize("impl", IMPLS)
def test_grad_with_no_rows_is_zeros(impl):
    """No cotangent row (an empty index, or a batch of them): the gradient is all zeros,
    written in full even where the result's memory held other values before."""
    src = jnp.asarray(np.arange(4096, dtype=np.float32).reshape(512, 8))
    with jax_ext.implementation(impl):
        for index in (np.zeros(0, np.int32), np.zeros((3, 0), np.int32)):
            def loss(s, i):
                rows = jax.vmap(lambda i: jax_ext.gather(s, [0], 0, i))(i) if i.ndim > 1 \
                    else jax_ext.gather(s, [0], 0, i)
                return jnp.sum(rows * 3.0)
            for _ in range(3):  # later calls get memory earlier results were freed from
                junk = jax.jit(lambda s: s * -1.5)(src)
                del junk
                g = jax.jit(jax.grad(loss))(src, index)
                np.testing.assert_array_equal(np.asarray(g).view(np.uint32), 0)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
def test_grad_of_a_sub_byte_float(impl):
    """float4_e2m1fn: the gradient accumulates in float32 in index order and rounds once,
    as for float16 and bfloat16 (src's and pad_value's: numpy's exact sums, rounded once,
    bit for bit, every code in the cotangent); sums past 6 saturate, as jax's conversion
    and ml_dtypes' do. jnp.take's gradient rounds after every addition: where no row
    repeats the two are equal (checked); six cotangents of 1 into one row give 6 here,
    4 there (docs/sharp-bits.md)."""
    dt = np.dtype(ml_dtypes.float4_e2m1fn)
    rng = np.random.default_rng(14)
    src = random_values(rng, (6, 2, 5), dt)
    index = np.array([1, 1, 4, -2, 9, 0, 1, 5, 4], np.int32)
    ct = random_values(rng, (9, 2, 32), dt)  # every code
    zero = np.zeros((), dt)

    def vjp(s, p, c, i=index, num=8):
        return jax.vjp(lambda s, p: jax_ext.gather(s, [0], 0, i, pad_value=p, num_indices=num),
                       s, p)[1](c)
    with jax_ext.implementation(impl):
        got = [vjp(src, zero, ct), jax.jit(vjp)(src, zero, ct)]
        ones = jax.jit(lambda s, c: vjp(s, zero, c, np.full(6, 2, np.int32), None))(
            src, np.ones((6, 2, 32), dt))[0]
        distinct = np.array([4, 0, 9, 2, -1], np.int32)
        mine = jax.jit(lambda s, c: vjp(s, zero, c, distinct, None)[0])(src, ct[:5])
    ws, wp = dense_grads(src, [0], 0, index, ct, num_indices=8)
    for gs, gp in got:
        assert_bits_equal(gs, ws.astype(dt))
        assert_bits_equal(gp, np.asarray(wp).astype(dt))
    assert np.asarray(ones[2], np.float32).tolist() == [[6.0] * 5] * 2  # 6 x 1, rounded once
    twin = jax.vjp(lambda s: jnp.take(s, jnp.where(distinct < 0, 6, distinct), axis=0,
                                      mode="fill", fill_value=0), src)[1](ct[:5, :, :5])[0]
    assert_bits_equal(mine, twin)
    assert_bits_equal(mine, dense_grads(src, [0], 0, distinct, ct[:5])[0].astype(dt))


def test_integer_src_gets_float0():
    src = jnp.arange(12, dtype=jnp.int32).reshape(4, 3)
    for s in [src] + [src.astype(dt) for dt in SUB_BYTE_DTYPES
                      if not jnp.issubdtype(dt, jnp.floating)]:
        _float0_grads(s)


def _float0_grads(src):
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            out, vjp = jax.vjp(lambda s: jax_ext.gather(s, [0], 0, jnp.array([1, 2])), src)
            (g,) = vjp(jnp.zeros(out.shape, jax.dtypes.float0))
            assert g.dtype == jax.dtypes.float0 and g.shape == src.shape
            g = jax.grad(lambda s, x: jnp.sum(jax_ext.gather(s, [0], 0, jnp.array([1]))
                                              .astype(jnp.float32) * x),
                         argnums=(0, 1), allow_int=True)(src, 2.0)
            assert g[0].dtype == jax.dtypes.float0


@pytest.mark.parametrize("impl", IMPLS)
def test_check_grads_order_2(impl):
    rng = np.random.default_rng(7)
    src = jnp.asarray(rng.standard_normal((5, 4, 3)))
    index = jnp.array([0, 4, 4, -1, 2, 7])
    for dim, offs in [(0, [1]), (1, [2, 1])]:
        def f(s, p):
            return jax_ext.gather(s, offs, dim, index, pad_value=p, num_indices=5)
        with jax_ext.implementation(impl):
            check_grads(f, (src, jnp.float64(0.3)), order=2, modes=["fwd", "rev"])
            check_grads(lambda s: f(s, 1.0), (src.astype(jnp.complex128) * 1j,), order=2,
                        modes=["fwd", "rev"])


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_transpose_jvp_and_hessian(impl):
    src = jnp.arange(24.0, dtype=jnp.float32).reshape(6, 4)
    index = jnp.array([5, 5, 0, 9])
    with jax_ext.implementation(impl):
        f = lambda s: jax_ext.gather(s, [0], 0, index, align_bytes=None)
        (t,) = jax.linear_transpose(f, src)(jnp.ones((4, 4), jnp.float32))
        np.testing.assert_array_equal(t[:, 0], [1, 0, 0, 0, 0, 2])
        _, tan = jax.jvp(lambda p: jax_ext.gather(src, [0], 0, index, pad_value=p),
                         (jnp.float32(1),), (jnp.float32(3),))
        np.testing.assert_array_equal(tan[3], np.full(8, 3.0))  # a padded row
        np.testing.assert_array_equal(tan[0], [0] * 4 + [3] * 4)  # padding columns
        h = jax.hessian(lambda s: jnp.sum(jax_ext.gather(s, [0], 0, index) ** 2))(src)
        assert h.shape == (6, 4, 6, 4) and float(h[5, 0, 5, 0]) == 4.0


@pytest.mark.gpu
def test_inside_scan_cond_checkpoint():
    src = jnp.arange(40.0).reshape(10, 4)

    def body(c, i):
        g = jax_ext.gather(src * c, [0], 0, jnp.stack([i, i + 1]), align_bytes=None)
        return c + 1.0, lax.cond(i > 3, lambda: g.sum(), lambda: -g.sum())

    for impl in IMPLS:
        with jax_ext.implementation(impl):
            _, ys = lax.scan(jax.checkpoint(body), 1.0, jnp.arange(6))
            want = [(-1 if i <= 3 else 1) * (1.0 + i) * src[i:i + 2].sum() for i in range(6)]
            np.testing.assert_allclose(ys, want)
            jax.grad(lambda c: lax.scan(jax.checkpoint(body), c, jnp.arange(6))[1].sum())(1.0)


# --- vmap -------------------------------------------------------------------------------

def _loop(f, in_axes, args):
    size = next(a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None)
    outs = [f(*[a if ax is None else jnp.take(a, b, axis=ax) for a, ax in zip(args, in_axes)])
            for b in range(size)]
    return np.stack([np.asarray(o) for o in outs])


def _vmap_case(rng):
    src = jnp.asarray(rng.standard_normal((3, 5, 4, 3)).astype(np.float32))   # B=3 on axis 0
    offs = jnp.asarray(np.array([[0, 1], [4, -1], [2, 0]], np.int64))         # B=3 on axis 0
    index = jnp.asarray(np.array([[0, 2, 3, -1], [1, 1, 9, 0], [3, 2, 1, 0]], np.int16).T)  # axis 1
    num = jnp.asarray(np.array([4, 2, 0], np.int32))
    pad = jnp.asarray(np.array([1.5, np.nan, -2.0], np.float32))
    return src, offs, index, num, pad


def _g(s, o, i, k, p):
    return jax_ext.gather(s, [o[0], o[1]], 1, i, num_indices=k, pad_value=p)


ALL_AXES = [(0, None, None, None, None), (None, 0, None, None, None), (None, None, 1, None, None),
            (None, None, None, 0, None), (None, None, None, None, 0), (0, 0, 1, 0, 0),
            (0, None, 1, None, 0), (None, 0, 1, 0, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("in_axes", ALL_AXES)
def test_vmap_each_operand_and_combinations(in_axes):
    rng = np.random.default_rng(8)
    full = _vmap_case(rng)
    unb = (full[0][0], full[1][1], full[2][:, 1], full[3][0], full[4][1])
    args = [f if ax is not None else u for f, u, ax in zip(full, unb, in_axes)]
    want = _loop(lambda *a: ref_gather(a[0], a[1], 1, a[2], num_indices=a[3], pad_value=a[4]),
                 in_axes, [np.asarray(a) for a in args])
    got = both(jax.jit(jax.vmap(_g, in_axes)), *args)
    assert_bits_equal(got, want)
    text = hlo(jax.vmap(_g, in_axes), *args)
    assert text.count("jax_ext_gather_v2") == 1
    assert "stablehlo.while" not in text and "stablehlo.scatter" not in text


def test_vmap_nested_and_out_axes():
    rng = np.random.default_rng(9)
    src = jnp.asarray(rng.standard_normal((2, 6, 3)).astype(np.float32))
    index = jnp.asarray(rng.integers(-2, 8, (4, 5)).astype(np.int32))
    offs = jnp.array([0, 1, -1], np.int32)

    def f(s, o, i):
        return jax_ext.gather(s, [o], 0, i, num_indices=4)
    g = jax.vmap(jax.vmap(f, (None, None, 0)), (0, 0, None), out_axes=2)
    got = both(jax.jit(g), src[:, None].repeat(3, 1).reshape(6, 6, 3)[:3], offs, index)
    for a in range(3):
        for b in range(4):
            want = ref_gather(np.asarray(src[:, None].repeat(3, 1).reshape(6, 6, 3)[a]),
                              [int(offs[a])], 0, index[b], num_indices=4)
            assert_bits_equal(got[:, :, a][b], want)
    text = hlo(g, src[:, None].repeat(3, 1).reshape(6, 6, 3)[:3], offs, index)
    assert text.count("jax_ext_gather_v2") == 1 and "stablehlo.while" not in text
    # three levels, batched src only at the innermost level
    h = jax.vmap(jax.vmap(jax.vmap(f, (0, None, None)), (None, None, 0)), (None, 0, None))
    s3 = jnp.asarray(rng.standard_normal((2, 6, 3)).astype(np.float32))
    got = both(jax.jit(h), s3, offs, index)
    assert got.shape == (3, 4, 2, 5, 8)
    assert_bits_equal(got[2, 1, 0], ref_gather(np.asarray(s3[0]), [-1], 0, index[1], num_indices=4))


def test_vmap_of_grad_and_grad_of_vmap_stay_native():
    rng = np.random.default_rng(10)
    src = jnp.asarray(rng.standard_normal((6, 4)).astype(np.float32))
    srcs = jnp.asarray(rng.standard_normal((3, 6, 4)).astype(np.float32))
    index = jnp.asarray(rng.integers(-1, 7, (3, 5)).astype(np.int32))
    pads = jnp.asarray([0.5, 1.0, 2.0], np.float32)

    def loss(s, i, p):
        return jnp.sum(jax_ext.gather(s, [0], 0, i, pad_value=p) ** 2)
    forms = {
        "vmap(grad) shared src": (jax.vmap(jax.grad(loss, argnums=(0, 2)), (None, 0, 0)),
                                  (src, index, pads)),
        "vmap(grad) batched src": (jax.vmap(jax.grad(loss, argnums=(0, 2)), (0, 0, None)),
                                   (srcs, index, 1.0)),
        "grad(vmap) shared src": (jax.grad(lambda s, i, p: jax.vmap(loss, (None, 0, 0))(s, i, p)
                                           .sum(), argnums=(0, 2)), (src, index, pads)),
    }
    for name, (fn, args) in forms.items():
        outs = [both(lambda *a: jax.jit(fn)(*a)[k], *args) for k in range(2)]
        text = hlo(fn, *args)
        assert "jax_ext_scatter_add_v2" in text, name
        assert "stablehlo.scatter" not in text and "stablehlo.while" not in text, name
        # against per-example jax.grad
        in_axes = {"vmap(grad) shared src": (None, 0, 0), "vmap(grad) batched src": (0, 0, None),
                   "grad(vmap) shared src": (None, 0, 0)}[name]
        per = [jax.grad(loss, argnums=(0, 2))(*[a if ax is None else a[b]
                                                for a, ax in zip(args, in_axes)])
               for b in range(3)]
        if name.startswith("grad"):
            np.testing.assert_allclose(outs[0], sum(p[0] for p in per), rtol=1e-5)
            np.testing.assert_allclose(outs[1], [p[1] for p in per], rtol=1e-5)
        else:
            np.testing.assert_allclose(outs[0], np.stack([p[0] for p in per]), rtol=1e-5)
            np.testing.assert_allclose(np.reshape(outs[1], -1),
                                       np.reshape([p[1] for p in per], -1), rtol=1e-5)


# --- lowering ---------------------------------------------------------------------------

def test_lowering_forward_grad_and_lax():
    src = jnp.zeros((64, 16), jnp.float32)
    index = jnp.arange(8, dtype=jnp.int32)

    def f(s, k, p):
        return jax_ext.gather(s, [0], 0, index, num_indices=k, pad_value=p)

    def loss(s, k, p):
        return jnp.sum(f(s, k, p) ** 2)
    for fn, target in [(f, "jax_ext_gather_v2"),
                       (jax.grad(loss, argnums=(0, 2)), "jax_ext_scatter_add_v2")]:
        text = hlo(fn, src, 3, 1.0)
        assert target in text and "stablehlo.custom_call" in text
        assert "stablehlo.scatter" not in text and "stablehlo.while" not in text
        with jax_ext.implementation("lax"):
            text = hlo(fn, src, 3, 1.0)
        assert "custom_call" not in text


# --- randomized differential ------------------------------------------------------------

@st.composite
def gather_case(draw):
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.integers(0 if r == 0 else 1, 4)) for r in range(rank))
    dim = draw(st.integers(0, rank - 2))
    dtype = draw(st.sampled_from([np.int8, np.float16, ml_dtypes.bfloat16, np.float32,
                                  np.complex64, np.uint64, np.bool_] + SUB_BYTE_DTYPES))
    idt = draw(st.sampled_from(INDEX_DTYPES))
    info = np.iinfo(idt)
    n = draw(st.integers(0, 6))
    index = draw(st.lists(st.one_of(st.integers(-2, 6), st.sampled_from([info.min, info.max])),
                          min_size=n, max_size=n))
    index = [min(max(i, info.min), info.max) for i in index]
    offs = [draw(st.one_of(st.integers(-2, 5), st.sampled_from([-2 ** 63, 2 ** 63 - 1])))
            for _ in range(dim + 1)]
    num = draw(st.one_of(st.none(), st.integers(0, n)))
    align = draw(st.sampled_from([None, 32, 64]))
    if align is not None and align % np.dtype(dtype).itemsize:
        align = None
    return dict(shape=shape, dim=dim, dtype=dtype, index=np.array(index, idt), offsets=offs,
                num=num, align=align, check_bounds=draw(st.booleans()), seed=draw(st.integers(0, 9)))


@settings(max_examples=150, deadline=None)
@given(gather_case())
def test_hypothesis_differential(c):
    rng = np.random.default_rng(c["seed"])
    src = random_values(rng, c["shape"], c["dtype"])
    pad = random_values(rng, (), c["dtype"])
    check(src, c["offsets"], c["dim"], c["index"], check_bounds=c["check_bounds"],
          num_indices=c["num"], pad_value=pad, align_bytes=c["align"], impls=next(IMPL_PAIRS))


@functools.lru_cache(maxsize=None)
def _jitted_vjp(impl, dim, cb):
    def g(s, o, i, k, ct):
        with jax_ext.implementation(impl):
            return jax.vjp(lambda s, p: jax_ext.gather(s, list(o), dim, i, num_indices=k,
                                                       pad_value=p, check_bounds=cb),
                           s, jnp.zeros((), s.dtype))[1](ct)
    return jax.jit(g)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1), st.booleans(), st.lists(st.integers(-3, 8), min_size=1, max_size=12),
       st.integers(-1, 7), st.integers(0, 12), st.integers(0, 9))
def test_hypothesis_grad(dim, cb, index, off, num, seed):
    rng = np.random.default_rng(seed)
    shape = (3, 6, 5)
    src = rng.standard_normal(shape)
    index = np.array(index, np.int32)
    ct = rng.standard_normal((len(index),) + shape[dim + 1:-1] + (8,))
    offs = np.array([1, off][-(dim + 1):] if dim else [off], np.int64)
    got = [_jitted_vjp(impl, dim, cb)(src, offs, index, np.int64(num), ct)
           for impl in next(IMPL_PAIRS)]
    for g in got[1:]:
        assert_bits_equal(got[0][0], g[0])
    ws, wp = dense_grads(src, list(offs), dim, index, ct, check_bounds=cb, num_indices=num)
    np.testing.assert_allclose(got[0][0], ws, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0][1], wp, rtol=1e-12, atol=1e-12)


def test_without_x64_offsets_travel_as_int32():
    """jax_enable_x64 off (jax's default): offsets/num_indices are int32 operands; uint32
    indices above 2**31 still add exactly. Runs in a fresh process (conftest enables x64)."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import warnings; warnings.simplefilter("error")
        import jax, jax.numpy as jnp, numpy as np, jax_ext
        assert not jax.config.jax_enable_x64
        src = jnp.arange(48, dtype=jnp.float32).reshape(4, 3, 4)
        idx = jnp.array([0, 3, 4, 2**31 + 1, 2**32 - 1], jnp.uint32)
        outs = []
        for impl in ["native", "lax", "auto"]:
            with jax_ext.implementation(impl):
                r = jax_ext.gather(src, [1, -2], 1, idx, num_indices=jnp.uint32(2**32 - 1))
                assert r.shape == (5, 8)
                np.testing.assert_array_equal(r[:, 0], [0, 16, 20, 0, 0])
                g = jax.grad(lambda s, p: jnp.sum(jax_ext.gather(
                    s, [0], 0, jnp.array([1, 1, 7]), pad_value=p) ** 2), argnums=(0, 1))(src, 1.0)
                np.testing.assert_array_equal(g[0][1, 0], [48, 52, 56, 60])
                assert float(g[1]) == 96.0
                v = jax.vmap(lambda o, i: jax_ext.gather(src, [o], 0, i))(
                    jnp.array([0, 1]), jnp.array([[0, 1], [2, 3]]))
                np.testing.assert_array_equal(v[:, :, 0, 0], [[0, 12], [36, 0]])
        try:
            jax_ext.gather(src, [2**40], 0, idx)
        except ValueError as e:
            assert "int32" in str(e) and "jax_enable_x64" in str(e)
        else:
            raise AssertionError("no ValueError")
        print("ok")
    """)
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd="/")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_large_threaded_paths_native_equals_lax():
    """Big enough for the threaded and streaming (>= 16 MiB result) gather paths and for
    every scatter-add partition (contributions sorted by output row for long rows, columns
    for long rows of too few output rows, output rows for short ones; streamed from 16 MiB
    of result), with heavy duplication, padded sub-rows and every way of accumulating:
    native and lax agree bit for bit."""
    rng = np.random.default_rng(11)
    src = jnp.asarray(rng.standard_normal((2048, 1024)).astype(np.float32))
    index = jnp.asarray(rng.integers(-8, 2060, 4160).astype(np.int32))
    got = both(jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=7.0,
                                                   num_indices=4100)), src, index)
    assert got.nbytes >= 16 << 20
    np.testing.assert_array_equal(got[:5], ref_gather(np.asarray(src), [0], 0, index[:5]))
    cases = [((64, 256), np.float32), ((512, 8), np.float32), ((3, 4096), np.float32),
             ((16384, 256), np.float32), ((4096, 130), np.float32),
             ((2048, 3, 50), np.float32), ((4096, 130), np.float64),
             ((4096, 130), np.complex64), ((4096, 130), ml_dtypes.bfloat16)]
    for shape, dtype in cases:
        item = np.dtype(dtype).itemsize
        s = jnp.asarray(rng.standard_normal(shape).astype(dtype))
        idx = jnp.asarray(rng.integers(-2, shape[0] + 2, 20000).astype(np.int32))
        c = rng.standard_normal((20000, *shape[1:-1], row_len(shape[-1], item, 32)))
        ct = jnp.asarray(c.astype(dtype))
        g = both(jax.jit(lambda s, i, c: jax.vjp(lambda s: jax_ext.gather(s, [0], 0, i), s)[1](c)[0]),
                 s, idx, ct)
        ws, _ = dense_grads(np.asarray(s), [0], 0, np.asarray(idx), np.asarray(ct))
        tol = 2e-2 if item == 2 else 1e-4
        np.testing.assert_allclose(np.asarray(g).astype(ws.dtype), ws, rtol=tol, atol=tol * 10)
