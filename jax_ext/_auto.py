"""implementation "auto": native or lax, chosen per call site while lowering.

A native call is opaque to XLA: what produces its operands and what consumes its result can
no longer be fused with it into one loop, so each side is written to memory and read back.
The kernel therefore only pays where that would happen anyway. ``auto`` takes it when

* every operand that matters (not a scalar, not a small broadcast row) is already
  materialized: an argument of the lowered program, a loop-carried value, a large constant,
  or the result of an op XLA does not fuse into its consumers (dot, convolution, reduction,
  custom call, gather, sort, loop, ...), looked up in the MLIR being built;
* no consumer of the result would fuse it: the result is a program output, loop state, or
  read only by such opaque ops, looked up in the jaxpr being lowered; and
* the work is large enough for the kernel to beat XLA's loop: a per-op threshold, measured
  on the machine the package is tuned on; ``None`` where the kernel never measured faster
  (README, "Native or lax: who decides", has the numbers).

Everywhere else the lax path, which fuses like the jnp code it replaces. Each decision is
recorded; :func:`explain` reports them for a function.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import _compat

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
# Ops that only relabel their operand's bytes: look through them.
_VIEW_OPS = {"stablehlo.reshape", "stablehlo.bitcast_convert"}

# jaxpr primitives that read their operands from memory whatever produced them, so a
# native result feeding them costs nothing extra.
_OPAQUE_CONSUMERS = {
    "dot_general", "conv_general_dilated", "sort", "scatter", "scatter-add", "scatter_add",
    "scatter_mul", "scatter_min", "scatter_max", "while", "cond", "scan", "fft", "ffi_call",
    "custom_call", "cholesky", "triangular_solve", "lu", "qr", "eigh", "svd",
    "jax_ext_select", "jax_ext_gather", "jax_ext_scatter_add",
    "jax_ext_select_shard", "jax_ext_gather_shard", "jax_ext_scatter_add_shard",
}
# Call-like primitives whose body is lowered inline: look through them by position.
_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "remat2",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"}
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


def producer(value: Any, stack: Sequence[Any] = (), level: int = 0,
             depth: int = 0) -> tuple[bool, str]:
    """Is `value` (an MLIR value being lowered) already in memory? -> (yes, what it is).
    `stack`: _compat.enclosing_equations(), to follow arguments of inner functions out."""
    try:
        if isinstance(value, ir.BlockArgument):
            parent = value.owner.owner
            name = parent.operation.name if parent is not None else "?"
            if name == "func.func":
                fname = ir.StringAttr(parent.attributes["sym_name"]).value
                if fname == "main":
                    return True, "argument"
                outer = _outer_value(value, stack, level)
                if outer is not None and depth < 8:
                    return producer(outer[0], stack, outer[1], depth + 1)
                return False, f"argument of inner function {fname}"
            if name == "stablehlo.while":
                return True, "loop state"
            return False, f"block argument of {name}"
        op = value.owner
        name = op.operation.name if hasattr(op, "operation") else op.name
        if name in _VIEW_OPS and depth < 8:
            return producer(op.operands[0], stack, level, depth + 1)
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
                    return producer(op.operands[v.arg_number], stack, level, depth + 1)
                return producer(v, stack, level, depth + 1)
            return False, f"result of call {callee_name}"
        if name in _MATERIALIZED_OPS:
            return True, name.removeprefix("stablehlo.")
        if name == "stablehlo.constant":
            splat = ir.DenseElementsAttr(op.attributes["value"]).is_splat
            return (not splat), "constant"
        return False, name.removeprefix("stablehlo.")
    except Exception as e:  # any surprise in the IR: assume it would fuse
        return False, f"unknown ({type(e).__name__})"


def _uses(jaxpr: Any, var: Any) -> list[Any]:
    return [e for e in jaxpr.eqns if any(v is var for v in e.invars)]


def _inner_jaxpr(eqn: Any) -> Any:
    for k in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(k)
        if j is not None:
            return getattr(j, "jaxpr", j)
    return None


def _consumer_in(jaxpr: Any, var: Any, depth: int) -> tuple[bool, str]:
    """Do the uses of `var` inside `jaxpr` leave it in memory? (opaque, first fusing use)."""
    for e in _uses(jaxpr, var):
        name = e.primitive.name
        if name in _OPAQUE_CONSUMERS:
            continue
        if name in _CALLS and depth < 8:
            inner = _inner_jaxpr(e)
            if inner is not None and len(inner.invars) == len(e.invars):
                for pos, v in enumerate(e.invars):
                    if v is var:
                        ok, what = _consumer_in(inner, inner.invars[pos], depth + 1)
                        if not ok:
                            return ok, what
                continue
        return False, name
    return True, ""


def consumers(prim: Any) -> tuple[bool, str]:
    """Would the result of the equation being lowered (of primitive `prim`) stay in memory
    anyway? -> (yes, why). Looks at the jaxprs jax is lowering right now."""
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
    try:
        return math.prod(int(d) for d in aval.shape) * int(aval.dtype.itemsize)
    except Exception:
        return None


def enough_work(aval: Any, min_bytes: int | None, what: str) -> tuple[bool, str]:
    """Is there enough work for the kernel to beat XLA's loop? `min_bytes` None: the
    kernel was measured no faster at any size, so never."""
    if min_bytes is None:
        return False, "the kernel measured no faster than XLA's fused loop at any size"
    n = static_nbytes(aval)
    if n is None:
        return True, f"{what} size known only at run time"
    if n < min_bytes:
        return False, f"{n} {what} bytes: too little work"
    return True, f"{n} {what} bytes"


def operands_and_result(prim: Any, ctx: Any, names: Sequence[str], args: Sequence[Any],
                        min_bytes: int | None) -> tuple[bool, str]:
    """The common test: enough result bytes; every operand of at least 1/8 of the result's
    bytes is in memory (smaller ones -- scalars, broadcast rows, index vectors -- cost
    little to materialize); and nothing would fuse the result."""
    ok, what = enough_work(ctx.avals_out[0], min_bytes, "result")
    if not ok:
        return ok, what
    out_bytes = static_nbytes(ctx.avals_out[0])
    whats = []
    stack = _compat.enclosing_equations()
    for name, aval, v in zip(names, ctx.avals_in, args):
        n = static_nbytes(aval)
        if n is not None and (aval.ndim == 0 or (out_bytes is not None and n * 8 < out_bytes)):
            continue
        ok, what = producer(v, stack)
        if not ok:
            return False, f"{name} comes from {what}, which would fuse"
        whats.append(f"{name}: {what}")
    ok, what = consumers(prim)
    if not ok:
        return False, what
    return True, ", ".join(whats + [what])


# --- decisions, and explain() --------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """How one jax_ext call site was lowered."""
    op: str          # "select", "gather" or "scatter_add"
    impl: str        # "native" or "lax"
    requested: str   # "auto", "native" or "lax"
    reason: str
    where: str       # file:line of the user's call, when known

    def __str__(self) -> str:
        return f"{self.where}: {self.op} -> {self.impl} ({self.requested}: {self.reason})"


_log = threading.local()


def _user_frame(ctx: Any) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        for fr in ctx.traceback.frames:
            f = fr.file_name
            if f.startswith(here) or f"{os.sep}jax{os.sep}" in f or f.startswith("<frozen"):
                continue
            return f"{os.path.basename(f)}:{fr.line_num}"
    except Exception:
        pass
    return "?"


def record(ctx: Any, op: str, impl: str, requested: str, reason: str) -> None:
    sink = getattr(_log, "sink", None)
    if sink is not None:
        sink.append(Decision(op, impl, requested, reason, _user_frame(ctx)))


@contextlib.contextmanager
def recording() -> Iterator[list[Decision]]:
    old = getattr(_log, "sink", None)
    _log.sink = []
    try:
        yield _log.sink
    finally:
        _log.sink = old


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Decision]:
    """How each jax_ext call site in ``fn(*args, **kwargs)`` is lowered on CPU: a list of
    :class:`Decision` (op, impl "native"/"lax", the implementation requested, the reason and
    the calling line), in lowering order. ``fn`` is traced and lowered afresh (not run)::

        for d in jax_ext.explain(jax.grad(loss), params, batch):
            print(d)     # model.py:41: gather -> native (auto: src is argument, ...)
    """
    import jax
    fresh = jax.jit(lambda *a, **k: fn(*a, **k))  # a new function: never a cached lowering
    with recording() as decisions:
        fresh.trace(*args, **kwargs).lower(lowering_platforms=("cpu",))
    return list(decisions)
