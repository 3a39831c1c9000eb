"""Inputs as a JAX user passes them: Python scalars by jnp's weak-type rules, non-arrays
refused by name, index widths, static flags, donation. Each row is checked on every
implementation, eagerly and under jit, with x64 off (as users run) and on (as the suite
runs), against jnp.where / jnp.take in the same process."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from references import assert_bits_equal

IMPLS = ["native", "lax", "auto"]
C = np.array([True, False, True])


@pytest.fixture(params=[False, True], ids=["x64off", "x64on"])
def x64(request):
    with jax.enable_x64(request.param):
        yield request.param


def _like_jnp(got, want):
    assert (got.dtype, jax.typeof(got).weak_type) == (want.dtype, jax.typeof(want).weak_type)
    assert_bits_equal(got, want)


# --- Python scalars: jnp.where's weak-type rules ----------------------------------------

# (x, y) pairs of the table and their neighbours: same kind takes the array's
# dtype, across kinds promotes (weakly where jnp does), two weak operands stay weak.
PAIRS = {
    "int32+0.5": (np.array([0, 1, 2], np.int32), 0.5),
    "int32+2.9": (np.array([0, 1, 2], np.int32), 2.9),
    "int8+3": (np.array([0, 1, 2], np.int8), 3),
    "2+bool": (2, np.array([True, False, True])),
    "1+2.0": (1, 2.0),
    "True+int8": (True, np.array([5, 6, 7], np.int8)),
    "float16+1j": (np.array([1, 2, 3], np.float16), 1j),
    "int8+1j": (np.array([1, 2, 3], np.int8), 1j),
    "bf16+-0.0": (jnp.array([1, 2, 3], jnp.bfloat16), -0.0),
}


# x64 on (weak types are 64-bit then) for the pairs where the width shows.
CASES = [(p, False) for p in PAIRS] + [(p, True) for p in ("int32+0.5", "2+bool", "1+2.0")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("pair,on", CASES, ids=[f"{p}-x64{'on' if o else 'off'}" for p, o in CASES])
def test_python_scalars_promote_as_jnp_where(pair, on, impl):
    with jax.enable_x64(on):
        _promote_as_jnp_where(pair, impl)


def _promote_as_jnp_where(pair, impl):
    x, y = PAIRS[pair]
    want = jnp.where(C, x, y)
    want_jit = jax.jit(jnp.where)(C, x, y)  # Python scalars become weak tracers
    cs = C if max(np.ndim(x), np.ndim(y)) else True  # select's cond never enlarges
    with jax_ext.implementation(impl):
        _like_jnp(jax_ext.where(C, x, y), want)
        _like_jnp(jax_ext.select(cs, y, x), jnp.where(cs, y, x))
        if isinstance(x, bool):
            # A Python bool is not weak in JAX: passed to jit it is a bool array, and two
            # typed dtypes never promote in jax_ext (jnp.where would give int8).
            with pytest.raises(TypeError, match="where: x and y must have the same dtype.*"
                                                "make that argument static"):
                jax.jit(jax_ext.where)(C, x, y)
            # the cures the message names: a static argument, or the other operand's dtype
            _like_jnp(jax.jit(jax_ext.where, static_argnums=1)(C, x, y), want)
            _like_jnp(jax.jit(jax_ext.where)(C, np.asarray(y).dtype.type(x), y), want)
        else:
            _like_jnp(jax.jit(jax_ext.where)(C, x, y), want_jit)
            _like_jnp(jax.jit(lambda c, a: jax_ext.select(c, a, y))(cs, x), jnp.where(cs, x, y))
        # where3 wants one shape: a scalar condition over 0-d operands
        x0, y0 = (v if np.ndim(v) == 0 else np.asarray(v)[1] for v in (x, y))
        _like_jnp(jax_ext.where3(True, x0, y0), jnp.where(True, x0, y0))


def test_two_weak_operands_stay_weak_under_jit():
    for impl in IMPLS:
        with jax_ext.implementation(impl):
            assert jax.jit(jax_ext.where)(C, 1, 2.0).weak_type
            assert jax.jit(jax_ext.where3)(True, 1, 2.0).weak_type
            assert not jax.jit(jax_ext.where)(C, np.ones(3, np.float32), 2.0).weak_type


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_python_int(impl, x64):
    i8 = np.array([0, 1, 2], np.int8)
    with jax_ext.implementation(impl):
        # Known while tracing (eagerly, or closed over): a ValueError naming it.
        with pytest.raises(ValueError, match=r"where: y=300 does not fit in int8 "
                                             r"\(range \[-128, 127\]\)"):
            jax_ext.where(C, i8, 300)
        with pytest.raises(ValueError, match=r"select: then=-1 does not fit in uint32"):
            jax.jit(lambda c, e: jax_ext.select(c, -1, e))(C, np.ones(3, np.uint32))
        with pytest.raises(ValueError, match="does not fit in int4"):  # jnp wraps this one
            jax_ext.where(C, jnp.array([1, 2, 3], jnp.int4), 30)
        with pytest.raises(ValueError, match="does not fit in float16"):
            jax_ext.where(C, np.ones(3, np.float16), 70000)
        # Passed to jit, 300 is a weak int tracer: it converts as in jnp.where (wraps).
        got = jax.jit(jax_ext.where)(C, i8, 300)
        _like_jnp(got, jax.jit(jnp.where)(C, i8, 300))
        assert np.asarray(got).tolist() == [0, 44, 2]


def test_two_typed_arrays_of_different_dtypes_still_raise():
    with pytest.raises(TypeError, match=r"where: x and y must have the same dtype, got x: "
                                        r"int32\(3,\) and y: float32\(\)"):
        jax_ext.where(C, np.arange(3, dtype=np.int32), np.float32(0.5))
    with pytest.raises(TypeError, match="select: then and else_ must have the same dtype"):
        jax.jit(jax_ext.select)(C, np.ones(3, np.int8), np.ones(3, np.int16))


# --- gather's pad_value against src ---------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_pad_value_follows_the_rule_against_src(impl, x64):
    src = np.arange(12, dtype=np.int32).reshape(4, 3)
    fsrc = src.astype(np.float16)
    idx = np.array([1, 9], np.int32)

    def g(s, p, **kw):
        return jax_ext.gather(s, [0], 0, idx, pad_value=p, align_bytes=None, **kw)
    with jax_ext.implementation(impl):
        for s, p in [(src, 7), (src, True), (fsrc, -2), (fsrc, float("nan"))]:
            want = jnp.take(jnp.asarray(s), idx, axis=0, mode="fill", fill_value=p)
            for got in (g(s, p), jax.jit(g)(s, p)):
                assert got.dtype == s.dtype
                assert_bits_equal(got, want)
        # A weak pad that would promote src: the result keeps src's dtype, so refused.
        with pytest.raises(TypeError, match=r"gather: pad_value=0.5 \(a Python float\) would "
                                            r"promote src's dtype int32 to float"):
            g(src, 0.5)
        with pytest.raises(TypeError, match=r"gather: pad_value \(a weakly typed float.. "
                                            r"scalar.*would promote src's dtype int32"):
            jax.jit(g)(src, 0.5)
        with pytest.raises(TypeError, match="would promote src's dtype float16 to complex"):
            g(fsrc, 1j)
        with pytest.raises(TypeError, match="would promote src's dtype bool to int"):
            g(src > 3, 1)
        with pytest.raises(ValueError, match=r"gather: pad_value=300 does not fit in uint8"):
            g(src.astype(np.uint8), 300)
        # A typed pad array is cast to src's dtype, as astype (the contract's rule).
        assert np.asarray(g(src, np.float32(2.5)))[1].tolist() == [2, 2, 2]


# --- only arrays and scalars ----------------------------------------------------------

class _HasDtype:
    dtype = np.dtype(np.float32)
    shape = (3,)


class _JaxArrayLike:
    def __init__(self, a):
        self.a = a

    def __jax_array__(self):
        return jnp.asarray(self.a)


NOT_ARRAYS = {"ShapeDtypeStruct": jax.ShapeDtypeStruct((3,), np.float32), "dict": {},
              "object": object(), "has_dtype": _HasDtype(), "list": [1.0, 2.0, 3.0],
              "None": None, "str": "abc"}
SELECT_ARGS = {"select": ("cond", "then", "else_"), "where": ("condition", "x", "y"),
               "where3": ("condition", "x", "y")}


@pytest.mark.parametrize("bad", NOT_ARRAYS, ids=list(NOT_ARRAYS))
@pytest.mark.parametrize("fn", SELECT_ARGS)
def test_selects_refuse_non_arrays(fn, bad):
    f = getattr(jax_ext, fn)
    ok = [C, np.ones(3, np.float32), np.zeros(3, np.float32)]
    for k, arg in enumerate(SELECT_ARGS[fn]):
        args = list(ok)
        args[k] = NOT_ARRAYS[bad]
        with pytest.raises(TypeError, match=rf"{fn}: {arg} must be an array or a scalar, got "):
            f(*args)
        with pytest.raises(TypeError, match=rf"{fn}: {arg} must be an array or a scalar"):
            jax.jit(lambda *a: f(*a[:k], NOT_ARRAYS[bad], *a[k:]))(*args[:k], *args[k + 1:])


def test_the_struct_row_and_jax_array_objects():
    with pytest.raises(TypeError, match=r"where: condition must be an array or a scalar, got "
                                        r"ShapeDtypeStruct\(3,\) bool"):
        jax_ext.where(jax.ShapeDtypeStruct((3,), bool), 1.0, 2.0)
    for impl in IMPLS:  # __jax_array__ objects are arrays, in every position
        with jax_ext.implementation(impl):
            c, x, y = _JaxArrayLike(C), _JaxArrayLike(np.ones(3, np.float32)), _JaxArrayLike(
                np.zeros(3, np.float32))
            for fn in (jax_ext.select, jax_ext.where, jax_ext.where3):
                np.testing.assert_array_equal(fn(c, x, y), [1, 0, 1])
            src = _JaxArrayLike(np.arange(6, dtype=np.float32).reshape(3, 2))
            got = jax_ext.gather(src, [_JaxArrayLike(np.int32(1))], 0,
                                 _JaxArrayLike(np.array([1, 0], np.int32)),
                                 num_indices=_JaxArrayLike(np.int32(1)),
                                 pad_value=_JaxArrayLike(np.float32(-1)), align_bytes=None)
            np.testing.assert_array_equal(got, [[4, 5], [-1, -1]])


@pytest.mark.parametrize("bad", NOT_ARRAYS, ids=list(NOT_ARRAYS))
def test_gather_refuses_non_arrays(bad):
    v = NOT_ARRAYS[bad]
    src = np.zeros((4, 3), np.float32)
    idx = np.array([0, 1], np.int32)
    calls = {"src": lambda: jax_ext.gather(v, [0], 0, idx),
             "index": lambda: jax_ext.gather(src, [0], 0, v),
             r"offsets\[0\]": lambda: jax_ext.gather(src, [v], 0, idx),
             "num_indices": lambda: jax_ext.gather(src, [0], 0, idx, num_indices=v),
             "pad_value": lambda: jax_ext.gather(src, [0], 0, idx, pad_value=v)}
    if bad != "list":  # a list of offsets is the usual form
        calls["offsets"] = lambda: jax_ext.gather(src, v, 0, idx)
    if bad == "None":  # None means "the default" for these two
        del calls["num_indices"], calls["pad_value"]
    for arg, call in calls.items():
        with pytest.raises(TypeError, match=rf"gather: {arg} must be "):
            call()


def test_auto_broadcast_of_any_type():
    x = np.ones(3, np.float32)
    for bad in (np.array(["numpy", "none"]), ["numpy"], None, 1, np.bool_(True)):
        with pytest.raises(TypeError, match=r"select: auto_broadcast must be the string "
                                            r"'numpy' or 'none', got "):
            jax_ext.select(C, x, x, auto_broadcast=bad)
    with pytest.raises(ValueError, match=r"select: auto_broadcast must be 'numpy' or 'none', "
                                         r"got 'NUMPY'"):
        jax_ext.select(C, x, x, auto_broadcast="NUMPY")
    assert jax_ext.select(C, x, x, auto_broadcast=np.str_("none")).shape == (3,)


def test_check_bounds_must_be_a_static_bool():
    src = np.arange(8, dtype=np.float32).reshape(4, 2)
    idx = np.array([1, 7], np.int32)

    def g(cb):
        return jax_ext.gather(src, [0], 0, idx, check_bounds=cb, align_bytes=None)
    with pytest.raises(TypeError, match=r"gather: check_bounds must be a static Python bool, "
                                        r"got a traced value bool\(\).*static_argnames"):
        jax.jit(g)(True)
    for bad, what in [(1, "int 1"), (None, "NoneType"), (jnp.array(True), r"a jax array"),
                      ("yes", "str")]:
        with pytest.raises(TypeError, match=rf"gather: check_bounds must be a static Python "
                                            rf"bool, got {what}"):
            g(bad)
    # numpy's bool is static too, and taken; static_argnames is the way under jit.
    np.testing.assert_array_equal(g(np.bool_(True)), [[2, 3], [0, 0]])
    np.testing.assert_array_equal(jax.jit(g, static_argnames="cb")(cb=False), [[2, 3], [6, 7]])


# --- integer index width --------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_wide_numpy_index_must_fit_the_dtype_jax_holds_it_in(impl):
    src = np.arange(8, dtype=np.float32).reshape(4, 2)
    with jax_ext.implementation(impl), jax.enable_x64(False):
        for idx in (np.array([0, 2 ** 32 + 1], np.int64), np.array([-2 ** 31 - 1], np.int64),
                    np.array([2 ** 32], np.uint64)):
            msg = (rf"gather: index \({idx.size},\) \({idx.dtype}\) holds {int(idx[-1])}, which "
                   rf"does not fit in u?int32.*enable jax_enable_x64")
            with pytest.raises(ValueError, match=msg):
                jax_ext.gather(src, [0], 0, idx)
            with pytest.raises(ValueError, match=msg):
                jax.jit(lambda s: jax_ext.gather(s, [0], 0, idx))(src)
        ok = np.array([3, -1, 2 ** 31 - 1], np.int64)  # fits: a real row and two pad rows
        np.testing.assert_array_equal(jax_ext.gather(src, [0], 0, ok, align_bytes=None),
                                      [[6, 7], [0, 0], [0, 0]])
    with jax_ext.implementation(impl), jax.enable_x64(True):  # with x64, 2**32 + 1 is a row
        got = jax_ext.gather(src, [0], 0, np.array([0, 2 ** 32 + 1], np.int64), align_bytes=None)
        np.testing.assert_array_equal(got, [[0, 1], [0, 0]])


# --- donation -------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_donated_then_is_reused_when_jax_owns_it(impl):
    # jnp.array copies into a buffer of jax's own; jax.device_put of a 64-byte-aligned
    # numpy array would share numpy's memory instead, and XLA copies such a buffer
    # before donating it (jax does not warn), so the result would be fresh.
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(2))
    c = rng.integers(0, 2, a.shape).astype(bool)
    f = jax.jit(jax_ext.select, donate_argnums=1)
    with jax_ext.implementation(impl):
        for _ in range(3):
            x = jnp.array(a)
            ptr = x.unsafe_buffer_pointer()
            out = f(c, x, b)
            assert out.unsafe_buffer_pointer() == ptr and x.is_deleted()
            assert_bits_equal(out, np.where(c, a, b))
