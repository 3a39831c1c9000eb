"""The one place that builds FFI custom calls, plus the glue the lax fallbacks share (how a
call is partitioned over a mesh: `_partition.py`)."""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import DTypeLike

from . import auto, _compat, _compat_sharding, _names, _native, _partition
from ._compat import Aval, IrValues, PartitionSpec, ir
from .auto import explain
from ._native import native_available

mlir = _compat.mlir
Ctx = mlir.LoweringRuleContext
# A native lowering: the FFI call's results, or None where the kernels decline (the lax
# path runs then).
NativeRule = Callable[..., IrValues | None]

# Dtypes narrower than a byte are packed in XLA buffers; the byte-moving kernels do not
# handle them, so they always take the lax path (IsSubByte in xla_ffi/dispatch.h refuses
# them; tests/test_tables.py ties the two lists). Written once, in _names, where
# _partition's wire views read it too.
SUB_BYTE = _names.SUB_BYTE


def native_dtype_ok(dtype: DTypeLike, spec: _names.OpSpec | None = None) -> bool:
    """Can a kernel take an operand of `dtype`: whole bytes, and where `spec` is given,
    a dtype its kernel computes with (OpSpec.native_dtypes)?"""
    name = np.dtype(dtype).name
    return name not in SUB_BYTE and (spec is None or spec.native_dtype(name))


def _typed_attrs(attrs: Mapping[str, object]) -> dict[str, Any]:
    """Attributes as the C++ decoders take them: they are strict (an int64 array must
    arrive as i64), so every integer sequence becomes an int64 array, every int an int64
    and every bool a bool."""
    typed: dict[str, np.generic | np.ndarray[Any, np.dtype[Any]]] = {}
    for k, v in attrs.items():
        if isinstance(v, (bool, np.bool_)):
            typed[k] = np.bool_(v)
        elif isinstance(v, (int, np.integer)):
            typed[k] = np.int64(v)
        elif isinstance(v, (tuple, list, np.ndarray)):
            typed[k] = np.asarray(v, dtype=np.int64).reshape(-1)
        else:
            raise TypeError(f"unsupported attribute {k}={v!r}")
    return typed


def ffi_call(ctx: Ctx, target: str, operands: Sequence[ir.Value[Any]], *,
             aliases: dict[int, int] | None = None, **attrs: object) -> IrValues:
    """Lower to the FFI custom call `target` (attributes normalized: _typed_attrs)."""
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=aliases or None)
    return rule(ctx, *operands, **_typed_attrs(attrs))


def ffi_function(target: str, results: Sequence[jax.ShapeDtypeStruct], *,
                 aliases: dict[int, int] | None = None,
                 **attrs: object) -> Callable[..., Sequence[jax.Array]]:
    """The FFI target `target` as a jax function of its operands, with `results`, for a
    lowering that runs kernels between jax ops (update_rows: two kernels around the
    optimizer's arithmetic). Attributes normalized as for ffi_call."""
    call = jax.ffi.ffi_call(target, list(results), input_output_aliases=aliases or None)
    typed = _typed_attrs(attrs)

    def fn(*operands: jax.Array) -> Sequence[jax.Array]:
        out: Sequence[jax.Array] = call(*operands, **typed)
        return out
    return fn


