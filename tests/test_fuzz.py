"""Differential fuzzing (issue 4): breadth and the invalid-input space.

Valid inputs: native == lax == auto == an independent numpy/loop reference (two of the
implementations per example, in turn), bit for bit, over
every JAX dtype, ranks 0-5 with zero-size dims, every select mode, where, where3 (scalar,
full and row conditions) and gather with wild offsets and indices (int64 past 2**31,
negative, uint64 past 2**63), num_indices, pad_value, align_bytes, check_bounds, static
and traced. Invalid inputs: random shapes and arguments with ONE defect each, checked
against a model of SPEC.md that predicts the exact exception class (TypeError,
ValueError or NotImplementedError) or, when the input turns out valid, the result shape.

test_select.py / test_gather.py hold the targeted tests; this file is about coverage.
Examples per test are fixed below (>= 1,000 in all under the "ci" profile); the "long"
profile multiplies them (HYPOTHESIS_PROFILE=long).
"""
import functools
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax_ext
from references import (ALL_DTYPES, IMPL_PAIRS, assert_bits_equal, np_select, random_values,
                     special_values)
from references import ref_gather, row_len

SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 1


def n_examples(n):
    return settings(max_examples=n * SCALE)


INDEX_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                np.uint64]
I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1

dims = st.integers(0, 3)
shapes = st.lists(dims, min_size=0, max_size=5).map(tuple)
dtypes = st.sampled_from(ALL_DTYPES)
seeds = st.integers(0, 2 ** 32 - 1)


def values(rng, shape, dtype):
    v = random_values(rng, shape, dtype)
    sp = special_values(dtype, v.size)
    if sp is not None and v.size:
        v.reshape(-1)[::2] = sp[::2]  # -0.0, inf, NaN payloads, signalling NaNs
    return v


def native_lax(fn, *args, **kw):
    """fn under the next pair of implementations, jitted (cached per implementation); they
    must agree bit for bit."""
    outs = []
    for impl in next(IMPL_PAIRS):  # two compilations an example, as before auto
        with jax_ext.implementation(impl):
            outs.append(np.asarray(fn(*args, **kw)))
    for o in outs[1:]:
        assert_bits_equal(outs[0], o)
    return outs[0]


@functools.lru_cache(maxsize=None)
def jitted(name, **static):
    fns = {"where": jax_ext.where, "where3": jax_ext.where3,
           "select": lambda c, x, y: jax_ext.select(c, x, y, **static)}
    return jax.jit(fns[name])


# --- a model of SPEC.md for the selects ------------------------------------------------

