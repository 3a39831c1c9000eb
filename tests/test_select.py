"""select / where / where3 against numpy on raw bytes, native == lax bit for bit,
errors, derivatives, vmap, lowering and in-place donation."""
import itertools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.test_util import check_grads

import jax_ext
from references import (ALL_DTYPES, IMPL_PAIRS, IMPLS, assert_bits_equal, hlo, np_select,
                     random_values, special_values)

# --- shapes ---------------------------------------------------------------------------

dims_st = st.lists(st.integers(0, 4), min_size=0, max_size=4)


@st.composite
def variant(draw, shape):
    """A shape that broadcasts (numpy rules) to `shape`: a suffix with some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    suffix = list(shape[len(shape) - k:])
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


def _values(rng, shape, dtype):
    v = random_values(rng, shape, dtype)
    sp = special_values(dtype, v.size)
    if sp is not None and v.size:
        flat = v.reshape(-1)
        flat[::3] = sp[::3]  # make sure -0.0 / inf / NaN payloads are always present
    return v


@st.composite
def where_case(draw):
    full = tuple(draw(dims_st))
    shapes = [draw(variant(full)) for _ in range(3)]
    dtype = draw(st.sampled_from(ALL_DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    return shapes, dtype, seed


@settings(max_examples=120)
@given(where_case(), st.sampled_from(IMPLS))
def test_where_matches_numpy_bits(case, impl):
    (cs, xs, ys), dtype, seed = case
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = _values(rng, xs, dtype), _values(rng, ys, dtype)
    out_shape = np.broadcast_shapes(cs, xs, ys)
    with jax_ext.implementation(impl):
        got = jax_ext.where(c, x, y)
    assert_bits_equal(got, np_select(c, x, y, out_shape))


@settings(max_examples=120)
@given(where_case(), st.sampled_from(IMPLS), st.sampled_from(["numpy", "none"]))
def test_select_matches_numpy_bits(case, impl, mode):
    (cs, xs, ys), dtype, seed = case
    rng = np.random.default_rng(seed)
    s = np.broadcast_shapes(xs, ys)
    if mode == "none":
        cs = xs = ys = s
    else:  # one-way: trim cond so it never enlarges S
        cs = tuple(cs[-len(s):]) if s else ()
        cs = tuple(c if c == d else 1 for c, d in zip(cs, s[len(s) - len(cs):]))
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = _values(rng, xs, dtype), _values(rng, ys, dtype)
    with jax_ext.implementation(impl):
        got = jax.jit(lambda c, x, y: jax_ext.select(c, x, y, auto_broadcast=mode))(c, x, y)
    assert_bits_equal(got, np_select(c, x, y, s))


@settings(max_examples=60)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=4), st.sampled_from(ALL_DTYPES),
       st.sampled_from(["scalar", "full", "row"]), st.integers(0, 2**31 - 1))
def test_where3_matches_numpy_and_lax(shape, dtype, mode, seed):
    shape = tuple(shape)
    if mode == "row" and len(shape) < 2:
        mode = "full"
    rng = np.random.default_rng(seed)
    cshape = {"scalar": (), "full": shape, "row": shape[:1]}[mode]
    c = rng.integers(0, 2, cshape).astype(bool)
    x, y = _values(rng, shape, dtype), _values(rng, shape, dtype)
    cref = c.reshape(cshape + (1,) * (len(shape) - len(cshape))) if mode == "row" else c
    want = np_select(cref, x, y, shape)
    outs = []
    for impl in next(IMPL_PAIRS):
        with jax_ext.implementation(impl):
            outs.append(jax_ext.where3(c, x, y))
        assert_bits_equal(outs[-1], want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_native_equals_lax_every_dtype_jit(dtype):
    rng = np.random.default_rng(1)
    c = rng.integers(0, 2, (7, 1, 5)).astype(bool)
    x, y = _values(rng, (3, 5), dtype), _values(rng, (7, 3, 1), dtype)
    f = jax.jit(jax_ext.where)
    with jax_ext.implementation("native"):
        a = f(c, x, y)
    with jax_ext.implementation("lax"):
        b = f(c, x, y)
    assert_bits_equal(a, b)
    assert_bits_equal(a, np_select(c, x, y, (7, 3, 5)))


@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.bfloat16, np.float32, np.complex128])
def test_large_and_threaded_paths(n, dtype):
    # Large enough to be split over the thread pool; scalar-cond and row-cond fast paths.
    rng = np.random.default_rng(n)
    x, y = _values(rng, (n,), dtype), _values(rng, (n,), dtype)
    c = rng.integers(0, 2, (n,)).astype(bool)
    assert_bits_equal(jax_ext.where(c, x, y), np_select(c, x, y, (n,)))
    for s in (True, False):
        assert_bits_equal(jax_ext.where(np.bool_(s), x, y), x if s else y)
    m = rng.integers(0, 2, (4,)).astype(bool)
    x2, y2 = x[: (n // 4) * 4].reshape(4, -1), y[: (n // 4) * 4].reshape(4, -1)
    assert_bits_equal(jax_ext.where3(m, x2, y2), np_select(m[:, None], x2, y2, x2.shape))


def test_zero_size_and_scalars():
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            assert jax_ext.where(np.zeros((0, 3), bool), np.ones((0, 3)), 2.0).shape == (0, 3)
            assert jax_ext.select(True, np.zeros((2, 0)), np.ones((1, 0))).shape == (2, 0)
            r = jax_ext.where(np.bool_(False), np.float32(1), np.float32(-0.0))
            assert r.shape == () and np.signbit(r)


# --- typing rules ---------------------------------------------------------------------

def test_weak_scalars_take_the_other_dtype():
    x = jnp.arange(4, dtype=jnp.int8)
    c = np.array([True, False, True, False])
    assert jax_ext.where(c, x, 3).dtype == jnp.int8
    assert jax_ext.where(c, 2.5, jnp.ones(4, jnp.bfloat16)).dtype == jnp.bfloat16
    assert jax_ext.select(c, jnp.ones(4, jnp.float16), jnp.asarray(1.0)).dtype == jnp.float16
    r = jax_ext.where(c, 1, 2.5)  # two Python scalars: promote like jnp
    assert r.dtype == jnp.result_type(1, 2.5)
    assert jax_ext.where(True, 1.0, 2.0).weak_type
    assert not jax_ext.where(c, x, 3).weak_type


@pytest.mark.parametrize("fn", [jax_ext.select, jax_ext.where, jax_ext.where3])
def test_errors_types(fn):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match=r"must have dtype bool, got int32 with shape \(2, 3\)"):
        fn(np.ones((2, 3), np.int32), x, x)
    with pytest.raises(TypeError, match=r"same dtype, got .*float32\(2, 3\).*float64\(2, 3\)"):
        fn(np.ones((2, 3), bool), x, x.astype(np.float64))
    with pytest.raises(TypeError, match="must be an array or a scalar"):
        fn(np.ones((2, 3), bool), x, "abc")


def test_errors_shapes():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"auto_broadcast must be 'numpy' or 'none', got 'pdpd'"):
        jax_ext.select(True, x, x, auto_broadcast="pdpd")
    with pytest.raises(ValueError, match=r"identical shapes, got cond: \(\), then: \(2, 3\)"):
        jax_ext.select(True, x, x, auto_broadcast="none")
    with pytest.raises(ValueError, match=r"do not broadcast \(then: \(2, 3\), else_: \(4, 3\)\)"):
        jax_ext.select(True, x, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"cond \(2, 2, 3\) cannot be broadcast one-way"):
        jax_ext.select(np.ones((2, 2, 3), bool), x, x)
    with pytest.raises(ValueError, match=r"do not broadcast \(condition: \(4,\), x: \(2, 3\)"):
        jax_ext.where(np.ones((4,), bool), x, x)
    with pytest.raises(ValueError, match=r"x and y must have the same shape, got x: \(2, 3\) "
                                         r"and y: \(1, 3\)"):
        jax_ext.where3(True, x, x[:1])
    for bad in [(3,), (2, 1), (1, 3), (2, 3, 1)]:
        with pytest.raises(ValueError, match=re.escape(f"condition {bad}")):
            jax_ext.where3(np.ones(bad, bool), x, x)
    with pytest.raises(ValueError, match="condition"):  # rank-1 x: a vector cond is element-wise
        jax_ext.where3(np.ones((1,), bool), np.ones(3), np.ones(3))


def test_errors_at_trace_time_under_jit():
    f = jax.jit(lambda c, x, y: jax_ext.where3(c, x, y))
    with pytest.raises(ValueError, match="same shape"):
        f.lower(np.ones(2, bool), np.ones((2, 3)), np.ones((2, 2)))


def test_implementation_name_validated():
    with pytest.raises(ValueError, match="one of"):
        jax_ext.implementation("gpu")


# --- derivatives ------------------------------------------------------------------------

GRAD_CASES = [((2, 1), (2, 3), (1, 3)), ((), (4,), (4,)), ((3, 1, 2), (2,), (4, 1, 1, 1)),
              ((5,), (5,), ())]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shapes", GRAD_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_check_grads_order_2(shapes, dtype, impl):
    rng = np.random.default_rng(0)
    cs, xs, ys = shapes
    c = rng.integers(0, 2, cs).astype(bool)
    x = rng.standard_normal(xs).astype(dtype)
    y = rng.standard_normal(ys).astype(dtype)
    with jax_ext.implementation(impl):
        check_grads(lambda x, y: jax_ext.where(c, x, y) * 1.5, (x, y), order=2,
                    modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shapes", GRAD_CASES)
def test_grad_matches_jnp_where(shapes):
    rng = np.random.default_rng(3)
    cs, xs, ys = shapes
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = rng.standard_normal(xs), rng.standard_normal(ys)
    w = rng.standard_normal(np.broadcast_shapes(cs, xs, ys))

    def loss(fn):
        return lambda x, y: jnp.sum(fn(c, x, y) * w)

    got = jax.grad(loss(jax_ext.where), argnums=(0, 1))(x, y)
    want = jax.grad(loss(jnp.where), argnums=(0, 1))(x, y)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-12)
    gg = jax.hessian(lambda x: jnp.sum(jax_ext.where(c, x, y) ** 3))(x)
    gr = jax.hessian(lambda x: jnp.sum(jnp.where(c, x, y) ** 3))(x)
    np.testing.assert_allclose(gg, gr, rtol=1e-10)


def test_condition_gets_float0_and_integers_do_not_differentiate():
    c = np.array([True, False])
    x = np.array([1.0, 2.0])
    gc = jax.grad(lambda c, x: jax_ext.where(c, x, 0.0).sum(), argnums=0, allow_int=True)(c, x)
    assert gc.dtype == jax.dtypes.float0
    _, t = jax.jvp(lambda x: jax_ext.where(c, x, 3.0), (x,), (np.ones(2),))
    np.testing.assert_array_equal(t, [1.0, 0.0])


@pytest.mark.gpu
def test_linear_transpose_vjp_checkpoint_scan_cond():
    c = np.array([[True], [False]])
    x = jnp.arange(6.0).reshape(2, 3)
    y = jnp.full((1, 3), 7.0)
    ct = jnp.ones((2, 3))
    tx, = jax.linear_transpose(lambda x: jax_ext.where(c, x, 0.0), x)(ct)
    np.testing.assert_array_equal(tx, [[1, 1, 1], [0, 0, 0]])
    ty, = jax.linear_transpose(lambda y: jax_ext.where(c, 0.0, y), y)(ct)
    np.testing.assert_array_equal(ty, [[1, 1, 1]])
    out, vjp = jax.vjp(lambda x, y: jax_ext.where(c, x, y), x, y)
    gx, gy = vjp(ct)
    np.testing.assert_array_equal(gy, [[1, 1, 1]])
    g = jax.grad(jax.checkpoint(lambda x: jax_ext.where(c, x, y).sum()))(x)
    np.testing.assert_array_equal(g, [[1, 1, 1], [0, 0, 0]])

    def body(carry, ci):
        return jax_ext.where(ci, carry * 2.0, carry), carry.sum()

    cs = np.array([True, False, True])
    f = lambda x0: lax.scan(body, x0, cs)[0].sum()
    assert float(f(jnp.ones(3))) == 12.0
    np.testing.assert_array_equal(jax.grad(f)(jnp.ones(3)), [4.0, 4.0, 4.0])
    h = jax.jit(lambda p, x: lax.cond(p, lambda x: jax_ext.where(x > 2, x, -x), lambda x: x, x))
    np.testing.assert_array_equal(h(True, jnp.arange(4.0)), [0, -1, -2, 3])


# --- vmap -------------------------------------------------------------------------------

AXES = [None, 0, 1, -1]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("in_axes", list(itertools.product(AXES, repeat=3))[1:])
def test_vmap_where_matches_loop(in_axes, impl):
    rng = np.random.default_rng(7)
    B = 3
    shapes = [(2, 1), (1, 4), (2, 4)]  # per-example shapes of cond, x, y

    def batched(shape, ax):
        if ax is None:
            return shape
        s = list(shape)
        s.insert(ax if ax >= 0 else len(s) + 1 + ax, B)
        return tuple(s)

    c = rng.integers(0, 2, batched(shapes[0], in_axes[0])).astype(bool)
    x = random_values(rng, batched(shapes[1], in_axes[1]), np.float32)
    y = random_values(rng, batched(shapes[2], in_axes[2]), np.float32)
    args = (c, x, y)
    for out_axes in (0, 1):
        with jax_ext.implementation(impl):
            got = jax.vmap(jax_ext.where, in_axes=in_axes, out_axes=out_axes)(*args)
        per = [np.asarray(jax_ext.where(*[np.take(a, b, axis=ax) if ax is not None else a
                                          for a, ax in zip(args, in_axes)])) for b in range(B)]
        assert_bits_equal(got, np.stack(per, axis=out_axes))


def test_vmap_is_one_native_call_without_broadcast():
    c = np.ones((5, 3, 1), bool)
    x = np.ones((3, 5, 4), np.float32)
    y = np.ones((4,), np.float32)
    f = jax.vmap(jax_ext.where, in_axes=(0, 1, None))
    text = hlo(f, c, x, y)
    assert text.count("stablehlo.custom_call") == 1
    for op in ("broadcast", "transpose", "while", "concatenate", "stablehlo.select"):
        assert op not in text, op
    nested = jax.vmap(jax.vmap(jax_ext.where, in_axes=(0, None, 0)), in_axes=(None, 0, 1))
    cn, xn, yn = np.ones((2, 4), bool), np.ones((6, 4), np.float32), np.ones((2, 6, 4), np.float32)
    assert hlo(nested, cn, xn, yn).count("stablehlo.custom_call") == 1
    want = np.stack([np.stack([np.where(cn[i], xn[j], yn[i, j]) for i in range(2)])
                     for j in range(6)])
    assert_bits_equal(nested(cn, xn, yn), want)


def test_vmap_where3_per_example_row_condition():
    rng = np.random.default_rng(2)
    c = rng.integers(0, 2, (5, 3)).astype(bool)  # a row condition per example
    x = rng.standard_normal((5, 3, 4)).astype(np.float32)
    y = rng.standard_normal((5, 3, 4)).astype(np.float32)
    got = jax.vmap(jax_ext.where3)(c, x, y)
    assert_bits_equal(got, np.where(c[:, :, None], x, y))
    assert hlo(jax.vmap(jax_ext.where3), c, x, y).count("stablehlo.custom_call") == 1


@pytest.mark.gpu
def test_vmap_of_grad_and_grad_of_vmap():
    c = np.array([[True, False, True], [False, False, True]])
    x = jnp.arange(6.0).reshape(2, 3)
    g1 = jax.vmap(jax.grad(lambda c, x: jnp.sum(jax_ext.where(c, x, 0.0) ** 2), argnums=1))(c, x)
    g2 = jax.grad(lambda x: jnp.sum(jax.vmap(jax_ext.where)(c, x, jnp.zeros((2, 3))) ** 2))(x)
    np.testing.assert_array_equal(g1, np.where(c, 2 * np.asarray(x), 0))
    np.testing.assert_array_equal(g1, g2)


# --- lowering, caching, in place ----------------------------------------------------------

def test_lowering_one_custom_call_and_lax_removes_it():
    c, x = np.ones((4, 4), bool), np.ones((4, 4), np.float32)
    for fn in (jax_ext.select, jax_ext.where, jax_ext.where3):
        assert hlo(fn, c, x, x).count("stablehlo.custom_call @jax_ext_select_v2") == 1
        with jax_ext.implementation("lax"):
            text = hlo(fn, c, x, x)
        assert "custom_call" not in text and "stablehlo.select" in text


def test_implementation_switch_retraces_under_jit_cache():
    f = jax.jit(jax_ext.where)
    c, x = np.array([True, False]), np.ones(2, np.float32)
    f(c, x, x)
    with jax_ext.implementation("lax"):
        assert "custom_call" not in f.lower(c, x, x).as_text()
        f(c, x, x)
    with jax_ext.implementation("native"):
        assert "custom_call" in f.lower(c, x, x).as_text()
    # A second call with the same setting is a cache hit, not a new compilation.
    n = f._cache_size()
    f(c, x, x)
    assert f._cache_size() == n


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.complex128, np.int8])
def test_donated_then_reuses_buffer(dtype):
    rng = np.random.default_rng(5)
    n = 1 << 16
    c = rng.integers(0, 2, (n // 64, 64)).astype(bool)
    c[:8] = True  # whole blocks that are all true: untouched by the kernel
    t_np = random_values(rng, (n // 64, 64), dtype)
    e_np = random_values(rng, (1, 64), dtype)
    want = np_select(c, t_np, e_np, t_np.shape)
    for impl in ("native", "lax"):
        with jax_ext.implementation(impl):
            f = jax.jit(lambda c, t, e: jax_ext.select(c, t, e), donate_argnums=1)
            t = jnp.asarray(t_np)
            ptr = t.unsafe_buffer_pointer()
            out = f(c, t, e_np)
            assert out.unsafe_buffer_pointer() == ptr, impl
            assert t.is_deleted()
            assert_bits_equal(out, want)
            compiled = f.lower(c, t_np, e_np).compile().as_text()
        assert " copy(" not in compiled
        # native: the custom call itself aliases then; lax: XLA's select updates in place
        assert ("output_to_operand_aliasing" in compiled) == (impl == "native")
        assert "input_output_alias={ {}: (1" in compiled


def test_not_donated_is_not_aliased_and_input_survives():
    c = np.array([True, False, True])
    t = jnp.array([1.0, 2.0, 3.0])
    f = jax.jit(lambda c, t, e: jax_ext.select(c, t, e))
    text = f.lower(c, t, t).compile().as_text()
    assert "output_to_operand_aliasing" not in text and " copy(" not in text
    out = f(c, t, jnp.zeros(3))
    np.testing.assert_array_equal(out, [1, 0, 3])
    np.testing.assert_array_equal(t, [1, 2, 3])


def test_donated_but_broadcast_then_is_not_aliased():
    f = jax.jit(lambda c, t, e: jax_ext.select(c, t, e), donate_argnums=1)
    c = np.array([[True, False], [False, True]])
    out = f(c, jnp.array([1.0, 2.0]), jnp.zeros((2, 2)))
    np.testing.assert_array_equal(out, [[1, 0], [0, 2]])


@pytest.mark.parametrize("cshape", [(4099, 1), (4099, 1027), (1, 1027)])
def test_large_result_unaligned_rows(cshape):
    # > 16 MiB of result (huge-page hint, threads), rows not 16-byte aligned.
    rng = np.random.default_rng(11)
    c = rng.integers(0, 2, cshape).astype(bool)
    x = random_values(rng, (4099, 1027), np.float32)
    y = random_values(rng, (1, 1027), np.float32)
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            got = jax_ext.where(c, x, y)
        assert_bits_equal(got, np_select(c, x, y, (4099, 1027)))


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.float64, np.complex128])
def test_results_of_many_mib_are_exact(dtype):
    # 17 MiB of result, threads and the huge-page hint: every width, dense / broadcast /
    # scalar / row-wise conditions, and a length that leaves a partial 4 KiB tile at the
    # end. (Streaming stores, from 64 MiB into a reused buffer: test_stores.py.)
    rng = np.random.default_rng(3)
    n = (17 << 20) // np.dtype(dtype).itemsize + 13
    m = n // 1000
    for sc, sx, sy in [((n,), (n,), (n,)), ((m, 1), (m, 1000), (1, 1000)),
                       ((), (n,), (n,)), ((m, 1000), (m, 1000), (1000,))]:
        c = rng.integers(0, 2, sc).astype(bool)
        x = rng.standard_normal(sx).astype(dtype)
        y = rng.standard_normal(sy).astype(dtype)
        with jax_ext.implementation("native"):
            got = jax.jit(jax_ext.select)(c, x, y)
        assert_bits_equal(got, np.where(c, x, y))
