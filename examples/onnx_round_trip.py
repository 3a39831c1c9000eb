"""From ONNX to JAX and back: an ONNX model with Where and Gather, its JAX twin written
with jax_ext (equal to onnxruntime's run of the original), one fine-tuning step in JAX, and
the fine-tuned twin exported back with jax2onnx and run in onnxruntime with JAX's outputs.
Needs the onnx extra: pip install "jax_ext[onnx]"."""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
import onnx
import onnxruntime as ort
from jax2onnx import to_onnx
from onnx import TensorProto, helper, numpy_helper

import jax_ext
import jax_ext.onnx  # noqa: F401  (teaches jax2onnx jax_ext's primitives)

VOCAB, DIM, SEQ = 10, 4, 6
rng = np.random.default_rng(0)
table = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
ids = np.array([0, 3, 3, 9, 1, 7], np.int32)
mask = np.array([[True], [True], [False], [True], [True], [False]])
target = rng.standard_normal((SEQ, DIM)).astype(np.float32)


def original_model() -> onnx.ModelProto:
    """out = Where(mask, Gather(table, ids), 0): an embedding lookup with masked rows."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Where", ["mask", "rows", "zero"], ["out"])]
    graph = helper.make_graph(
        nodes, "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [SEQ]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [SEQ, 1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [SEQ, DIM])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def twin(table: ArrayLike, ids: ArrayLike, mask: ArrayLike) -> jax.Array:
    """The same model in JAX: ONNX's Gather (ids in range) and Where, to the letter."""
    rows = jax_ext.gather(table, [0], 0, ids, align_bytes=None)
    return jax_ext.where(mask, rows, np.float32(0.0))


def step(table: ArrayLike, ids: ArrayLike, mask: ArrayLike,
         target: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """One SGD step on the table (the gradient of gather is a scatter-add)."""
    loss = lambda t: ((twin(t, ids, mask) - jnp.asarray(target)) ** 2).mean()
    value, grad = jax.value_and_grad(loss)(table)
    return value, table - 0.5 * grad


def run(model: onnx.ModelProto, *args: Any) -> list[np.ndarray[Any, Any]]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(a) for i, a in zip(sess.get_inputs(), args)}
    return [np.asarray(o) for o in sess.run(None, feeds)]


def same_bits(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return bool(a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes())


def spec(a: np.ndarray[Any, Any]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


# 1. The original model in onnxruntime, and its JAX twin: the same bits.
(want,) = run(original_model(), ids, mask)
assert same_bits(twin(table, ids, mask), want)
print("JAX twin == onnxruntime's run of the original model:", True)

# 2. Fine-tune in JAX.
loss, tuned = jax.jit(step)(table, ids, mask, target)
print(f"loss before the step: {float(loss):.6f}")

# 3. Back to ONNX: the fine-tuned twin, with the new table as a graph input.
exported = to_onnx(twin, [spec(table), spec(ids), spec(mask)])
print("exported ops:", sorted({n.op_type for n in exported.graph.node}))
(back,) = run(exported, np.asarray(tuned), ids, mask)
assert same_bits(back, twin(tuned, ids, mask))
print("onnxruntime's run of the export == JAX, bit for bit:", True)

# The training step itself exports too (a scatter-add for the gradient). Its arithmetic
# (the mean, the products) is onnxruntime's own, so it matches JAX to float32 rounding.
exported_step = to_onnx(step, [spec(table), spec(ids), spec(mask), spec(target)])
ort_loss, ort_tuned = run(exported_step, table, ids, mask, target)
err = float(np.max(np.abs(ort_tuned - np.asarray(tuned))))
assert abs(float(ort_loss) - float(loss)) <= 1e-6 and err <= 1e-6
print(f"exported training step: loss {float(ort_loss):.6f}, table max |diff| {err:.1e}")