def np_broadcast(*shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def model_select(cs, xs, ys, mode):
    """Result shape, or the exception class SPEC.md names."""
    if mode not in ("numpy", "none"):
        return ValueError
    if mode == "none":
        return xs if cs == xs == ys else ValueError
    s = np_broadcast(xs, ys)
    if s is None or len(cs) > len(s):
        return ValueError
    if any(c not in (1, d) for c, d in zip(cs[::-1], s[::-1])):
        return ValueError
    return s


def model_where(cs, xs, ys):
    s = np_broadcast(cs, xs, ys)
    return ValueError if s is None else s


def model_where3(cs, xs, ys):
    if xs != ys:
        return ValueError
    if cs == xs or cs == () or (len(xs) >= 2 and cs == xs[:1]):
        return xs
    return ValueError


# --- valid selects: native == lax == numpy ---------------------------------------------

@st.composite
def broadcastable(draw, k):
    """k shapes that broadcast together (numpy rules), ranks 0-5, zero-size dims."""
    full = draw(shapes)
    out = []
    for _ in range(k):
        r = draw(st.integers(0, len(full)))
        out.append(tuple(1 if draw(st.booleans()) else d for d in full[len(full) - r:]))
    return out


@n_examples(200)
@given(broadcastable(3), dtypes, seeds)
def test_fuzz_where_valid(shp, dtype, seed):
    cs, xs, ys = shp
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = values(rng, xs, dtype), values(rng, ys, dtype)
    got = native_lax(jitted("where"), c, x, y)
    assert_bits_equal(got, np_select(c, x, y, model_where(cs, xs, ys)))


@n_examples(200)
@given(broadcastable(3), dtypes, st.sampled_from(["numpy", "none"]), seeds)
def test_fuzz_select_valid(shp, dtype, mode, seed):
    cs, xs, ys = shp
    if mode == "none":
        xs = ys = cs = np.broadcast_shapes(cs, xs, ys)
    s = np.broadcast_shapes(xs, ys)
    cs = cs[max(0, len(cs) - len(s)):]  # one-way: cond may not enlarge S
    cs = tuple(c if c == d else 1 for c, d in zip(cs, s[len(s) - len(cs):]))
    assert model_select(cs, xs, ys, mode) == s
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = values(rng, xs, dtype), values(rng, ys, dtype)
    got = native_lax(jitted("select", auto_broadcast=mode), c, x, y)
    assert_bits_equal(got, np_select(c, x, y, s))


@n_examples(100)
@given(shapes, dtypes, st.sampled_from(["scalar", "full", "row"]), seeds)
def test_fuzz_where3_valid(xs, dtype, mode, seed):
    if mode == "row" and len(xs) < 2:
        mode = "scalar"
    cs = {"scalar": (), "full": xs, "row": xs[:1]}[mode]
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, cs).astype(bool)
    x, y = values(rng, xs, dtype), values(rng, xs, dtype)
    cref = c.reshape(cs + (1,) * (len(xs) - len(cs))) if mode == "row" else c
    got = native_lax(jitted("where3"), c, x, y)
    assert_bits_equal(got, np_select(cref, x, y, xs))


# --- the select family's invalid space ---------------------------------------------------

NON_BOOL = [np.int8, np.uint8, np.int32, np.float32, ml_dtypes.bfloat16, np.complex64]
NON_ARRAYS = ["abc", None, object(), ["a", "b"], {"x": 1}, b"\x00"]


@n_examples(300)
@given(st.sampled_from(["select", "where", "where3"]),
       st.sampled_from(["shapes", "cond_dtype", "value_dtypes", "mode", "non_array",
                        "py_cond"]),
       shapes, shapes, shapes, dtypes, dtypes, st.sampled_from(NON_BOOL),
       st.sampled_from(["numpy", "none", "NUMPY", "pdpd", None, 1]),
       st.integers(0, 2), st.sampled_from(range(len(NON_ARRAYS))))
def test_fuzz_select_family_invalid(fn, defect, cs, xs, ys, xdt, ydt, cdt, mode, which, bad):
    """One defect per example; its class must be exactly the one SPEC.md names."""
    cdtype = np.bool_
    if defect != "shapes":
        cs = xs = ys  # shapes are fine: only the drawn defect is wrong
    if defect == "cond_dtype":
        cdtype = cdt
    if defect == "value_dtypes":
        if xdt == ydt:
            xdt, ydt = np.float32, np.int32
    else:
        ydt = xdt
    if defect != "mode":
        mode = mode if mode in ("numpy", "none") else "numpy"
    args = [np.zeros(cs, cdtype), np.zeros(xs, xdt), np.zeros(ys, ydt)]
    if defect == "non_array":
        args[which] = NON_ARRAYS[bad]
        want = TypeError
    elif defect == "py_cond":
        args[0] = [1, 0.5, 2 + 1j][which]
        want = TypeError
    elif defect in ("cond_dtype", "value_dtypes"):
        want = TypeError
    elif fn == "select":
        want = model_select(cs, xs, ys, mode)
    elif fn == "where":
        want = model_where(cs, xs, ys)
    else:
        want = model_where3(cs, xs, ys)
    if fn == "select" and defect == "mode" and mode not in ("numpy", "none"):
        want = ValueError if isinstance(mode, str) else TypeError  # None, 1: not a string
    call = {"select": lambda c, x, y: jax_ext.select(c, x, y, auto_broadcast=mode),
            "where": jax_ext.where, "where3": jax_ext.where3}[fn]
    if isinstance(want, type):
        with pytest.raises(Exception) as e:
            jax.eval_shape(call, *args) if defect != "non_array" else call(*args)
        assert type(e.value) is want, f"{fn}: {type(e.value).__name__}: {e.value}"
        assert fn in str(e.value), e.value  # the message names the function
    else:
        out = jax.eval_shape(call, *args)
        assert out.shape == tuple(want) and out.dtype == np.dtype(xdt)


