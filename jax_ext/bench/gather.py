"""Benchmark cases for gather (same table, JSON and plot as the rest).

Each case: ``make()`` returns (ours, reference, args), both already ``jax.jit``-ed and
taking ``*args``; ``bytes`` counts the bytes read and written (index included), for GB/s.

* gather of random rows, about 1% of the indices past the end (so both sides pad them
  with 0), against ``jnp.take(src, index, axis=0, mode="fill", fill_value=0)``. The f32
  rows used (128, 64, 16, 8 elements) are multiples of 32 bytes, so the default
  ``align_bytes=32`` adds no columns and both results have one shape and equal bits.
  The index counts are those of the shapes users reported (a quarter of the rows, or all).
* the gradient with respect to src of ``sum(gather(src) * ct)`` and of the loss
  ``sum(gather(src) ** 2)`` against the same for ``jnp.take`` (XLA's scatter-add): src
  65536x128 with 65536 indices.

Row gathers also carry ``onnx`` (onnxruntime's CPU ``Gather`` on the same numpy data,
when onnxruntime and onnx are installed; it rejects indices past the end, so it gets them
clipped: the same bytes moved, compared on the in-range rows) and ``copy_bytes`` (the
result's size, for the numpy copy bandwidth measured alongside).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from .._gather import gather
from .records import Case, Host, Made, Ort
from .kinds import SINGLE


def _index(rng: np.random.Generator, rows: int, n: int) -> npt.NDArray[np.int32]:
    idx = rng.integers(0, rows, n).astype(np.int32)
    past = rng.choice(n, max(1, n // 100), replace=False)
    idx[past] = rows + rng.integers(0, 8, past.size)  # a few past the end: padded rows
    return idx


def _src_index(seed: int, rows: int, cols: int,
               n: int) -> tuple[np.random.Generator, jax.Array, jax.Array]:
    """(rng, src, index): random f32 rows and an index with a few past the end."""
    rng = np.random.default_rng(seed)
    src = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
    return rng, src, jnp.asarray(_index(rng, rows, n))


def _gather_case(rows: int, cols: int, n: int, seed: int = 0) -> Case:
    item = 4

    def make() -> Made:
        _, src, idx = _src_index(seed, rows, cols, n)
        ours = jax.jit(lambda s, i: gather(s, [0], 0, i))
        ref = jax.jit(lambda s, i: jnp.take(s, i, axis=0, mode="fill", fill_value=0))
        return ours, ref, (src, idx)

    return Case(name=f"gather f32 {rows}x{cols} n={n}", op="gather", dtype="float32",
                elements=n * cols, bytes=2 * n * cols * item + 4 * n, make=make, chain=False,
                onnx=_onnx_gather, copy_bytes=n * cols * item, kind=SINGLE)


def _onnx_gather(host: Host) -> Ort | None:
    """onnxruntime's CPU Gather over the same numpy arrays, or None when not installed."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    src, idx = host
    rows, cols = src.shape
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Gather", ["src", "index"], ["out"], axis=0)], "gather",
        [vi("src", TensorProto.FLOAT, [rows, cols]), vi("index", TensorProto.INT32, [idx.size])],
        [vi("out", TensorProto.FLOAT, [idx.size, cols])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 10)
    # Its worker threads do not spin after a run: they would keep both cores of a small
    # machine busy through the next call, whichever side made it, while spinning saves
    # onnxruntime's own calls little (docs/performance.md, "onnxruntime's spinning
    # threads").
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    inside = idx < rows
    clipped = np.where(inside, idx, rows - 1).astype(np.int32)

    def run(s: npt.NDArray[Any], i: npt.NDArray[np.int32]) -> Any:
        return sess.run(None, {"src": s, "index": i})[0]

    def check(ours: npt.NDArray[Any], theirs: npt.NDArray[Any]) -> bool:
        return np.array_equal(ours[inside].view(np.uint32), theirs[inside].view(np.uint32))

    return run, (src, clipped), check


def _loss_grad_case(rows: int, cols: int, n: int, seed: int = 2) -> Case:
    """The gradient of a loss through gather, written the way a user writes it."""
    def make() -> Made:
        _, src, idx = _src_index(seed, rows, cols, n)
        ours = jax.jit(jax.grad(lambda s, i: jnp.sum(gather(s, [0], 0, i) ** 2)))
        ref = jax.jit(jax.grad(lambda s, i: jnp.sum(
            jnp.take(s, i, axis=0, mode="fill", fill_value=0) ** 2)))
        return ours, ref, (src, idx)

    return Case(name=f"gather loss grad sum(g**2) f32 {rows}x{cols} n={n}", op="gather_grad",
                dtype="float32", elements=rows * cols,
                bytes=3 * n * cols * 4 + 4 * n + 2 * rows * cols * 4, make=make, chain=False,
                kind=SINGLE)


def _grad_case(rows: int, cols: int, n: int, seed: int = 1) -> Case:
    item = 4

    def make() -> Made:
        rng, src, idx = _src_index(seed, rows, cols, n)
        ct = jnp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
        ours = jax.jit(jax.grad(lambda s, i, c: jnp.sum(gather(s, [0], 0, i) * c)))
        ref = jax.jit(jax.grad(lambda s, i, c: jnp.sum(
            jnp.take(s, i, axis=0, mode="fill", fill_value=0) * c)))
        return ours, ref, (src, idx, ct)

    # reads the cotangent rows, writes (zeroes, then adds into) the src-shaped result
    return Case(name=f"gather grad f32 {rows}x{cols} n={n}", op="gather_grad", dtype="float32",
                elements=rows * cols, bytes=n * cols * item + 4 * n + 2 * rows * cols * item,
                make=make, chain=False, kind=SINGLE)


def cases(quick: bool, full: bool = True) -> list[Case]:
    """Every gather case (`full`), or the default run's selection: rows of 64 values and of
    8, and the gradient."""
    if quick:
        shapes = [(65536, 128, 16384), (16384, 64, 4096), (262144, 16, 65536), (4096, 8, 4096)]
        grad = (16384, 128, 16384)
    else:
        shapes = [(262144, 128, 65536), (65536, 64, 16384), (1048576, 16, 262144),
                  (4096, 8, 4096)]
        grad = (65536, 128, 65536)
    if not full:
        shapes = [shapes[1], shapes[3]]
    out = [_gather_case(r, c, n) for r, c, n in shapes]
    out.append(_grad_case(*grad))
    if full:
        out.append(_loss_grad_case(*grad))
    return out
