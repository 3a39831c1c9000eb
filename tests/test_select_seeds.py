"""Every example in the seed documents (ONNX Where-16, OpenVINO Select-1, TF Where3,
oneDNN Graph Select), under both implementations."""
import os

import jax
import numpy as np
import pytest

import jax_ext
from helpers import IMPLS, assert_bits_equal

T, F = True, False


def test_native_module_loaded():
    # CI must exercise the C++ handlers, not silently fall back to lax.
    if os.environ.get("JAX_EXT_EXPECT_NATIVE", "1") == "1":
        assert jax_ext.native_available()


ONNX = {  # name: (condition, x, y, dtype, expected)
    "cc_where_bool": ([[T, F], [T, F]], [[T, T], [F, F]], [[F, F], [T, T]], np.bool_,
                      [[T, F], [F, T]]),
    "cc_where_double": ([[T, F], [T, F]], [[1., 2.], [3., 4.]], [[5., 6.], [7., 8.]],
                        np.float64, [[1., 6.], [3., 8.]]),
    "cc_where_int16": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[-5, -6], [-7, -8]], np.int16,
                       [[1, -6], [3, -8]]),
    "cc_where_int8": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[-5, -6], [-7, -8]], np.int8,
                      [[1, -6], [3, -8]]),
    "cc_where_nan_inf": ([T, F, T, F, T, F], [np.nan, 1., np.inf, 2., -np.inf, 3.],
                         [0., np.nan, 0., np.inf, 0., -np.inf], np.float32,
                         [np.nan, np.nan, np.inf, np.inf, -np.inf, -np.inf]),
    "cc_where_nan_inf_bcast": ([[T], [F]], [[np.inf, 1., np.inf], [2., np.inf, 3.]],
                               [[-np.inf, np.nan, 0.]], np.float32,
                               [[np.inf, 1., np.inf], [-np.inf, np.nan, 0.]]),
    "cc_where_uint16": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint16,
                        [[1, 6], [3, 8]]),
    "cc_where_uint32": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint32,
                        [[1, 6], [3, 8]]),
    "cc_where_uint64": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint64,
                        [[1, 6], [3, 8]]),
    "cc_where_uint8": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint8,
                       [[1, 6], [3, 8]]),
    "where_bcast": ([[T], [F]], [[1, 2, 3], [4, 5, 6]], [[10, 20, 30]], np.int32,
                    [[1, 2, 3], [10, 20, 30]]),
    "where_example": ([[T, F], [T, F]], [[1., 2.], [3., 4.]], [[5., 6.], [7., 8.]],
                      np.float32, [[1., 6.], [3., 8.]]),
    "where_long_example": ([[T, F], [T, T]], [[1, 2], [3, 4]], [[9, 8], [7, 6]], np.int64,
                           [[1, 8], [3, 4]]),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(ONNX))
@pytest.mark.parametrize("jit", [False, True])
def test_onnx_where_examples(name, impl, jit):
    c, x, y, dt, want = ONNX[name]
    c, x, y = np.array(c), np.array(x, dt), np.array(y, dt)
    fn = jax.jit(jax_ext.where) if jit else jax_ext.where
    with jax_ext.implementation(impl):
        got = fn(c, x, y)
    assert got.dtype == dt
    assert_bits_equal(got, np.array(want, dt))


@pytest.mark.parametrize("impl", IMPLS)
def test_openvino_select_example(impl):
    c = np.array([[F, F], [T, F], [T, T]])
    t = np.array([[-1, 0], [1, 2], [3, 4]], np.int32)
    e = np.array([[11, 10], [9, 8], [7, 6]], np.int32)
    with jax_ext.implementation(impl):
        for mode in ("numpy", "none"):
            got = jax_ext.select(c, t, e, auto_broadcast=mode)
            assert_bits_equal(got, np.array([[11, 10], [1, 8], [3, 4]], np.int32))


@pytest.mark.parametrize("impl", IMPLS)
def test_tensorflow_where3_examples(impl):
    t = np.array([[1, 2], [3, 4]], np.int32)
    e = np.array([[5, 6], [7, 8]], np.int32)
    with jax_ext.implementation(impl):
        got = jax_ext.where3(np.array([[T, F], [F, T]]), t, e)
        assert_bits_equal(got, np.array([[1, 6], [7, 4]], np.int32))
        got = jax_ext.where3(np.array([T, F]), t, e)
        assert_bits_equal(got, np.array([[1, 2], [7, 8]], np.int32))


@pytest.mark.parametrize("cond_shape,ok", [((4, 5), True), ((3, 1, 5), True),
                                           ((3, 5), False), ((2, 2, 3, 4, 5), False),
                                           ((), True), ((2, 3, 4, 5), True), ((1, 1, 1, 1), True)])
def test_onednn_one_way_broadcast_shapes(cond_shape, ok):
    rng = np.random.default_rng(0)
    src0 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    src1 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    cond = rng.integers(0, 2, cond_shape).astype(bool)
    if not ok:
        with pytest.raises(ValueError, match=r"cond \(.*\) cannot be broadcast one-way"):
            jax_ext.select(cond, src0, src1)
        return
    got = jax_ext.select(cond, src0, src1)
    assert got.shape == (2, 3, 4, 5)
    assert_bits_equal(got, np.where(np.broadcast_to(cond, src0.shape), src0, src1))
