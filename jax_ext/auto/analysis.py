"""What implementation "auto" reads about a call site: what produces each operand and
what consumes the result, from the MLIR being built and the jaxprs being lowered.

A native call is opaque to XLA: an operand whose producer would fuse into the lax path's
loop must be written to memory first, and a result a consumer would fuse must be read back.
``site()`` gathers those facts, with the bytes each side moves, for the cost model
(model.py) and for measured decisions (tuning.py).
"""
from __future__ import annotations

import functools
import hashlib
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .. import _compat, _names

ir = _compat.ir

# StableHLO ops whose results XLA:CPU keeps in memory (they do not fuse into consumers).
_MATERIALIZED_OPS = {
    "stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution", "stablehlo.custom_call",
    "stablehlo.reduce", "stablehlo.reduce_window", "stablehlo.gather", "stablehlo.scatter",
    "stablehlo.sort", "stablehlo.while", "stablehlo.case", "stablehlo.if", "stablehlo.fft",
    "stablehlo.rng_bit_generator", "stablehlo.all_reduce", "stablehlo.all_gather",
    "stablehlo.all_to_all", "stablehlo.collective_permute", "stablehlo.reduce_scatter",
    "stablehlo.triangular_solve", "stablehlo.cholesky", "stablehlo.select_and_scatter",
    "stablehlo.dynamic_update_slice", "stablehlo.optimization_barrier",
    "stablehlo.batch_norm_training", "stablehlo.batch_norm_grad",
}
# Ops that only relabel their operand's bytes: look through them (and through the free
# views of _free_view: a size-1 broadcast_in_dim, a transpose moving only size-1 dims).
_VIEW_OPS = {"stablehlo.reshape", "stablehlo.bitcast_convert"}


def _moves_only_size1(perm: Sequence[int], shape: Sequence[int]) -> bool:
    """Does the transpose `perm` of `shape` keep the order of every dim larger than 1?"""
    big = [p for p in perm if int(shape[p]) != 1]
    return big == sorted(big)


def _free_view(op: Any, name: str) -> bool:
    """A broadcast_in_dim that adds only size-1 dims (the batch dim jax_ext's own batching
    rules insert), or a transpose of size-1 dims: the same bytes, in the same order."""
    if name not in ("stablehlo.broadcast_in_dim", "stablehlo.transpose"):
        return False
    try:
        src = ir.RankedTensorType(op.operands[0].type)
        dst = ir.RankedTensorType(op.results[0].type)
        if name == "stablehlo.broadcast_in_dim":
            return bool(math.prod(src.shape) == math.prod(dst.shape))
        perm = [int(p) for p in ir.DenseI64ArrayAttr(op.attributes["permutation"])]
        return _moves_only_size1(perm, src.shape)
    except Exception as e:
        _compat.fallback(f"{name} could not be read from the IR: not a free view", e)
        return False

# jaxpr primitives that read their operands from memory whatever produced them, so a
# native result feeding them costs nothing extra.
_OPAQUE_CONSUMERS = frozenset({
    "dot_general", "conv_general_dilated", "sort", "scatter", "scatter-add", "scatter_add",
    "scatter_mul", "scatter_min", "scatter_max", "while", "cond", "scan", "fft", "ffi_call",
    "custom_call", "cholesky", "triangular_solve", "lu", "qr", "eigh", "svd",
}) | _names.PRIMITIVES
# Reductions that XLA:CPU (jaxlib 0.10.2) runs from memory, for these operand dtypes: XLA
# materializes their operand itself, so a native result feeding them costs nothing extra
# (docs/performance.md says where this shows in the compiled program).
_MEMORY_REDUCTIONS = {
    "reduce_sum": {"float32", "float64"},
    "reduce_max": {"float16", "bfloat16", "float32", "float64"},
    "reduce_min": {"float16", "bfloat16", "float32", "float64"},
}
# Call-like primitives whose body is lowered inline: look through them by position.
# `eval_jaxpr` is what checkpoint and custom_vjp bind under jax_remat3 / jax_custom_vjp3
# (jax's announced implementations), in place of remat2 and the custom_vjp calls.
_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "remat2",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
          "eval_jaxpr"}