# --- gather: valid, native == lax == loop -------------------------------------------

@functools.lru_cache(maxsize=None)
def jitted_gather(dim, cb, ab, traced_num):
    def f(s, o, i, k, p):
        return jax_ext.gather(s, list(o), dim, i, check_bounds=cb, align_bytes=ab,
                              num_indices=k if traced_num else None, pad_value=p)
    return jax.jit(f)


def wild_ints(dtype):
    info = np.iinfo(dtype)
    edge = [info.min, info.max, info.min + 1, info.max - 1, 2 ** 31, 2 ** 31 - 1, -2 ** 31,
            -2 ** 31 - 1, 2 ** 32 + 3, 2 ** 63, -1]
    return st.one_of(st.integers(max(-3, int(info.min)), 6), st.sampled_from(
        [v for v in edge if info.min <= v <= info.max]))


@st.composite
def gather_case(draw):
    rank = draw(st.integers(2, 5))
    shape = tuple(draw(st.integers(0, 4)) for _ in range(rank))
    dim = draw(st.integers(0, rank - 2))
    dtype = draw(dtypes)
    idt = draw(st.sampled_from(INDEX_DTYPES))
    n = draw(st.integers(0, 6))
    index = np.array(draw(st.lists(wild_ints(idt), min_size=n, max_size=n)), dtype=idt)
    offs = [draw(st.one_of(st.integers(-2, 5), st.sampled_from(
        [I64_MIN, I64_MAX, 2 ** 31, -2 ** 31 - 1, 2 ** 40]))) for _ in range(dim + 1)]
    num = draw(st.one_of(st.none(), st.integers(0, n)))
    itemsize = np.dtype(dtype).itemsize
    ab = draw(st.sampled_from([None, 1, 2, 4, 8, 16, 32, 64, 128]))
    if ab is not None and ab % itemsize:
        ab = itemsize * draw(st.sampled_from([1, 3, 4]))
    return dict(shape=shape, dim=dim, dtype=dtype, index=index, offsets=offs, num=num,
                align=ab, check_bounds=draw(st.booleans()), traced=draw(st.booleans()),
                seed=draw(seeds))


@n_examples(200)
@given(gather_case())
def test_fuzz_gather_valid(c):
    rng = np.random.default_rng(c["seed"])
    src = values(rng, c["shape"], c["dtype"])
    pad = values(rng, (), c["dtype"])
    kw = dict(check_bounds=c["check_bounds"], num_indices=c["num"], pad_value=pad,
              align_bytes=c["align"])
    want = ref_gather(src, c["offsets"], c["dim"], c["index"], **kw)
    if c["traced"]:
        f = jitted_gather(c["dim"], c["check_bounds"], c["align"], c["num"] is not None)
        k = np.int64(c["num"] if c["num"] is not None else 0)
        got = native_lax(f, src, np.array(c["offsets"], np.int64), c["index"], k, pad)
    else:
        got = native_lax(jax_ext.gather, src, c["offsets"], c["dim"], c["index"], **kw)
    assert_bits_equal(got, want)
    L = row_len(c["shape"][-1], np.dtype(c["dtype"]).itemsize, c["align"])
    assert got.shape == (len(c["index"]),) + c["shape"][c["dim"] + 1:-1] + (L,)


# --- gather: the invalid space ----------------------------------------------------------

