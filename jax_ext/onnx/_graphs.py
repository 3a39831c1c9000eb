"""The ONNX graphs of jax_ext's primitives, from standard operators only.

Each function here gets an :class:`~jax_ext.onnx._plugins.Emitter`, the equation's params
and avals, and returns the result's value. Values move bit for bit: they only ever pass
through operators that copy bytes (``Gather``, ``GatherElements``, ``Concat``, ``Expand``,
``ScatterND`` without reduction, reshapes), and every decision (which operand, in range,
before ``num_indices``, a pad row, a padding column) is integer arithmetic on indices, so
no value passes through arithmetic or a ``Where``. onnxruntime's ``Where`` rewrites bits (a
``-0.0`` taken from ``x`` comes out ``+0.0``; float16 runs through float32 casts that
rewrite NaNs) and has no kernel for bool, int16, uint16, uint64 or bfloat16; ``BitCast``
(opset 26) would keep float bits there, but OpenVINO cannot read it. So the select is a
``GatherElements`` over the two operands stacked along a new leading axis, indexed by the
condition as int32, or, where the condition picks whole rows, one ``Gather`` of rows at
integer positions: both copy bytes for every dtype, at every opset, in both runtimes, and
run faster in onnxruntime than its own ``Where``. :func:`plain_where` switches the dtypes
that have a ``Where`` kernel back to it. The gather moves rows by ``Gather`` and replaces
pad rows by one ``ScatterND``: work per row, not an index per element.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from ._plugins import Emitter, Value, onnx_type, tensor as _tensor

I64 = np.int64
Size: TypeAlias = int | Value  # a static extent, or an int64 scalar computed in the graph

# The dtypes onnxruntime has a Where kernel for (float16 through its float32 casts): the
# ones plain_where() selects with Where. The others keep the exact graph, which runs.
PLAIN_WHERE = {"int8", "uint8", "int32", "uint32", "int64", "float16", "float32", "float64"}
# What carries the condition into GatherElements (int32 indices move half of int64's bytes).
INDEX = np.int32
MIN_OPSET = 13
# A select whose condition is constant along rows of at least this many elements moves
# whole rows (one Gather at a position per row) rather than elements (GatherElements).
ROW_MIN = 16
# Dtypes the exported graphs carry: ONNX and onnxruntime both have them.
SUPPORTED = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "bfloat16", "float32", "float64"}


class Unsupported(NotImplementedError):
    """A jax_ext call the ONNX export cannot express (the message says what and why)."""


def _check_dtype(prim: str, dtype: Any) -> None:
    name = np.dtype(dtype).name
    if name not in SUPPORTED:
        raise Unsupported(f"jax_ext.onnx: {prim} of dtype {name} has no ONNX export (supported: "
                          f"{', '.join(sorted(SUPPORTED))})")


def _static(d: Any) -> bool:
    return isinstance(d, (int, np.integer))


def _is_one(d: Any) -> bool:
    return _static(d) and int(d) == 1


# --- small int64 arithmetic, folded where both sides are static -----------------------

def _c(g: Emitter, v: Any) -> Value:
    return g.const(np.asarray(v, I64))


def _lift(g: Emitter, a: Size) -> Value:
    return _c(g, a) if isinstance(a, int) else a


def _arith(g: Emitter, op: str, a: Size, b: Size) -> Size:
    unit = {"Add": 0, "Mul": 1}.get(op)
    if unit is not None and isinstance(a, int) and a == unit:
        return b
    if unit is not None and isinstance(b, int) and b == unit:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return {"Add": a + b, "Mul": a * b, "Max": max(a, b), "Min": min(a, b)}[op]
    return g.op(op, _lift(g, a), _lift(g, b))


def _extent(g: Emitter, value: Value, shape: Sequence[Any], axis: int) -> Size:
    """shape[axis] as an int, or read from `value` when it is symbolic."""
    if _static(shape[axis]):
        return int(shape[axis])
    return g.op("Reshape", g.op("Shape", value, start=axis, end=axis + 1), _c(g, []))


def _range(g: Emitter, n: Size) -> Value:
    if isinstance(n, int):
        return _c(g, np.arange(n))
    return g.op("Range", _c(g, 0), n, _c(g, 1))


def _cast(g: Emitter, v: Value, dtype: Any) -> Value:
    return g.op("Cast", v, to=onnx_type(dtype))


def _unsqueeze(g: Emitter, v: Value, axes: Sequence[int]) -> Value:
    return g.op("Unsqueeze", v, _c(g, list(axes))) if axes else v


def _tail_shape(g: Emitter, value: Value, shape: Sequence[Any], start: int) -> Value:
    """[-1, *shape[start:]] as a Reshape target, static where it can be."""
    if all(_static(d) for d in shape[start:]):
        return _c(g, [-1] + [int(d) for d in shape[start:]])
    return g.op("Concat", _c(g, [-1]), g.op("Shape", value, start=start), axis=0)


# --- the select -------------------------------------------------------------------

def _align(g: Emitter, v: Value, d: Sequence[int], rank: int) -> Value:
    """An operand whose dims lie along result dims `d`, as a rank-`rank` tensor that
    broadcasts to the result as numpy does: dims in result order, 1s where it has none."""
    order = sorted(range(len(d)), key=lambda j: d[j])
    if order != list(range(len(d))):
        v = g.op("Transpose", v, perm=order)
    return _unsqueeze(g, v, [o for o in range(rank) if o not in d])


def _like(g: Emitter, v: Value, ref: Value) -> Value:
    """v in ref's element type: jax2onnx's enable_double_precision makes float tensors
    float64 but may leave a float32 literal as it is."""
    return v if g.dtype(v) == g.dtype(ref) else _cast(g, v, g.dtype(ref))


def _covered(avals: Sequence[Any], dims: Sequence[Sequence[int]],
             out_shape: Sequence[Any]) -> bool:
    """Whether the operands' own extents make up the whole result shape (else the
    primitive broadcasts a dim no operand has, as a JVP's zero tangent does)."""
    return all(_is_one(n) or any(o2 == o and not _is_one(a.shape[j])
                                 for a, d in zip(avals, dims) for j, o2 in enumerate(d))
               for o, n in enumerate(out_shape))


_PLAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("jax_ext_onnx_plain_where",
                                                              default=False)


@contextlib.contextmanager
def plain_where() -> Iterator[None]:
    """Within the block, ``jax2onnx.to_onnx`` exports select, where and where3 of the
    dtypes onnxruntime has a ``Where`` kernel for (int8, uint8, int32, uint32, int64,
    float16, float32, float64) as one ``Where``: the runtime's own operator, with its own
    bits (onnxruntime's turns a ``-0.0`` taken from ``x`` into ``+0.0`` and float16 NaNs
    into ``0x7e00``). Outside it, and for the other dtypes, the export copies bytes."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def _aligned_shape(aval: Any, d: Sequence[int], rank: int) -> list[Any]:
    """The shape of an operand laid along result dims `d` by :func:`_align`."""
    shape: list[Any] = [1] * rank
    for j, o in enumerate(d):
        shape[o] = aval.shape[j]
    return shape


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        (int(p) == int(q)) if _static(p) and _static(q) else (not _static(p) and not
                                                             _static(q) and str(p) == str(q))
        for p, q in zip(a, b))


def _result_shape(g: Emitter, vals: Sequence[Value], shapes: Sequence[Sequence[Any]],
                  out_shape: Sequence[Any]) -> Value:
    """The result's shape as an int64 vector: constant where static, a symbolic dim read
    from an operand that spans it (jax requires it to be that operand's extent)."""
    if all(_static(n) for n in out_shape):
        return _c(g, [int(n) for n in out_shape])
    parts = []
    for o, n in enumerate(out_shape):
        if _static(n):
            parts.append(_c(g, [int(n)]))
            continue
        k = next((k for k, s in enumerate(shapes) if not _is_one(s[o])), None)
        if k is None:
            raise Unsupported("jax_ext.onnx: a select whose operands span no symbolic result "
                              f"dim {tuple(out_shape)} has no ONNX export yet")
        parts.append(g.op("Shape", vals[k], start=o, end=o + 1))
    return g.op("Concat", *parts, axis=0)


def _broadcast(g: Emitter, v: Value, shape: Sequence[Any], out_shape: Sequence[Any],
               full: Value) -> Value:
    """v (of `shape`) broadcast to `out_shape` (the int64 vector `full`) by copies:
    ``Expand``, or for bfloat16, which onnxruntime's Expand lacks, a ``Gather`` of index 0
    along each dim v lacks."""
    if _same(shape, out_shape):
        return v
    if g.dtype(v).name != "bfloat16":
        return g.op("Expand", v, full)
    for o, (a, n) in enumerate(zip(shape, out_shape)):
        if _is_one(a) and not _is_one(n):
            ext = g.op("Slice", full, _c(g, [o]), _c(g, [o + 1]))
            zeros = g.op("ConstantOfShape", ext, value=_tensor(np.zeros(1, I64)))
            v = g.op("Gather", v, zeros, axis=o)
    return v


def select(g: Emitter, params: Mapping[str, Any], avals: Sequence[Any], out: Any) -> Value:
    """jax_ext_select: each operand aligned onto the result (Transpose, Unsqueeze); then
    whole rows moved (:func:`_select_rows`) where the condition picks rows, else `x` and
    `y` broadcast to the result and stacked (`y` first) and one ``GatherElements`` at the
    condition as int32 (1 takes `x`). Under :func:`plain_where`, one ``Where``."""
    _check_dtype("select", out.dtype)
    if g.opset < MIN_OPSET:
        raise Unsupported(f"jax_ext.onnx: select needs opset {MIN_OPSET} or later (Squeeze and "
                          f"Unsqueeze take their axes as inputs), not {g.opset}")
    out_shape, dims = params["out_shape"], params["dims"]
    rank = len(out_shape)
    c, x, y = (_align(g, v, d, rank) for v, d in zip(g.inputs(), dims))
    y = _like(g, y, x)
    shapes = [_aligned_shape(a, d, rank) for a, d in zip(avals, dims)]
    if _PLAIN.get() and g.dtype(x).name in PLAIN_WHERE:
        res = g.op("Where", c, x, y)
        if not _covered(avals, dims, out_shape):
            if not all(_static(n) for n in out_shape):
                raise Unsupported("jax_ext.onnx: a select whose operands span no symbolic "
                                  f"result dim {tuple(out_shape)} has no ONNX export yet")
            res = g.op("Expand", res, _c(g, [int(n) for n in out_shape]))
        return res
    tail = _row_tail(shapes[0], out_shape)
    if tail:
        return _select_rows(g, c, x, y, shapes, [int(n) for n in out_shape], tail)
    full = _result_shape(g, [c, x, y], shapes, out_shape)
    stacked = g.op("Concat", *(_unsqueeze(g, _broadcast(g, v, s, out_shape, full), [0])
                               for v, s in ((y, shapes[2]), (x, shapes[1]))), axis=0)
    index = _unsqueeze(g, _cast(g, c, INDEX), [0])
    if not _same(shapes[0], out_shape):
        index = g.op("Expand", index, g.op("Concat", _c(g, [1]), full, axis=0))
    picked = g.op("GatherElements", stacked, index, axis=0)
    return g.op("Squeeze", picked, _c(g, [0]))


def _row_tail(c_shape: Sequence[Any], out_shape: Sequence[Any]) -> int:
    """How many trailing result dims the condition is constant along, where they make
    rows of at least ROW_MIN elements of a static result (else 0): such a select moves
    whole rows."""
    if not all(_static(n) for n in out_shape):
        return 0
    k = 0
    while k < len(out_shape) and _is_one(c_shape[len(out_shape) - 1 - k]):
        k += 1
    return k if k and math.prod(int(n) for n in out_shape[len(out_shape) - k:]) >= ROW_MIN else 0


def _select_rows(g: Emitter, c: Value, x: Value, y: Value, shapes: Sequence[Sequence[Any]],
                 out_shape: Sequence[int], tail: int) -> Value:
    """A select whose condition picks whole rows (the last `tail` dims): the rows of `x`
    and of `y` (each broadcast along the row dims only) end to end, and one ``Gather`` of
    rows at int64 positions from an integer ``Where`` over the leading dims. Rows move
    twice (``Concat``, ``Gather``); the positions are one per row."""
    lead = len(out_shape) - tail
    row = math.prod(out_shape[lead:])
    parts, starts, total = [], [], 0
    for v, s in ((x, shapes[1]), (y, shapes[2])):
        s = [int(d) for d in s]
        want = s[:lead] + list(out_shape[lead:])
        v = _broadcast(g, v, s, want, _c(g, want))
        parts.append(v if (lead, tail) == (1, 1) else g.op("Reshape", v, _c(g, [-1, row])))
        n = math.prod(s[:lead])
        starts.append(g.op("Reshape", g.op("Range", _c(g, total), _c(g, total + n), _c(g, 1)),
                           _c(g, s[:lead])))
        total += n
    cond = g.op("Reshape", c, _c(g, [int(d) for d in shapes[0][:lead]]))
    index = g.op("Where", cond, starts[0], starts[1])  # integer positions: exact
    picked = g.op("Gather", g.op("Concat", *parts, axis=0), index, axis=0)
    return picked if tail == 1 else g.op("Reshape", picked, _c(g, list(out_shape)))


# --- rows: which are real, and where they are (gather and scatter-add) ------------------

def _rows(g: Emitter, offsets: Value, index: Value, num: Value, n: Size,
          sdims: Sequence[Size], dim: int, check_bounds: bool) -> tuple[Value | bool, Value]:
    """(valid, row) for every (batch..., i), as jax_ext's kernels compute them: `row` the
    flat row of one src seen as (prod(sdims), ...), clamped into range; `valid` False for
    pad rows (out of range under check_bounds, at or after num_indices). int64 throughout;
    offsets[dim] + index[i] must not overflow it."""
    o = _cast(g, offsets, I64)
    ok: Value | bool = True
    p: Size = 0

    def off(k: int) -> Value:  # offsets[..., k], keeping a unit dim for the index axis
        return g.op("Slice", o, _c(g, [k]), _c(g, [k + 1]), _c(g, [-1]))

    for k in range(dim):
        s, ok_k = sdims[k], off(k)
        inr = _and(g, g.op("GreaterOrEqual", ok_k, _c(g, 0)), g.op("Less", ok_k, _lift(g, s)))
        ok = _and(g, ok, inr if check_bounds else _positive(g, s))
        p = _arith(g, "Add", _arith(g, "Mul", p, s), _clamp(g, ok_k, s))
    R = sdims[dim]
    r = g.op("Add", off(dim), _cast(g, index, I64))
    live = g.op("Less", _range(g, n), _unsqueeze(g, _cast(g, num, I64), [-1]))
    if check_bounds:
        inr = _and(g, g.op("GreaterOrEqual", r, _c(g, 0)), g.op("Less", r, _lift(g, R)))
        valid = _and(g, _and(g, ok, inr), live)
    else:
        valid = _and(g, _and(g, ok, live), _positive(g, R))
    row = _arith(g, "Add", _arith(g, "Mul", p, R), _clamp(g, r, R))
    assert not isinstance(row, int)
    return valid, row


def _and(g: Emitter, a: Value | bool, b: Value | bool) -> Value | bool:
    if isinstance(a, bool) or isinstance(b, bool):
        if a is False or b is False:
            return False
        return b if a is True else a
    return g.op("And", a, b)


def _positive(g: Emitter, s: Size) -> Value | bool:
    return s > 0 if isinstance(s, int) else g.op("Greater", s, _c(g, 0))


def _clamp(g: Emitter, v: Value, s: Size) -> Value:
    """v clamped into [0, s - 1] (0 when s is 0)."""
    top = max(s - 1, 0) if isinstance(s, int) else g.op("Max", g.op("Sub", s, _c(g, 1)),
                                                        _c(g, 0))
    return g.op("Min", g.op("Max", v, _c(g, 0)), _lift(g, top))


def _batch_offset(g: Emitter, bshape: Sequence[Size], full: Sequence[int], per: Size,
                  rank: int) -> Size:
    """The first flat row of each batch element of an operand that is full along the
    batch dims `full` (of extents bshape) and holds `per` rows per element, as a
    rank-`rank` tensor (0 when it is full along none)."""
    total: Size = 0
    stride = per
    for j in reversed(full):
        a = _unsqueeze(g, _range(g, bshape[j]), [k for k in range(rank) if k != j])
        total = _arith(g, "Add", total, g.op("Mul", a, _lift(g, stride)))
        stride = _arith(g, "Mul", stride, bshape[j])
    return total


# --- gather -----------------------------------------------------------------------

def gather(g: Emitter, params: Mapping[str, Any], avals: Sequence[Any], out: Any) -> Value:
    """jax_ext_gather: a Gather of the (clamped) rows from src, then a second Gather of
    every result element from those rows and the pad values, at int64 positions where a
    pad row or a padding column points at its pad value."""
    _check_dtype("gather", out.dtype)
    src, offsets, index, num, pad = g.inputs()
    pad = _like(g, pad, src)
    dim, nb, row_len = params["dim"], params["nbatch"], params["row_len"]
    check_bounds = bool(params["check_bounds"])
    sa, ia = avals[0], avals[2]
    sshape = sa.shape[nb:]
    if any(_static(d) and int(d) == 0 for d in sa.shape):
        raise Unsupported(f"jax_ext.onnx: gather from an empty src {tuple(sa.shape)} has no "
                          "ONNX export yet")
    sdims = [_extent(g, src, sa.shape, nb + k) for k in range(dim + 1)]
    n = _extent(g, index, ia.shape, nb)
    valid, row = _rows(g, offsets, index, num, n, sdims, dim, check_bounds)
    full = [j for j in range(nb) if not _is_one(sa.shape[j])]
    bext = [_extent(g, src, sa.shape, j) for j in range(nb)]
    per = math.prod(sdims) if all(isinstance(s, int) for s in sdims) else _prod(g, sdims)
    row = _arith(g, "Add", row, _batch_offset(g, bext, full, per, nb + 1))
    assert not isinstance(row, int) and not isinstance(valid, bool)  # src is not empty
    # Along the batch dims pad spans too (vmap of pad alone): the rows come out full there.
    row = g.op("Add", row, _unsqueeze(g, g.op("ConstantOfShape", g.op("Shape", pad),
                                              value=_tensor(np.zeros(1, I64))), [-1]))
    table = g.op("Reshape", src, _tail_shape(g, src, sa.shape, nb + dim + 1))
    rows = g.op("Gather", table, row, axis=0)
    # The rows' shape, read from the index and the table: a node reading `rows` would keep
    # onnxruntime from overwriting it in place (ScatterND) and cost a copy.
    shape = g.op("Concat", g.op("Shape", row), g.op("Shape", table, start=1), axis=0)
    return _pad_elements(g, rows, shape, pad, valid, nb + 1, len(sshape) - dim - 1,
                         row_len - sshape[-1])


def _prod(g: Emitter, sizes: Sequence[Size]) -> Size:
    total: Size = 1
    for s in sizes:
        total = _arith(g, "Mul", total, s)
    return total


def _size(g: Emitter, v: Value) -> Value:
    """The element count of v (onnxruntime's Size has no bfloat16 kernel)."""
    return g.op("ReduceProd", g.op("Shape", v), keepdims=0)


def _positions(g: Emitter, v: Value) -> Value:
    """Each element's flat position in v, in v's shape (int64)."""
    return g.op("Reshape", g.op("Range", _c(g, 0), _size(g, v), _c(g, 1)), g.op("Shape", v))


def _pad_elements(g: Emitter, rows: Value, shape: Value, pad: Value, valid: Value, lead: int,
                  tail: int, extra: int) -> Value:
    """Every result element from `rows` (of `shape`, (batch..., n, *mid, last): `lead` dims
    before the `tail` ones of a row) or from `pad` (one value per batch element, dims
    aligned with the batch dims), moved by copies only: the pad rows (where `valid` is
    false) overwritten by one ``ScatterND`` with their batch element's pad value (a
    ``Gather`` from `pad`), then the `extra` padding columns appended (``Concat``) as a
    ``Gather`` from `pad` too. Row-level work, so the cost follows the rows, not an index
    per element."""
    lead_shape = g.op("Slice", shape, _c(g, [0]), _c(g, [lead]))
    invalid = g.op("Not", g.op("Expand", valid, lead_shape))
    where_pad = g.op("Transpose", g.op("NonZero", invalid), perm=[1, 0])  # (K, lead)
    flat_pad = g.op("Reshape", pad, _c(g, [-1]))
    pad_pos = _positions(g, pad)
    row_pad = g.op("GatherND", g.op("Expand", _unsqueeze(g, pad_pos, [-1]), lead_shape),
                   where_pad)  # (K,): the pad value of each pad row
    if tail:
        row_pad = g.op("Expand", _unsqueeze(g, row_pad, list(range(1, tail + 1))), g.op(
            "Concat", _c(g, [1]), g.op("Slice", shape, _c(g, [lead]), _c(g, [lead + tail])),
            axis=0))
    out = g.op("ScatterND", rows, where_pad, g.op("Gather", flat_pad, row_pad, axis=0))
    if extra:
        cols = g.op("Concat", g.op("Slice", shape, _c(g, [0]), _c(g, [lead + tail - 1])),
                    _c(g, [extra]), axis=0)
        col_pad = g.op("Expand", _unsqueeze(g, pad_pos, list(range(-(tail + 1), 0))), cols)
        out = g.op("Concat", out, g.op("Gather", flat_pad, col_pad, axis=0), axis=-1)
    return out


# --- scatter-add (gather's gradient) ---------------------------------------------------

def _acc_dtype(dtype: Any) -> np.dtype[Any]:
    """float16 and bfloat16 accumulate in float32 and round once, as jax_ext's kernels."""
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if dt.name in ("float16", "bfloat16") else dt


def shard_like(g: Emitter, params: Mapping[str, Any], avals: Sequence[Any],
               out: Any) -> Value:
    """jax_ext_shard_like: its first operand (a sharding tie, which ONNX has no use for)."""
    x, _ = g.inputs()
    return g.op("Identity", x)


def scatter_add(g: Emitter, params: Mapping[str, Any], avals: Sequence[Any],
                out: Any) -> Value:
    """jax_ext_scatter_add: one ScatterND(reduction="add") of the cotangent rows (padding
    columns sliced off) into zeros with one spare row, where pad rows land and which is
    dropped after."""
    _check_dtype("scatter_add", out.dtype)
    ct, offsets, index, num = g.inputs()
    dim, nb = params["dim"], params["nbatch"]
    src_shape, out_bshape = tuple(params["src_shape"]), tuple(params["out_bshape"])
    if not all(_static(d) for d in src_shape + out_bshape):
        raise Unsupported(f"jax_ext.onnx: a scatter-add into the symbolic shape "
                          f"{out_bshape + src_shape} has no ONNX export yet")
    src_shape, out_bshape = tuple(map(int, src_shape)), tuple(map(int, out_bshape))
    if 0 in src_shape + out_bshape:
        raise Unsupported(f"jax_ext.onnx: a scatter-add into the empty shape "
                          f"{out_bshape + src_shape} has no ONNX export yet")
    dt = g.dtype(ct)
    acc = _acc_dtype(dt)
    upd = _cast(g, ct, acc) if acc != dt else ct
    last, row_len = src_shape[-1], avals[0].shape[-1]
    if row_len != last:
        upd = g.op("Slice", upd, _c(g, [0]), _c(g, [last]), _c(g, [-1]))
    n = _extent(g, index, avals[2].shape, nb)
    valid, row = _rows(g, offsets, index, num, n, list(src_shape[:dim + 1]), dim, bool(
        params["check_bounds"]))
    per = math.prod(src_shape[:dim + 1])
    total = per * math.prod(out_bshape)
    full = [j for j in range(nb) if out_bshape[j] != 1]
    row = _arith(g, "Add", row, _batch_offset(g, list(out_bshape), full, per, nb + 1))
    assert not isinstance(row, int) and not isinstance(valid, bool)  # src is not empty
    target = g.op("Where", valid, row, _c(g, total))
    # Both to the full batch shape (each may be broadcast where the other is not).
    target = g.op("Expand", target, g.op("Shape", upd, end=nb + 1))
    upd = g.op("Expand", upd, g.op("Concat", g.op("Shape", target), g.op(
        "Shape", upd, start=nb + 1), axis=0))
    row_shape = list(src_shape[dim + 1:])
    zeros = g.op("ConstantOfShape", _c(g, [total + 1] + row_shape),
                 value=_tensor(np.zeros(1, acc)))
    summed = g.op("ScatterND", zeros, g.op("Reshape", target, _c(g, [-1, 1])),
                  g.op("Reshape", upd, _c(g, [-1] + row_shape)), reduction="add")
    summed = g.op("Slice", summed, _c(g, [0]), _c(g, [total]), _c(g, [0]))
    res = g.op("Reshape", summed, _c(g, list(out_bshape + src_shape)))
    return _cast(g, res, dt) if acc != dt else res
