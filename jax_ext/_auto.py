"""implementation "auto": native or lax, chosen per call site while lowering, by cost.

A native call is opaque to XLA: what produces its operands and what consumes its result can
no longer be fused with it into one loop, so each side is written to memory and read back.
``auto`` estimates, at each call site, the kernel's time and the lax path's time, and takes
the cheaper. The estimates come from what sets them (the cost model below, its constants in
_cost_table.py, fitted by ``jax-ext-bench --calibrate``):

* bytes read and written, the row length and number of rows (gather, scatter-add), and for
  a scatter-add the zero-filled result as well as the cotangent;
* whether a result is freshly mapped on each call (above glibc's mmap threshold: XLA faults
  in 4 KiB pages, the kernels map huge pages);
* the single-thread vs thread-pool regime of XLA's loops;
* for each operand, whether it is already in memory (an argument, loop state, a large
  constant, the result of an op XLA does not fuse: dot, reduction, gather, custom call,
  ...; looked up in the MLIR being built, through nested jits and free views: reshape, a
  size-1 broadcast_in_dim or transpose, such as the batch dim jax_ext's batching rules
  insert) or would fuse: then the kernel pays a loop materializing it;
* whether a consumer would fuse the result (looked up in the jaxpr being lowered): then
  the kernel's result is read back once more, and the lax path never writes it.

Each decision is recorded with both estimates; :func:`explain` reports them.
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
    try:
        src = ir.RankedTensorType(op.operands[0].type)
        dst = ir.RankedTensorType(op.results[0].type)
        if name == "stablehlo.broadcast_in_dim":
            return math.prod(src.shape) == math.prod(dst.shape)
        if name == "stablehlo.transpose":
            perm = [int(p) for p in ir.DenseI64ArrayAttr(op.attributes["permutation"])]
            return _moves_only_size1(perm, src.shape)
    except Exception:
        pass
    return False

# jaxpr primitives that read their operands from memory whatever produced them, so a
# native result feeding them costs nothing extra.
_OPAQUE_CONSUMERS = {
    "dot_general", "conv_general_dilated", "sort", "scatter", "scatter-add", "scatter_add",
    "scatter_mul", "scatter_min", "scatter_max", "while", "cond", "scan", "fft", "ffi_call",
    "custom_call", "cholesky", "triangular_solve", "lu", "qr", "eigh", "svd",
    "jax_ext_select", "jax_ext_gather", "jax_ext_scatter_add",
    "jax_ext_select_shard", "jax_ext_gather_shard", "jax_ext_scatter_add_shard",
}
# Reductions that XLA:CPU (jaxlib 0.10.2) runs as a YNNPACK fusion reading its operand from
# memory, for these operand dtypes: the producer is materialized by XLA itself, so a native
# result feeding them costs nothing extra (checked in the compiled HLO: a kLoop fusion
# writing the operand, then a kCustom __ynn_fusion; other dtypes fuse into a kLoop).
_MEMORY_REDUCTIONS = {
    "reduce_sum": {"float32", "float64"},
    "reduce_max": {"float16", "bfloat16", "float32", "float64"},
    "reduce_min": {"float16", "bfloat16", "float32", "float64"},
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
        if (name in _VIEW_OPS or _free_view(op, name)) and depth < 8:
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


def _type_bytes(t: Any) -> int:
    rt = ir.RankedTensorType(t)
    et = rt.element_type
    for cls in (ir.IntegerType, ir.FloatType):
        try:
            width = int(cls(et).width)
            break
        except Exception:
            continue
    else:
        width = 32
    return math.prod(rt.shape) * max(1, width // 8)


def producer_reads(value: Any) -> int:
    """Bytes the loop computing `value` (a fusible op's result) reads from memory: its
    operands, less broadcasts, iotas and constants (computed in the loop). Materializing
    `value` for a native call re-reads them, where one fused loop read them once."""
    try:
        op = value.owner
        for _ in range(8):  # look through views to the op that computes
            name = op.operation.name if hasattr(op, "operation") else op.name
            if name not in _VIEW_OPS and not _free_view(op, name):
                break
            op = op.operands[0].owner
        total = 0
        for v in op.operands:
            src = v.owner
            sname = "" if isinstance(v, ir.BlockArgument) else (
                src.operation.name if hasattr(src, "operation") else src.name)
            if sname in ("stablehlo.broadcast_in_dim", "stablehlo.constant", "stablehlo.iota"):
                continue
            total += _type_bytes(v.type)
        return total
    except Exception:  # an unknown shape of IR: count nothing extra
        return 0


def _uses(jaxpr: Any, var: Any) -> list[Any]:
    return [e for e in jaxpr.eqns if any(v is var for v in e.invars)]


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
    try:
        a, b = e.invars[0].aval, e.outvars[0].aval
        if name in ("reshape", "squeeze", "expand_dims"):
            return True
        if name == "broadcast_in_dim":
            return bool(math.prod(a.shape) == math.prod(b.shape))
        if name == "transpose":
            return _moves_only_size1(e.params["permutation"], a.shape)
    except Exception:
        pass
    return False


def _consumer_in(jaxpr: Any, var: Any, depth: int) -> tuple[bool, str]:
    """Do the uses of `var` inside `jaxpr` leave it in memory? (opaque, first fusing use)."""
    for e in _uses(jaxpr, var):
        name = e.primitive.name
        if name in _OPAQUE_CONSUMERS and not (
                name.startswith("jax_ext_") and e.params.get("impl") == "auto"):
            continue
        # (a jax_ext op under "auto" is decided after this one: it may take lax and fuse)
        if str(getattr(var.aval, "dtype", "")) in _MEMORY_REDUCTIONS.get(name, ()):
            continue
        if _free_view_eqn(e) and depth < 8:
            ok, what = _consumer_in(jaxpr, e.outvars[0], depth + 1)
            if not ok:
                return ok, what
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


# --- the cost model ------------------------------------------------------------------
#
# Per call site, the time of each side is estimated from what sets it; the cheaper runs.
# Constants: _cost_table.TABLE (fitted by `jax-ext-bench --calibrate`). A side pays:
#   * its own loop: s0 (+ s_per_row per row for gather/scatter-add) + s_per_byte per byte it
#     reads and writes (select: one thread below POOL_MIN_BYTES of result, a pool above);
#   * a result above glibc's mmap threshold is a fresh mapping on each call: XLA's faults
#     its 4 KiB pages in one by one, the kernels map huge pages (fresh.*.s_per_byte);
#   * lax: an operand whose producer would fuse is not read from memory (the fused loop
#     computes it), and a result that a consumer would fuse is never written;
#   * native: such an operand is materialized first (a loop writing it, re-reading what
#     its producer reads) and such a result is read back by its consumer (materialize.*):
#     one write and one read.

def _c(key: str) -> float:
    from ._cost_table import TABLE
    return TABLE[key]


def _fresh(impl: str, nbytes: int) -> float:
    from ._cost_table import MMAP_THRESHOLD_BYTES
    # glibc maps a request of at least the threshold (XLA adds alignment on top)
    return _c(f"fresh.{impl}.s_per_byte") * nbytes if nbytes >= MMAP_THRESHOLD_BYTES else 0.0


def _materialize(nbytes: int) -> float:
    return _c("materialize.s0") + _c("materialize.s_per_byte") * nbytes


def fmt_s(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


@dataclass
class _Site:
    """What the estimates need about one call site, read from the IR being lowered."""
    out_bytes: int
    operands: list[tuple[str, int, bool, str]]  # (name, bytes, in memory?, producer)
    rereads: dict[str, int]  # per operand that would fuse: bytes its producer reads
    result_kept: bool   # no consumer would fuse the result
    consumer: str       # why (or the first fusing consumer)

    def notes(self) -> str:
        parts = [f"{n}: {what}" if mem else f"{n} comes from {what}, which would fuse"
                 for n, _, mem, what in self.operands if what != "small"]
        return ", ".join(parts + [self.consumer])


def _site(prim: Any, ctx: Any, names: Sequence[str], args: Sequence[Any],
          big: Sequence[str]) -> _Site | None:
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
            ops.append((name, n, True, "small"))
            continue
        mem, what = producer(v, stack)
        ops.append((name, n, mem, what))
        if not mem:
            rereads[name] = producer_reads(v)
    kept, why = consumers(prim)
    return _Site(out, ops, rereads, kept, why)


def _lax_s0(site: _Site, key: str) -> float:
    """The lax side's fixed cost: fitted on standalone calls, so it holds a program's
    launch, which a lax op fused with a neighbour does not add (the fused loop is
    launched anyway). The kernel keeps its own: a custom call is a launch of its own."""
    fused = not site.result_kept or any(not mem for _, _, mem, _ in site.operands)
    return 0.0 if fused else _c(key)


_pending = threading.local()


def _decide(op: str, native: float, lax: float, notes: str) -> tuple[bool, str]:
    from ._cost_table import NATIVE_MARGIN
    _pending.estimate = (op, native, lax)  # picked up by record(), for Decision
    return native < lax * NATIVE_MARGIN, f"est. native {fmt_s(native)} vs lax {fmt_s(lax)}; {notes}"


def choose_select(prim: Any, ctx: Any, names: Sequence[str], args: Sequence[Any]
                  ) -> tuple[bool, str]:
    """auto's choice for a select: (use the kernel, why)."""
    from ._cost_table import POOL_MIN_BYTES
    site = _site(prim, ctx, names, args, big=names)
    if site is None:
        return _symbolic(prim, ctx, names, args)
    regime = "s0_single" if site.out_bytes < POOL_MIN_BYTES else "s0"
    read_all = sum(n for _, n, _, _ in site.operands)
    read_lax = sum(n for _, n, mem, _ in site.operands if mem)
    lax = _lax_s0(site, f"select.lax.{regime}") + _c("select.lax.s_per_byte") * (
        read_lax + (site.out_bytes if site.result_kept else 0))
    if site.result_kept:
        lax += _fresh("lax", site.out_bytes)
    native = (_c(f"select.native.{regime}")
              + _c("select.native.s_per_byte") * (read_all + site.out_bytes)
              + _fresh("native", site.out_bytes)
              + sum(_materialize(n + site.rereads.get(k, 0))
                    for k, n, mem, _ in site.operands if not mem)
              + (0.0 if site.result_kept else _materialize(site.out_bytes)))
    return _decide("select", native, lax, site.notes())


def _lax_row_ratio(out_shape: Sequence[int]) -> float:
    """XLA's gather loop over the kernel's, for a result whose last dim (which XLA's
    loop runs over innermost) is that long: the ratio measured at the longest of
    ROW_LENGTHS not above it. A step, not an interpolation: XLA's code changes in steps
    with the length (f32 rows of 74 elements and of 75 differ by 2.5x)."""
    from ._cost_table import ROW_LENGTHS
    last = int(out_shape[-1]) if len(out_shape) else 1
    at = max((n for n in ROW_LENGTHS if n <= last), default=ROW_LENGTHS[0])
    return _c(f"gather.lax.row_ratio.{at}")


def choose_gather(prim: Any, ctx: Any, names: Sequence[str], args: Sequence[Any],
                  nbatch: int) -> tuple[bool, str]:
    """auto's choice for a row gather: (use the kernel, why). Rows: the batch times the
    index length; XLA's gather reads only those rows of src, even of a fused src."""
    site = _site(prim, ctx, names, args, big=("src",))
    if site is None:
        return _symbolic(prim, ctx, names, args)
    rows = math.prod(int(d) for d in ctx.avals_out[0].shape[:nbatch + 1])
    out, src_mem = site.out_bytes, site.operands[0][2]
    small = sum(n for name, n, _, _ in site.operands if name != "src")
    lax = (_lax_s0(site, "gather.lax.s0") + _lax_row_ratio(ctx.avals_out[0].shape) * (
           _c("gather.native.s_per_row") * rows
           + _c("gather.native.s_per_byte") * (small + out * (2 if site.result_kept else 1)))
           + (_fresh("lax", out) if site.result_kept else 0.0))
    native = (_c("gather.native.s0") + _c("gather.native.s_per_row") * rows
              + _c("gather.native.s_per_byte") * (small + 2 * out) + _fresh("native", out)
              + (0.0 if src_mem else _materialize(site.operands[0][1]
                                                  + site.rereads.get("src", 0)))
              + (0.0 if site.result_kept else _materialize(out)))
    return _decide("gather", native, lax, site.notes())


def choose_scatter_add(prim: Any, ctx: Any, nbatch: int) -> tuple[bool, str]:
    """auto's choice for a scatter-add (a gather's gradient): judged by the zero-filled
    result as well as the cotangent. XLA's scatter neither fuses nor is fused away, so
    producers and consumers cost both sides alike."""
    ct, out = static_nbytes(ctx.avals_in[0]), static_nbytes(ctx.avals_out[0])
    if ct is None or out is None:
        return True, "a size known only at run time; XLA's scatter does not fuse either"
    rows = math.prod(int(d) for d in ctx.avals_in[0].shape[:nbatch + 1])
    est = {impl: _c(f"scatter_add.{impl}.s0") + _c(f"scatter_add.{impl}.s_per_row") * rows
           + _c(f"scatter_add.{impl}.s_per_ct_byte") * ct
           + _c(f"scatter_add.{impl}.s_per_out_byte") * out + _fresh(impl, out)
           for impl in ("native", "lax")}
    return _decide("scatter_add", est["native"], est["lax"],
                   f"{ct} cotangent bytes into a {out}-byte zero-filled result")


def _symbolic(prim: Any, ctx: Any, names: Sequence[str], args: Sequence[Any]
              ) -> tuple[bool, str]:
    """Symbolic shapes (jax.export): no estimate; the kernel where nothing fuses."""
    stack = _compat.enclosing_equations()
    for name, aval, v in zip(names, ctx.avals_in, args):
        if aval.ndim == 0:
            continue
        mem, what = producer(v, stack)
        if not mem and name in ("cond", "x", "y", "src"):
            return False, f"a size known only at run time; {name} comes from {what}"
    kept, why = consumers(prim)
    return kept, f"a size known only at run time; {why}"


# --- decisions, and explain() --------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """How one jax_ext call site was lowered, as :func:`explain` reports it.

    Attributes:
        op: ``"select"``, ``"gather"`` or ``"scatter_add"`` (a gather's gradient).
        impl: what runs there: ``"native"`` (the C++ kernel) or ``"lax"``.
        requested: the implementation in force where the op was traced: ``"auto"``,
            ``"native"`` or ``"lax"``.
        reason: why; under ``"auto"`` it starts with the two estimates
            (``est. native 3.1 ms vs lax 7.9 ms``), then what each operand comes from and
            what reads the result.
        where: ``file:line`` of the user's call, when known, else ``"?"``.
        est_native_s: under ``"auto"``, the cost model's estimate of the kernel's time at
            this site in seconds, including materializing what the lax path would fuse;
            None where no estimate was made (a forced implementation, a symbolic size).
        est_lax_s: the same for the lax path.
    """
    op: str
    impl: str
    requested: str
    reason: str
    where: str
    est_native_s: float | None = None
    est_lax_s: float | None = None

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
    est = getattr(_pending, "estimate", None)
    _pending.estimate = None
    nat, lax = (est[1], est[2]) if est is not None and est[0] == op else (None, None)
    sink = getattr(_log, "sink", None)
    if sink is not None:
        sink.append(Decision(op, impl, requested, reason, _user_frame(ctx), nat, lax))


@contextlib.contextmanager
def recording() -> Iterator[list[Decision]]:
    old = getattr(_log, "sink", None)
    _log.sink = []
    try:
        yield _log.sink
    finally:
        _log.sink = old


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Decision]:
    """How each jax_ext call site in ``fn(*args, **kwargs)`` is lowered on CPU.

    ``fn`` is traced and lowered afresh for CPU (never run, never a cached lowering), the
    way ``jax.jit`` would trace it. Under implementation ``"auto"`` each decision carries
    the cost model's two estimates and the reason (see :class:`Decision`)::

        for d in jax_ext.explain(jax.grad(loss), params, batch):
            print(d)  # model.py:41: gather -> native (auto: est. native 3.1 ms vs lax 7.9 ms; ...)

    Args:
        fn: a function, or a ``jax.jit``-ed one with its ``static_argnums`` /
            ``static_argnames``: pass the arguments as you would call it, static ones
            included, e.g. ``explain(jax.jit(f, static_argnums=1), x, 3)``.
        *args: the arguments, as for the call. Arrays (anything with ``shape`` and
            ``dtype``, ``jax.ShapeDtypeStruct`` included) are traced; every other leaf
            (an int, a string, None) is passed to ``fn`` as the Python value itself, as
            jit passes a static argument.
        **kwargs: keyword arguments, as for the call.

    Returns:
        One :class:`Decision` per call site, in lowering order.
    """
    import jax
    # Arrays (anything with a shape and a dtype) are traced; every other leaf (an int, a
    # string, None: what jit's static arguments are) is bound as a Python value, so a
    # jitted function receives its static arguments as it would when called. A fresh
    # outer function: never a cached lowering, so every decision is made (and recorded).
    leaves, tree = jax.tree.flatten((args, kwargs))
    dyn = [k for k, v in enumerate(leaves) if hasattr(v, "shape") and hasattr(v, "dtype")]

    def traced(*dyn_leaves: Any) -> Any:
        full = list(leaves)
        for k, v in zip(dyn, dyn_leaves):
            full[k] = v
        a, kw = jax.tree.unflatten(tree, full)
        return fn(*a, **kw)

    with recording() as decisions:
        jax.jit(traced).trace(*[leaves[k] for k in dyn]).lower(lowering_platforms=("cpu",))
    return list(decisions)