def register(prim: _compat.Primitive, names: _names.OpSpec, lax_impl: Callable[..., Any],
             native_rule: NativeRule, *, inspects_operands: bool = False,
             spmd: _partition.Spmd | None = None, partition_lax: bool = False) -> None:
    """Lowerings for `prim` (the op `names`): `lax_impl` (a jax function of the operands
    and params) on every platform; on CPU `native_rule(ctx, *args, **params)` where the
    primitive was bound with impl="native", or with impl="auto" and the cost model
    (jax_ext.auto) says so; the lax path where either declines (native_rule returns None
    for what the kernels do not handle). Decided per call site, so never a cached
    lowering.

    `inspects_operands`: the native rule is also passed ``donated=`` (a bool per operand:
    is it an argument of the jitted function that the caller donated?).

    `spmd`: how the native call partitions. With it, a lowering for more than one device
    partitions the call by it (`_partition.lower_partitioned`); on one device, inside
    shard_map, under GSPMD, or without custom_partitioning it is the plain call.

    `partition_lax`: on CPU the lax path partitions by `spmd` too (each shard runs the lax
    ops), so that every path keeps the same bits, memory and collectives.

    The rule itself runs at every call site (the choice, explain's record and donation are
    the site's); the lax path's lowering is traced and emitted once per module for each
    (avals, params) and called from every site that has them (`outlined`)."""
    lax_rule = outlined(names.primitive + "_lax", lax_impl, prim.multiple_results)
    extra: Callable[[Ctx, Sequence[ir.Value[Any]]], dict[str, Any]] = lambda ctx, args: (
        {"donated": tuple(_compat.is_donated_block_argument(a) for a in args)}
        if inspects_operands else {})
    raw: _compat.Primitive | None = None  # what custom_partitioning re-binds per shard
    if spmd is not None and _compat_sharding.require_devices_during_lowering(prim):
        raw = _shard_primitive(prim, names.shard_primitives[0], lax_rule, native_rule,
                               inspects_operands)
    raw_lax: _compat.Primitive | None = None
    if raw is not None:  # used where partition_lax, or under jax_partitioning
        raw_lax = _shard_primitive(prim, names.shard_primitives[1], lax_rule,
                                   lambda *a, **p: None, False)

    op = names.op

    def choose(ctx: Ctx, args: Sequence[ir.Value[Any]], params: dict[str, Any]) -> auto.Choice:
        requested = params.get("impl")
        if requested == "lax":
            return auto.Choice(False, "requested")
        if not native_available():
            return auto.Choice(False, "native module not loaded")
        if spmd is not None and _compat_sharding.exported_auto_sharded(ctx):
            return auto.Choice(False, "exported for several devices on auto mesh axes: the "
                               "lax path, which XLA partitions itself with the same bits")
        if requested == "native":
            return auto.Choice(True, "requested")
        return auto.choose(names, prim, ctx, args, params)

    def cpu_rule(ctx: Ctx, *args: ir.Value[Any], **params: Any) -> IrValues:
        choice = choose(ctx, args, params)
        use, why = choice.native, choice.reason
        if use:
            beyond = kernel_limit(names, ctx, params)
            if beyond is not None:
                if params.get("impl") == "native":
                    raise ValueError(f"jax_ext.{params.get('api', op)}: impl='native' "
                                     f"cannot take this call: "
                                     f"{beyond}. Use impl='auto' or 'lax', which compute it.")
                use, why = False, beyond
        out: IrValues | None = None
        notes = explain.Notes()
        if use:
            if raw is not None and spmd is not None:
                out = _partition.lower_partitioned(ctx, raw, spmd, args,
                                                   params | extra(ctx, args), lax_path=False,
                                                   partition_lax=partition_lax, notes=notes)
            if out is None:
                out = native_rule(ctx, *args, **params, **extra(ctx, args))
            if out is None:
                why = "dtype not handled natively"
        explain.record(ctx, op, "native" if out is not None else "lax", params["impl"], why,
                       choice.est_native_s, choice.est_lax_s, choice.site, notes)
        if out is None and raw_lax is not None and spmd is not None:
            out = _partition.lower_partitioned(ctx, raw_lax, spmd, args, params, lax_path=True,
                                               partition_lax=partition_lax, notes=notes)
        return out if out is not None else lax_rule(ctx, *args, **params)

    _register_rules(prim, op, cpu_rule, lax_rule)


def kernel_limit(names: _names.OpSpec, ctx: Ctx, params: Mapping[str, Any]) -> str | None:
    """Why the native kernels cannot take this call, or None: their index state holds at
    most MAX_RANK dims. A "batched" kernel walks `nbatch` leading batch dims and the rest
    of each operand apart, each up to the limit; a "collapsed" one walks the result with
    size-1 dims dropped, so only other dims count (OpSpec.walk)."""
    limit = _native.MAX_RANK
    avals: list[Aval] = list(ctx.avals_in) + list(ctx.avals_out)
    labels = names.operands + ("the result",) * len(ctx.avals_out)
    nbatch = int(params.get("nbatch", 0))
    if nbatch > limit:
        return (f"{nbatch} batch dims (nested vmaps) are above the native kernels' limit of "
                f"{limit}")
    counted: list[tuple[int, str, Aval, str]] = []
    for name, a in zip(labels, avals):
        if names.walk == "batched":
            n, what = len(a.shape) - nbatch, f"past its {nbatch} batch dims"
        else:
            n = sum(1 for d in a.shape if not (isinstance(d, (int, np.integer)) and d == 1))
            what = "of size other than 1"
        counted.append((n, name, a, what))
    n, name, a, what = max(counted, key=lambda c: c[0])
    if n <= limit:
        return None
    detail = f" ({n} dims {what})" if n != len(a.shape) else ""
    return (f"{name} {a.str_short()} has rank {len(a.shape)}{detail}, above the native "
            f"kernels' limit of {limit}")