# Pins values around a rematerialized computation (jax_remat3 pins the cotangents that
# enter one, too); each result is its operand: look through it by position, so that the
# consumer found is the same whichever remat implementation jax uses.
_PINS = {"optimization_barrier"}
# Control flow whose results are buffers (loop state, branch results).
_BUFFER_RESULTS = {"while", "scan", "cond"}


def _callee(module_op: Any, name: str) -> Any:
    for op in module_op.regions[0].blocks[0].operations:
        if op.operation.name == "func.func" and ir.StringAttr(
                op.attributes["sym_name"]).value == name:
            return op
    return None


def _outer_value(value: Any, stack: Sequence[Any], level: int) -> tuple[Any, int] | None:
    """The value an argument of an inner function (a nested jit, a scan body, ...) is
    called with, from the jaxpr lowered around it: (value, level) or None."""
    if level + 1 >= len(stack):
        return None
    jaxpr, _, env = stack[level]
    pos = [k for k, v in enumerate(jaxpr.invars) if env.get(v) is not None and env[v] == value]
    _, outer_eqn, outer_env = stack[level + 1]
    inner = _inner_jaxpr(outer_eqn)
    if len(pos) != 1 or inner is not jaxpr or len(jaxpr.invars) != len(outer_eqn.invars):
        return None
    v = outer_eqn.invars[pos[0]]
    return (outer_env[v], level + 1) if v in outer_env else None


def producer(value: Any, stack: Sequence[Any] = ()) -> tuple[bool, str]:
    """Is `value` (an MLIR value being lowered) already in memory? -> (yes, what it is).
    `stack`: _compat.enclosing_equations(), to follow arguments of inner functions out."""
    mem, what, _ = traced_producer(value, stack)
    return mem, what


def traced_producer(value: Any, stack: Sequence[Any] = (), level: int = 0,
                    depth: int = 0) -> tuple[bool, str, Any]:
    """`producer`, and the value it was traced to: through views, into the callees of
    nested calls and out of inner functions to the operand they were called with (whether
    jax lowers a call inline or as a function of its own, as it does eval_jaxpr)."""
    try:
        if isinstance(value, ir.BlockArgument):
            parent = value.owner.owner
            name = parent.operation.name if parent is not None else "?"
            if name == "func.func":
                fname = ir.StringAttr(parent.attributes["sym_name"]).value
                if fname == "main":
                    return True, "argument", value
                outer = _outer_value(value, stack, level)
                if outer is not None and depth < 8:
                    return traced_producer(outer[0], stack, outer[1], depth + 1)
                return False, f"argument of inner function {fname}", value
            if name == "stablehlo.while":
                return True, "loop state", value
            if name == "sdy.manual_computation" and depth < 8:
                # shard_map's body: its arguments are the per-device shards of the
                # shard_map's operands, in memory where those are.
                outer = _outer_value(value, stack, level)
                if outer is not None:
                    return traced_producer(outer[0], stack, outer[1], depth + 1)
            return False, f"block argument of {name}", value
        op = value.owner
        name = op.operation.name if hasattr(op, "operation") else op.name
        if (name in _VIEW_OPS or _free_view(op, name)) and depth < 8:
            return traced_producer(op.operands[0], stack, level, depth + 1)
        if name == "func.call" and depth < 8:
            # A nested jit: follow the callee's returned value (and its arguments back here).
            callee_name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            module_op = op.operation.parent
            while module_op is not None and module_op.name != "builtin.module":
                module_op = module_op.parent
            callee = _callee(module_op, callee_name) if module_op is not None else None
            if callee is not None:
                ret = callee.regions[0].blocks[0].operations[-1]
                v = ret.operands[value.result_number]
                if isinstance(v, ir.BlockArgument) and v.owner.owner == callee:
                    return traced_producer(op.operands[v.arg_number], stack, level, depth + 1)
                return traced_producer(v, stack, level, depth + 1)
            return False, f"result of call {callee_name}", value
        if name == "stablehlo.optimization_barrier" and depth < 8:
            # Its results are in memory; where its operand already was, say what that is
            # (jax_remat3 pins values with it that other remat implementations do not).
            inner = traced_producer(op.operands[value.result_number], stack, level, depth + 1)
            return inner if inner[0] else (True, "optimization_barrier", value)
        if name in _MATERIALIZED_OPS:
            return True, name.removeprefix("stablehlo."), value
        if name == "stablehlo.constant":
            splat = ir.DenseElementsAttr(op.attributes["value"]).is_splat
            return (not splat), "constant", value
        return False, name.removeprefix("stablehlo."), value
    except Exception as e:  # any surprise in the IR: assume it would fuse
        _compat.fallback("an operand's producer could not be read from the IR: auto "
                         "assumes it would fuse", e)
        return False, f"unknown ({type(e).__name__})", value


