"""A slice of JAX's own tests for lax.select / lax.select_n, jnp.where, jnp.take and
lax.gather, ported to jax_ext (jax-ml/jax tests/lax_test.py, lax_numpy_test.py,
lax_vmap_test.py, lax_autodiff_test.py): their shapes, dtypes, batching dims and grad
checks, run on both implementations. Where jax_ext's contract differs from the lax op
(no dtype promotion, a bool condition, row gather with pad instead of wrap-around), the
port keeps the shapes and dtypes and compares against a numpy reference of jax_ext's
semantics; what jax_ext refuses by contract is asserted to raise.

About 1,180 cases; the small ones of each family are traced into one jitted program per
implementation (one compilation instead of hundreds), so every one of them runs on both
implementations; the gradient checks alternate between them."""
import itertools
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_ext
from references import ALL_DTYPES, IMPLS, assert_bits_equal, np_select

# lax_test_util.default_dtypes (floats + ints) and all_dtypes (+ complex, uint, bool)
DEFAULT_DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32, np.float64, np.int8, np.int16,
                  np.int32, np.int64]
GRAD_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]

# lax_numpy_test.all_shapes: numpy / Python scalars, then arrays (empty ones included)
NP_SCALAR, PY_SCALAR = "np_scalar", "py_scalar"
ALL_SHAPES = [NP_SCALAR, PY_SCALAR, (), (4,), (3, 4), (3, 1), (1, 4), (2, 1, 4), (2, 3, 4),
              (0,), (0, 4), (3, 0)]


def _alternate(cases):
    """Each case with one implementation, alternating along the list, so every family of
    cases runs on every implementation while the whole file stays near a minute on two
    cores; JAX_EXT_PORTED_BOTH=1 runs every case on all of them."""
    both = os.environ.get("JAX_EXT_PORTED_BOTH") == "1"
    out = []
    for k, c in enumerate(cases):
        c = c if isinstance(c, tuple) else (c,)
        for impl in (IMPLS if both else [IMPLS[k % len(IMPLS)]]):
            out.append(pytest.param(*c, impl, id=f"{impl}-{k}"))
    return out


def _run_in_one_jit(calls):
    """calls: [(fn, args)] -> [fn(*args)], all traced into ONE jitted program, so the
    many small cases cost one compilation instead of one each. Python scalars stay
    Python scalars (closed over; jit would make them weakly typed arrays)."""
    is_py = [[isinstance(a, (bool, int, float, complex)) for a in args] for _, args in calls]
    arrays = [[a for a, py in zip(args, flags) if not py] for (_, args), flags in zip(calls, is_py)]

    def run(arrays):
        outs = []
        for (fn, args), flags, arrs in zip(calls, is_py, arrays):
            it = iter(arrs)
            outs.append(fn(*[a if py else next(it) for a, py in zip(args, flags)]))
        return outs
    return jax.jit(run)(arrays)