def _shard_primitive(prim: _compat.Primitive, name: str, lax_rule: mlir.LoweringRule,
                     native_rule: NativeRule, inspects_operands: bool) -> _compat.Primitive:
    """The unpartitioned primitive `name` that custom_partitioning wraps and re-binds on
    local shapes: the outer primitive's abstract eval, the native rule (else lax)."""
    raw = _compat.Primitive(name)
    raw.multiple_results = prim.multiple_results
    raw.def_effectful_abstract_eval(
        lambda *avals, donated=(), **params: prim.abstract_eval(*avals, **params))

    def raw_cpu_rule(ctx: Ctx, *args: ir.Value[Any], donated: tuple[bool, ...] = (),
                     **params: Any) -> IrValues:
        kw = {"donated": donated} if inspects_operands else {}
        out = native_rule(ctx, *args, **params, **kw)
        return out if out is not None else lax_rule(ctx, *args, **params)

    _register_rules(raw, None, raw_cpu_rule,
                    lambda ctx, *a, donated=(), **p: lax_rule(ctx, *a, **p))
    return raw


def _register_rules(prim: _compat.Primitive, op: str | None, cpu_rule: mlir.LoweringRule,
                    lax_rule: mlir.LoweringRule) -> None:
    """One lowering rule for every platform: `cpu_rule` when lowering for CPU alone,
    `lax_rule` otherwise, including a lowering for several platforms at once
    (``jax.export(..., platforms=("cpu", "cuda"))``): such an artifact is one portable
    program, the same on each. (A CPU-specific rule beside a default one would also
    break there: jax 0.10.2's per-platform switch fails on rules that are not cached.)"""
    def rule(ctx: Ctx, *args: ir.Value[Any], **params: Any) -> IrValues:
        platforms = tuple(getattr(ctx, "platforms", None) or ctx.module_context.platforms)
        if platforms == ("cpu",):
            return cpu_rule(ctx, *args, **params)
        if op is not None and "cpu" in platforms:
            explain.record(ctx, op, "lax", params["impl"],
                         f"lowered for several platforms {platforms}")
        return lax_rule(ctx, *args, **params)

    _compat.register_lowering(prim, rule, per_site=True)


def outlined(name: str, impl: Callable[..., Any], multiple_results: bool) -> mlir.LoweringRule:
    """A lowering rule running the jax function `impl(*operands, **params)` as one
    function of the module, named `name`: traced once per (avals, params) in a module
    (and by jit's trace cache once per process), emitted once, and called from every site
    that has them. Lowering `impl` inline instead traced it again at every site, a
    lowering that grew 4-6x faster with the sites than jnp's. XLA inlines the calls
    before it fuses, so the program it compiles is the same."""
    def body(*args: Any, params: tuple[tuple[str, Any], ...]) -> Any:
        out = impl(*args, **dict(params))
        return out if multiple_results else (out,)
    body.__name__ = body.__qualname__ = name
    jitted = jax.jit(body, static_argnames=("params",))

    def rule(ctx: Ctx, *args: ir.Value[Any], **params: Any) -> IrValues:
        items = tuple(sorted(params.items()))
        # Per module: jax keys the emitted function by the jaxpr's identity there.
        key = (_OUTLINED, name, tuple(ctx.avals_in), items)
        cache = ctx.module_context.cached_primitive_lowerings
        jaxpr = cache.get(key)
        if jaxpr is None:
            jaxpr = cache[key] = jitted.trace(*ctx.avals_in, params=items).jaxpr
        out: IrValues = mlir.core_call_lowering(ctx, *args, name=name, call_jaxpr=jaxpr)
        return out
    return rule


_OUTLINED = object()  # marks outlined()'s entries in a module's cache


def definitely_zero(d: object) -> bool:
    """d == 0 for an int or a symbolic dimension (False when it cannot be decided)."""
    try:
        return bool(d == 0)
    except jax.errors.InconclusiveDimensionOperation:
        return False