def _type_bytes(t: Any) -> int:
    rt = t if isinstance(t, ir.RankedTensorType) else ir.RankedTensorType(t)
    et = rt.element_type
    # jax's MLIR bindings hand out the concrete type (F32Type, IntegerType, ...), whose
    # width is an attribute; reading it through the classes costs tens of us a call.
    width = getattr(et, "width", None)
    if not isinstance(width, int):
        return _ir_type_bytes(t)
    return math.prod(rt.shape) * max(1, width // 8)


def _ir_type_bytes(t: Any) -> int:
    rt = ir.RankedTensorType(t)
    et = rt.element_type
    for cls in (ir.IntegerType, ir.FloatType):
        try:
            width = int(cls(et).width)
            break
        except ValueError:  # not of that class
            continue
    else:
        width = 32
    return math.prod(rt.shape) * max(1, width // 8)


def producer_reads(value: Any) -> int:
    """Bytes the loop computing `value` (a fusible op's result) reads from memory: its
    operands, less broadcasts, iotas and constants (computed in the loop). Materializing
    `value` for a native call re-reads them, where one fused loop read them once."""
    try:
        v = value
        for _ in range(8):  # look through views to the op that computes
            if isinstance(v, ir.BlockArgument):
                return 0  # a view of an argument: no loop here computes it
            op = v.owner
            name = op.operation.name if hasattr(op, "operation") else op.name
            if name not in _VIEW_OPS and not _free_view(op, name):
                break
            v = op.operands[0]
        else:
            if isinstance(v, ir.BlockArgument):
                return 0
            op = v.owner
        total = 0
        for v in op.operands:
            src = v.owner
            sname = "" if isinstance(v, ir.BlockArgument) else (
                src.operation.name if hasattr(src, "operation") else src.name)
            if sname in ("stablehlo.broadcast_in_dim", "stablehlo.constant", "stablehlo.iota"):
                continue
            total += _type_bytes(v.type)
        return total
    except Exception as e:  # an unknown shape of IR: count nothing extra
        _compat.fallback("what a fusible producer reads could not be read from the IR: "
                         "auto counts nothing extra", e)
        return 0


# Each jaxpr's uses, indexed once: id(var) -> the equations reading it, in order. A
# lowering asks for the uses of every call site's result, and scanning the whole jaxpr
# each time made auto's lowering grow with the square of the call sites.
_USES: weakref.WeakKeyDictionary[Any, dict[int, list[Any]]] = weakref.WeakKeyDictionary()


def _uses(jaxpr: Any, var: Any) -> list[Any]:
    index = _USES.get(jaxpr)
    if index is None:
        index = _USES[jaxpr] = _index_uses(jaxpr)
    return index.get(id(var), [])


def _index_uses(jaxpr: Any) -> dict[int, list[Any]]:
    index: dict[int, list[Any]] = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            seen = index.setdefault(id(v), [])
            if not seen or seen[-1] is not e:
                seen.append(e)
    return index


def _inner_jaxpr(eqn: Any) -> Any:
    for k in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(k)
        if j is not None:
            return getattr(j, "jaxpr", j)
    return None


def _free_view_eqn(e: Any) -> bool:
    """A jaxpr equation that only relabels its operand: reshape, squeeze, expand_dims, a
    broadcast_in_dim adding size-1 dims, a transpose of size-1 dims."""
    name = e.primitive.name
    if name in ("reshape", "squeeze", "expand_dims"):
        return True
    if name not in ("broadcast_in_dim", "transpose"):
        return False
    a, b = e.invars[0].aval, e.outvars[0].aval
    if name == "transpose":
        return _moves_only_size1(e.params["permutation"], a.shape)
    try:
        return bool(math.prod(a.shape) == math.prod(b.shape))
    except jax.errors.InconclusiveDimensionOperation:  # symbolic sizes (jax.export)
        return False


def _reads_from_memory(e: Any, var: Any) -> bool:
    """Does equation `e` read `var` from memory whatever produced it?"""
    name = e.primitive.name
    # (a jax_ext op under "auto" is decided after this one: it may take lax and fuse)
    if name in _OPAQUE_CONSUMERS and not (
            name in _names.PRIMITIVES and e.params.get("impl") == "auto"):
        return True
    reductions = _MEMORY_REDUCTIONS.get(name)
    return reductions is not None and str(getattr(var.aval, "dtype", "")) in reductions


def _through(e: Any, var: Any) -> list[tuple[Any, Any]] | None:
    """Where a use of `var` by `e` continues, as (jaxpr, var) pairs to look at in its
    stead: a free view's result, a call's parameter; None when `e` is neither."""
    if _free_view_eqn(e):
        return [(None, e.outvars[0])]
    if e.primitive.name in _PINS:
        return [(None, e.outvars[pos]) for pos, v in enumerate(e.invars) if v is var]
    inner = _inner_jaxpr(e) if e.primitive.name in _CALLS else None
    if inner is None or len(inner.invars) != len(e.invars):
        return None
    return [(inner, inner.invars[pos]) for pos, v in enumerate(e.invars) if v is var]


def _consumer_in(jaxpr: Any, var: Any, depth: int) -> tuple[bool, str]:
    """Do the uses of `var` inside `jaxpr` leave it in memory? (opaque, first fusing use)."""
    for e in _uses(jaxpr, var):
        if _reads_from_memory(e, var):
            continue
        nexts = _through(e, var) if depth < 8 else None
        if nexts is None:
            return False, e.primitive.name
        for inner, v in nexts:
            ok, what = _consumer_in(jaxpr if inner is None else inner, v, depth + 1)
            if not ok:
                return ok, what
    return True, ""


def consumers(prim: Any, stack: Sequence[Any] | None = None) -> tuple[bool, str]:
    """Would the result of the equation being lowered (of primitive `prim`) stay in memory
    anyway? -> (yes, why). Looks at the jaxprs jax is lowering right now (`stack`:
    _compat.enclosing_equations(), when the caller has it)."""
    if stack is None:
        stack = _compat.enclosing_equations()
    if not stack or stack[0][1].primitive is not prim:
        return False, "consumers unknown"
    var = stack[0][1].outvars[0]
    for level, (jaxpr, _, _) in enumerate(stack):
        ok, what = _consumer_in(jaxpr, var, 0)
        if not ok:
            return False, f"result feeds {what}"
        if not any(v is var for v in jaxpr.outvars):
            return True, "result read by opaque ops only"
        if level + 1 == len(stack):
            return True, "result is a program output"
        outer = stack[level + 1][1]
        if _inner_jaxpr(outer) is not jaxpr and outer.primitive.name not in _BUFFER_RESULTS:
            return False, f"result leaves {outer.primitive.name}"
        if outer.primitive.name in _BUFFER_RESULTS:
            return True, f"result is {outer.primitive.name} state"
        if len(jaxpr.outvars) != len(outer.outvars):
            return False, f"result leaves {outer.primitive.name}"
        var = outer.outvars[[i for i, v in enumerate(jaxpr.outvars) if v is var][0]]
    return False, "consumers unknown"


def static_nbytes(aval: Any) -> int | None:
    """Bytes of an array, or None when a dimension is symbolic (jax.export)."""
    n = int(aval.dtype.itemsize)
    for d in aval.shape:  # (a loop: asked for every operand of every call site)
        if not isinstance(d, (int, np.integer)):
            return None
        n *= int(d)
    return n


@dataclass(frozen=True)
class Operand:
    name: str
    nbytes: int
    in_memory: bool  # already in memory whatever runs (an argument, a dot's result, ...)
    producer: str    # what produces it ("small": not looked at)
    donated: bool = False  # an argument of the jitted function that the caller donated

    def source(self) -> str:
        """Its producer, and whether the caller donated it."""
        return self.producer + (" (donated)" if self.donated else "")


@dataclass(frozen=True)
class Site:
    """What the estimates need about one call site, read from the IR being lowered."""
    op: str
    out_bytes: int
    operands: tuple[Operand, ...]
    rereads: dict[str, int]  # per operand that would fuse: bytes its producer reads
    result_kept: bool   # no consumer would fuse the result
    consumer: str       # why (or the first fusing consumer)
    key: str            # the site's fingerprint (see fingerprint())

    def notes(self) -> str:
        parts = [f"{o.name}: {o.source()}" if o.in_memory else
                 f"{o.name} comes from {o.producer}, which would fuse"
                 for o in self.operands if o.producer != "small"]
        return ", ".join(parts + [self.consumer])

    def fused(self) -> bool:
        """Would the lax path fuse with a neighbour (a producer or a consumer)?"""
        return not self.result_kept or any(not o.in_memory for o in self.operands)


def fingerprint(op: str, ctx: Any, params: dict[str, Any], context: Sequence[str]) -> str:
    """A short stable name for a call site: the op, its operand and result types, its
    static params and what surrounds it (`context`: what produces each operand and what
    consumes the result). Two call sites with one fingerprint run the same code in the
    same surroundings, so one measured choice serves both."""
    static = tuple(sorted((k, v) for k, v in params.items() if k not in ("impl", "api")))
    return _fingerprint(op, tuple(ctx.avals_in) + tuple(ctx.avals_out), static,
                        tuple(context))


@functools.lru_cache(maxsize=4096)  # repeated sites (layers) share one: hashing is per site
def _fingerprint(op: str, avals: tuple[Any, ...], static: tuple[tuple[str, Any], ...],
                 context: tuple[str, ...]) -> str:
    text = repr((op, [a.str_short() for a in avals], [(k, repr(v)) for k, v in static],
                 list(context)))
    return f"{op}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def site(op: str, prim: Any, ctx: Any, args: Sequence[Any], params: dict[str, Any],
         names: Sequence[str], big: Sequence[str]) -> Site | None:
    """The sizes and the producer/consumer analysis; None when a size is symbolic.
    `big`: the operands whose producers matter (small ones -- scalars, broadcast rows,
    index vectors -- are read from memory on both sides at little cost)."""
    out = static_nbytes(ctx.avals_out[0])
    if out is None:
        return None
    stack = _compat.enclosing_equations()
    ops, rereads = [], {}
    for name, aval, v in zip(names, ctx.avals_in, args):
        n = static_nbytes(aval)
        if n is None:
            return None
        if name not in big or aval.ndim == 0 or n * 8 < out:
            ops.append(Operand(name, n, True, "small"))
            continue
        mem, what, src = traced_producer(v, stack)
        ops.append(Operand(name, n, mem, what, _compat.is_donated_block_argument(v)))
        if not mem:
            rereads[name] = producer_reads(src)
    kept, why = consumers(prim, stack)
    key = fingerprint(op, ctx, params, [o.source() for o in ops] + [why])
    return Site(op, out, tuple(ops), rereads, kept, why, key)
