"""Every example in the seed documents (ONNX Where-16, OpenVINO Select-1, TF Where3,
oneDNN Graph Select), under both implementations."""
import importlib.util
import os
import pathlib

import jax
import numpy as np
import pytest

import jax_ext
from references import IMPLS, assert_bits_equal

T, F = True, False


def test_native_module_loaded():
    # CI must exercise the C++ handlers, not silently fall back to lax.
    if os.environ.get("JAX_EXT_EXPECT_NATIVE", "1") == "1":
        assert jax_ext.native_available()


def _onnx_examples():
    """The ONNX seed's examples, transcribed once, in examples/onnx_where.py."""
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "onnx_where.py"
    spec = importlib.util.spec_from_file_location("onnx_where_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the table; the checks run only as a script
    return module.EXAMPLES


ONNX = _onnx_examples()  # name: (condition, x, y, dtype, expected)


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