# --- bit-exact lax glue -------------------------------------------------------------
# XLA:CPU moves a few narrow float types through select, pad and broadcast by converting
# them to float32 and back, which rewrites NaN payloads, quiets signalling NaNs and flushes
# denormals (XLA_INEXACT; pinned by tests/test_auto.py). The lax paths view those as
# unsigned integers. A same-width view is not enough for bfloat16 in a fused loop that
# gathers, then selects or pads (the lax gather): XLA:CPU can fold the two bitcasts away
# and move the values through float32 between them. So the lax gather moves bfloat16 as
# its bytes, uint8[..., 2], split and rejoined with shifts, which XLA cannot fold (a
# width-changing bitcast would be folded no better, and cannot be shape-refined once a
# dimension is symbolic). The cost: XLA no longer fuses an arithmetic producer of src into
# the gather. The select keeps the same-width view, which stays exact in the fusions
# around a select, and a donated operand is still updated in place. The 8-bit floats move
# as uint8. Every other dtype moves as is. tests/test_lax_exact.py pins both paths inside
# the fusions users write; docs/design.md has what was observed.
XLA_INEXACT = frozenset({"bfloat16", "float8_e5m2", "float8_e4m3", "float8_e3m4"})
BYTE_VIEW = frozenset({"bfloat16"})


def view_dims(dtype: DTypeLike, bytes: bool = False) -> tuple[int, ...]:
    """The trailing dims exact_view adds for `dtype`: (itemsize,) for a byte view."""
    dt = np.dtype(dtype)
    return (dt.itemsize,) if bytes and dt.name in BYTE_VIEW else ()


def exact_view(x: jax.Array, bytes: bool = False, every_float: bool = False) -> jax.Array:
    """`x`, or its bits as unsigned integers where XLA:CPU would rewrite them: with
    `bytes`, uint8 with a trailing dim of the itemsize for BYTE_VIEW dtypes; otherwise
    (and for the other dtypes) a same-width uint. `every_float`: every floating dtype as
    a uint of its width, and a packed dtype as its uint8 wire codes (a value XLA's
    partitioner may sum across devices: as integers, one device's bits plus zeros are
    those bits; XLA:CPU has no such sum of 2-bit integers and adds float4 in float16)."""
    dt = np.dtype(x.dtype)
    if every_float and dt.name in SUB_BYTE:
        return _partition.to_wire(x)
    if every_float and dt.name not in XLA_INEXACT and jnp.issubdtype(dt, jnp.floating):
        return lax.bitcast_convert_type(x, np.dtype(f"uint{8 * dt.itemsize}"))
    if bytes and dt.name in BYTE_VIEW:
        # Split by shifts, not by a bitcast to uint8: a bitcast that changes the element
        # width cannot be shape-refined once a dimension is symbolic (jax.export).
        u = lax.bitcast_convert_type(x, np.dtype(f"uint{8 * dt.itemsize}"))
        return lax.concatenate(
            [lax.convert_element_type(lax.shift_right_logical(u, u.dtype.type(8 * k)),
                                      np.uint8)[..., None] for k in range(dt.itemsize)],
            x.ndim)
    if dt.name not in XLA_INEXACT:
        return x
    return lax.bitcast_convert_type(x, np.dtype(f"uint{8 * dt.itemsize}"))


def explicit_sharding(aval: Aval, extra: Sequence[int] = ()) -> jax.sharding.NamedSharding | None:
    """The NamedSharding of `aval` (plus unsharded `extra` dims) where it lies on a mesh
    with explicit axes, whose ops want their results' shardings spelled out; else None."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or not _compat_sharding.explicit_axes(mesh):
        return None
    from jax.sharding import NamedSharding
    spec = _compat_sharding.spec_entries(aval)
    return NamedSharding(mesh, PartitionSpec(*spec, *[None] * len(extra)))


def from_view(v: jax.Array, dtype: DTypeLike) -> jax.Array:
    """Inverse of exact_view for values of `dtype`."""
    dt = np.dtype(dtype)
    if v.dtype == dt:
        return v
    if dt.name in SUB_BYTE:  # wire codes
        return _partition.from_wire(v, dt)
    if v.dtype == np.uint8 and dt.itemsize > 1:  # a byte view: rejoin by shifts
        wide = np.dtype(f"uint{8 * dt.itemsize}")
        u = functools.reduce(lax.bitwise_or, [
            lax.shift_left(lax.convert_element_type(v[..., k], wide), wide.type(8 * k))
            for k in range(dt.itemsize)])
        return lax.bitcast_convert_type(u, dt)
    return lax.bitcast_convert_type(v, dt)