@n_examples(200)
@given(st.sampled_from(["dim", "offsets_len", "offsets_elem", "index_dtype", "index_rank",
                        "num", "align", "pad", "src_rank", "non_array"]),
       st.integers(0, 4), st.integers(2, 4), dtypes, st.data())
def test_fuzz_gather_invalid(defect, which, rank, dtype, data):
    shape = (3,) * rank
    src = np.zeros(shape, dtype)
    dim = data.draw(st.integers(0, rank - 2))
    offsets = [0] * (dim + 1)
    index = np.array([0, 1, 5], np.int32)
    kw = {}
    if defect == "dim":
        dim = data.draw(st.one_of(st.integers(-4, rank + 2), st.sampled_from(
            [1.0, None, True, "0", np.float32(0)])))
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            want = TypeError
        elif dim == rank - 1:
            want = NotImplementedError
        elif not 0 <= dim < rank - 1:
            want = ValueError
        else:
            want = None
        offsets = [0] * (dim + 1) if want is None else [0]
    elif defect == "offsets_len":
        offsets = [0] * data.draw(st.sampled_from([0, dim, dim + 2, dim + 5]))
        want = ValueError
    elif defect == "offsets_elem":
        bad, want = data.draw(st.sampled_from([(1.0, TypeError), (True, TypeError),
                                               ("a", TypeError), (None, TypeError),
                                               (2 ** 63, ValueError), (-2 ** 63 - 1, ValueError),
                                               (np.zeros(2, np.int32), ValueError),
                                               (np.float32(1), TypeError)]))
        offsets[which % len(offsets)] = bad
    elif defect == "index_dtype":
        index = index.astype(data.draw(st.sampled_from([np.float32, np.bool_, np.complex64,
                                                        ml_dtypes.bfloat16])))
        want = TypeError
    elif defect == "index_rank":
        index = np.zeros(data.draw(st.sampled_from([(), (2, 2), (1, 3, 1)])), np.int32)
        want = ValueError
    elif defect == "num":
        kw["num_indices"], want = data.draw(st.sampled_from(
            [(-1, ValueError), (4, ValueError), (2 ** 70, ValueError), (1.0, TypeError),
             (True, TypeError), ("1", TypeError), (np.zeros(1, np.int32), ValueError),
             (np.float32(1), TypeError)]))
    elif defect == "align":
        itemsize = np.dtype(dtype).itemsize
        kw["align_bytes"] = data.draw(st.sampled_from(
            [0, -itemsize, 32.0, "32", True, 2 ** 40] + ([itemsize + 1] if itemsize > 1 else [])
            + ([3 * itemsize // 2] if itemsize > 2 else [])))
        want = ValueError
    elif defect == "pad":
        kw["pad_value"], want = data.draw(st.sampled_from(
            [(np.zeros(2, dtype), ValueError), ([1, 2], TypeError), ("x", TypeError),
             (object(), TypeError)]))
    elif defect == "src_rank":
        src = np.zeros((3,) * (which % 2), dtype)  # 0-d: no valid dim; 1-d: dim 0 is last
        dim, offsets = 0, [0]
        want = ValueError if src.ndim == 0 else NotImplementedError
    else:
        bad = NON_ARRAYS[which % len(NON_ARRAYS)]
        if which % 2:
            src = bad
        else:
            index = bad
        want = TypeError
    if want is None:
        out = jax.eval_shape(lambda s, i: jax_ext.gather(s, offsets, dim, i, **kw), src, index)
        assert out.shape[0] == 3
        return
    with pytest.raises(Exception) as e:
        jax_ext.gather(src, offsets, dim, index, **kw)
    assert type(e.value) is want, f"{defect}: {type(e.value).__name__}: {e.value}"
    assert str(e.value).startswith("gather:"), e.value


def test_fuzz_implementation_names():
    for bad in ("LAX", "Native", "", None, 3, ["lax"], b"lax"):
        with pytest.raises(ValueError, match="implementation"):
            jax_ext.implementation(bad)
    for good in ("auto", "native", "lax"):
        with jax_ext.implementation(good):
            pass