def _rand(rng, shape, dtype):
    """jtu.rand_default: small finite values, random signs."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -5, 6, shape).astype(dtype)
    v = (rng.standard_normal(shape) * 3).astype(np.float64)
    if dtype.kind == "c":
        v = v + 1j * (rng.standard_normal(shape) * 3)
    return np.asarray(v).astype(dtype)


def _shape_of(s):
    return () if s in (NP_SCALAR, PY_SCALAR) else s


def _make(rng, s, dtype):
    v = _rand(rng, _shape_of(s), dtype)
    if s == NP_SCALAR:
        return np.asarray(v).reshape(()).astype(dtype)[()]
    if s == PY_SCALAR:
        return np.asarray(v).reshape(()).item()
    return v


def _broadcastable(shapes):
    try:
        np.broadcast_shapes(*map(_shape_of, shapes))
        return True
    except ValueError:
        return False


# --- lax_test.testSelect / testSelectN (bool predicate, two cases) ----------------------

_SELECT_SHAPES = [(p, a) for a in [(), (3,), (2, 3)] for p in ([(), a] if a else [()])]


_LAX_SELECT = [(p, a, d) for p, a in _SELECT_SHAPES for d in ALL_DTYPES]


@pytest.mark.parametrize("impl", IMPLS)
def test_lax_select(impl):
    rng = np.random.default_rng(0)
    calls, wants = [], []
    for pred_shape, arg_shape, dtype in _LAX_SELECT:
        p, x, y = (_rand(rng, pred_shape, bool), _rand(rng, arg_shape, dtype),
                   _rand(rng, arg_shape, dtype))
        for fn in (jax_ext.select, jax_ext.where, jax_ext.where3):
            calls.append((fn, (p, x, y)))
            wants.append(np_select(p, x, y, arg_shape))
        # lax.select_n(pred, on_false, on_true) is where(pred, on_true, on_false)
        calls.append((jax_ext.where, (p, y, x)))
        wants.append(np_select(p, y, x, arg_shape))
    with jax_ext.implementation(impl):
        gots = _run_in_one_jit(calls)
        eager = jax_ext.select(*calls[0][1])  # and one eager call
    assert_bits_equal(eager, wants[0])
    for got, want in zip(gots, wants):
        assert_bits_equal(got, want)


# --- lax_numpy_test.testWhereThreeArgument / testWhereScalarPromotion --------------------

_WHERE_SHAPES = [s for s in itertools.combinations_with_replacement(ALL_SHAPES, 3)
                 if _broadcastable(s)]


@pytest.mark.parametrize("impl", IMPLS)
def test_jnp_where_three_argument(impl):
    calls, checks = [], []
    for k, (cs, xs, ys) in enumerate(_WHERE_SHAPES):
        dtype = ALL_DTYPES[k % len(ALL_DTYPES)]
        if xs == PY_SCALAR and ys == PY_SCALAR:
            dtype = [bool, np.int64, np.float64, np.complex128][k % 4]  # what Python gives
        rng = np.random.default_rng(k)
        c, x, y = _make(rng, cs, bool), _make(rng, xs, dtype), _make(rng, ys, dtype)
        calls.append((jax_ext.where, (c, x, y)))
        checks.append((c, x, y, jax.eval_shape(jnp.where, c, x, y)))  # same dtypes: no promotion
    with jax_ext.implementation(impl):
        gots = _run_in_one_jit(calls)
    for got, (c, x, y, want) in zip(gots, checks):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert jax.typeof(got).weak_type == want.weak_type
        assert_bits_equal(got, np_select(np.asarray(c), np.asarray(x, got.dtype),
                                         np.asarray(y, got.dtype), want.shape))


def test_jnp_where_scalar_promotion_and_extra_code():
    x = jax_ext.where(jnp.array([True, False]), 3, jnp.ones((2,), dtype=jnp.float32))
    assert x.dtype == np.float32
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: jax_ext.where(x > 0, x, -x)))(3.))
    assert "True" not in jaxpr and "False" not in jaxpr


# --- lax_vmap_test.testSelect: every batching-dim pattern, batch size 5 (and 0) ----------

def _all_bdims(*shapes):
    dims = (itertools.chain([None], range(len(s) + 1)) for s in shapes)
    return [t for t in itertools.product(*dims) if not all(e is None for e in t)]


_VMAP_SELECT = [(p, a, b) for p, a in _SELECT_SHAPES for b in _all_bdims(p, a, a)]


@pytest.mark.parametrize("impl", IMPLS)
def test_lax_vmap_select(impl):
    rng = np.random.default_rng(1)
    fn = lambda c, x, y: jax_ext.select(c < 0, x, y)  # noqa: E731  (as the jax test)
    calls, cases = [], []
    for k, (pred_shape, arg_shape, bdims) in enumerate(_VMAP_SELECT):
        dtype = [np.float32, np.int8, ml_dtypes.bfloat16, np.complex64][k % 4]
        for size in (5, 0):
            args = []
            for bd, s, dt in zip(bdims, (pred_shape, arg_shape, arg_shape),
                                 (np.float32, dtype, dtype)):
                v = _rand(rng, ((size,) if bd is not None else ()) + tuple(s), dt)
                args.append(np.moveaxis(v, 0, bd) if bd is not None else v)
            calls.append((jax.vmap(fn, in_axes=bdims), tuple(args)))
            cases.append((size, arg_shape, bdims, args))
    with jax_ext.implementation(impl):
        gots = _run_in_one_jit(calls)
    for got, (size, arg_shape, bdims, args) in zip(gots, cases):
        assert got.shape == (size,) + arg_shape
        for i in range(size):  # against a loop over the examples
            ex = [a if bd is None else np.take(a, i, axis=bd) for a, bd in zip(args, bdims)]
            assert_bits_equal(got[i], np_select(ex[0] < 0, ex[1], ex[2], arg_shape))


# --- lax_autodiff_test.testSelectGrad -----------------------------------------------------

@pytest.mark.parametrize("pred_shape,arg_shape,dtype,impl", _alternate(
    [(p, a, d) for p, a in _SELECT_SHAPES for d in GRAD_DTYPES]))
def test_lax_autodiff_select_grad(pred_shape, arg_shape, dtype, impl):
    rng = np.random.default_rng(2)
    pred = _rand(rng, pred_shape, bool)
    t, f = _rand(rng, arg_shape, dtype), _rand(rng, arg_shape, dtype)
    with jax_ext.implementation(impl):
        check_grads(lambda t, f: jax_ext.select(pred, t, f), (t, f), 2, ["fwd", "rev"], eps=1.)


# --- lax_numpy_test.testTake: take along an axis as a row gather --------------------------
# jnp.take(x, i, axis=a) for a < ndim - 1 is jax_ext.gather vmapped over the leading a
# axes (gather takes one row position per leading dim). mode="clip" is check_bounds=False
# (clamp); mode=None (jnp's "fill") with jax_ext's rule that a negative index is out of
# range (pad) rather than counted from the end; mode="wrap" by reducing the index first.
# The last axis is refused by contract (NotImplementedError), as the seed says.

_TAKE = [(shape, axis, ishape, idt, mode)
         for shape in [(3,), (3, 4), (3, 4, 5)]
         for axis in list(range(-len(shape), len(shape))) + [None]
         for ishape in [NP_SCALAR, PY_SCALAR, (3,), (2, 1, 3)]
         for idt, mode in zip([np.int8, np.int32, np.uint32], [None, "clip", "wrap"])]


def _take(x, i, axis, mode):
    n = x.shape[axis]
    if mode == "wrap":
        i = i % n
    flat = i.reshape(-1)
    g = lambda s: jax_ext.gather(s, [0], 0, flat, align_bytes=None,  # noqa: E731
                                 check_bounds=(mode != "clip"))
    for _ in range(axis):
        g = jax.vmap(g)
    out = g(x)
    return out.reshape(x.shape[:axis] + i.shape + x.shape[axis + 1:])


@pytest.mark.parametrize("impl", IMPLS)
def test_jnp_take(impl):
    calls, wants = [], []
    for k, (shape, axis, ishape, idt, mode) in enumerate(_TAKE):
        rng = np.random.default_rng(k)
        x = _rand(rng, shape, ALL_DTYPES[k % len(ALL_DTYPES)])
        a = 0 if axis is None else axis % len(shape)
        if axis is None:
            x = x.reshape(-1)
        n = x.shape[a]
        lo = -5 if mode else -n
        lo = max(lo, 0) if np.dtype(idt).kind == "u" else lo
        i = np.asarray(rng.integers(lo, 5 if mode else n, _shape_of(ishape))).astype(idt)
        if x.ndim == 1 or a == x.ndim - 1:  # the last axis: refused by contract
            with jax_ext.implementation(impl), pytest.raises(NotImplementedError):
                jax_ext.gather(x, [0] * (a + 1), a, i.reshape(-1))
            continue
        calls.append((lambda x, i, a=a, mode=mode: _take(x, i, a, mode), (x, i)))
        wi = i.astype(np.int64)
        if mode is None:  # out of range, negatives included: pad (0)
            ok = (wi >= 0) & (wi < n)
            want = np.take(x, np.clip(wi, 0, n - 1), axis=a)
            okb = ok.reshape((1,) * a + wi.shape + (1,) * (x.ndim - a - 1))
            want = np.where(okb, want, np.zeros((), x.dtype))
        else:
            want = np.take(x, wi, axis=a, mode=mode)
        wants.append(want.astype(x.dtype))
    with jax_ext.implementation(impl):
        gots = _run_in_one_jit(calls)
    for got, want in zip(gots, wants):
        assert_bits_equal(got, want)


def test_jnp_take_empty():
    np.testing.assert_array_equal(
        jax_ext.gather(jnp.ones((2, 0, 4), jnp.float32), [0, 0], 1, jnp.array([], jnp.int32)),
        jnp.ones((0, 8), jnp.float32))
    # jnp.take refuses a non-empty take from an empty axis; jax_ext pads instead
    got = jax_ext.gather(jnp.ones((0, 4), jnp.float32), [0], 0, jnp.array([0, 1], jnp.int32),
                         pad_value=7.0, align_bytes=None)
    np.testing.assert_array_equal(got, np.full((2, 4), 7.0, np.float32))


# --- lax_test.testIndexTake / lax_vmap_test.testGather: batching dims, sizes 5 and 0 -----

_GATHER_BDIMS = [(bs, bi) for bs in (None, 0, 1, 2) for bi in (None, 0, 1)
                 if not (bs is None and bi is None)]


_VMAP_GATHER = [(b, d) for b in _GATHER_BDIMS
                for d in (np.float32, np.int8, np.uint16, np.complex128, np.bool_)]


@pytest.mark.parametrize("impl", IMPLS)
def test_lax_vmap_gather(impl):
    rng = np.random.default_rng(4)
    shape, ishape = (10, 5), (3,)
    fn = lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None)  # noqa: E731
    calls, cases = [], []
    for bdims, dtype in _VMAP_GATHER:
        for size in (5, 0):
            s = _rand(rng, ((size,) if bdims[0] is not None else ()) + shape, dtype)
            s = np.moveaxis(s, 0, bdims[0]) if bdims[0] is not None else s
            i = rng.integers(-3, 13, ((size,) if bdims[1] is not None else ()) + ishape)
            i = np.moveaxis(i, 0, bdims[1]) if bdims[1] is not None else i
            calls.append((jax.vmap(fn, in_axes=bdims), (s, i)))
            cases.append((bdims, dtype, size, s, i))
    with jax_ext.implementation(impl):
        gots = _run_in_one_jit(calls)
    for got, (bdims, dtype, size, s, i) in zip(gots, cases):
        assert got.shape == (size, 3, 5) and got.dtype == np.dtype(dtype)
        for k in range(size):
            sk = s if bdims[0] is None else np.take(s, k, axis=bdims[0])
            ik = i if bdims[1] is None else np.take(i, k, axis=bdims[1])
            ok = (ik >= 0) & (ik < 10)
            want = np.where(ok[:, None], sk[np.clip(ik, 0, 9)], np.zeros((), sk.dtype))
            assert_bits_equal(got[k], want)


# --- lax_autodiff_test.testIndexTakeGrad / testGatherGrad ----------------------------------

@pytest.mark.parametrize("idxs,dtype,impl", _alternate(
    [(i, d) for i in ([0, 2, 1], [-1, -2]) for d in GRAD_DTYPES]))
def test_lax_autodiff_index_take_grad(idxs, dtype, impl):
    rng = np.random.default_rng(5)
    src = _rand(rng, (3, 4, 5), dtype)
    idx = np.array(idxs)
    with jax_ext.implementation(impl):
        check_grads(lambda s: jax_ext.gather(s, [0], 0, idx), (src,), 2, ["fwd", "rev"], eps=1.)


@pytest.mark.parametrize("mode,iteration,dtype,impl", _alternate(
    [(m, i, d) for m in ("clip", "fill", "promise_in_bounds") for i in range(1)
     for d in (np.float32, np.float64)]))
def test_lax_autodiff_gather_grad(mode, iteration, dtype, impl):
    rng = np.random.default_rng(100 + iteration)
    max_idx = 10
    lo, hi = (0, max_idx) if mode == "promise_in_bounds" else (-max_idx, 2 * max_idx)
    idxs = rng.integers(lo, hi, (3,)).astype(np.int32)
    x = _rand(rng, (10, 5), dtype)
    pad = np.asarray(-1, dtype)  # lax.gather's fill_value=-1; here also differentiated

    def gather(x, p):
        return jax_ext.gather(x, [0], 0, idxs, check_bounds=(mode != "clip"), pad_value=p)
    with jax_ext.implementation(impl):
        check_grads(gather, (x, pad), 2, ["fwd", "rev"], 1e-2, 1e-2, 1.)
