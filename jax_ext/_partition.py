"""How a primitive's custom call is partitioned over a device mesh: the rules an op gives
(`Spmd`), and the two ways jax_ext lowers a partitioned call with them -- through
custom_partitioning (Shardy propagates with the op's rule, XLA asks for each shard's
program) and, where jax lowers an Explicit mesh's ops through shard_map (jax_partitioning)
or a program is exported on explicit axes, through a shard_map of the same per-shard
computation (`lower_partitioned` decides which).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from . import _compat, _compat_sharding, _names
from .auto import explain
from ._compat import Aval, IrValues, PartitionSpec, SpecEntry, ir

mlir = _compat.mlir
Ctx = mlir.LoweringRuleContext
# Spmd.rule's result: a factor name per dim of each operand and of the result, the
# factors that must never be sharded, and the reduction factors (operand dims the result
# does not have, whose shards the local computation combines).
Factors = tuple[list[list[str]], list[str], tuple[str, ...], tuple[str, ...]]
# Spmd.partition's result: the operands' specs, the result's, the local computation, and
# how it is laid out where that is worth saying (explain() adds it to the call's reason).
Partition = tuple[list[list[SpecEntry]], Sequence[SpecEntry], Callable[..., jax.Array],
                  str | None]


class Spmd:
    """How a primitive's native custom call partitions over a device mesh (see
    `register`). Both callbacks take the primitive's operand avals, its result aval and
    its params, and describe the dims with per-dim lists; a spec entry is what a
    PartitionSpec holds for one dim (None, an axis name or a tuple of names).

    * ``rule(avals_in, aval_out, **params) -> (factors_in, factors_out, replicated,
      reduction)``: the Shardy sharding rule, one factor name per dim of every operand
      and of the result (dims sharing a name are sharded alike; a factor that must never
      be sharded -- a dim the kernel indexes globally -- is listed in `replicated`; an
      operand's factor the result does not have, which `partition` may leave sharded and
      combine, in `reduction`).
    * ``partition(out_spec, mesh_shape, avals_in, aval_out, arg_specs, **params) ->
      (in_specs, out_spec, local)``: given the result's spec that Shardy chose and the
      specs the operands arrive with, the operand and result specs the local computation
      accepts (XLA reshards operands that differ), a note for explain() (or None) and
      ``local(bind, *shards)``, the
      per-device computation, where ``bind(*args, **params)`` binds the unpartitioned
      primitive on local shapes. `local` may use collectives over the mesh's axes.
    """

    def __init__(self, rule: Callable[..., Factors],
                 partition: Callable[..., Partition]) -> None:
        self.rule, self.partition = rule, partition


# --- values crossing devices -----------------------------------------------------------
# XLA:CPU runs collectives of bfloat16 and the 8-bit floats in a wider float, with converts
# around them, which rewrites NaN payloads; a float all-reduce turns -0.0 into +0.0. So
# every operand and the result of a partitioned call cross the partitioned call's
# boundary as unsigned integers of their width (bool as uint8): the reshards XLA inserts
# there, and the collectives a `local` computation runs, move integers, whose bits
# nothing rewrites. Each shard's computation gets its operands back in their own dtype.

def wire_dtype(dtype: Any) -> np.dtype[Any] | None:
    """The unsigned integer dtype a value of `dtype` crosses devices as; None where it
    crosses as it is (unsigned ints already, complex, sub-byte types)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.dtype(np.uint8)
    if dt.kind in "fiV" and dt.itemsize in (1, 2, 4, 8) and dt.name not in _names.SUB_BYTE:
        return np.dtype(f"uint{8 * dt.itemsize}")
    return None


def to_wire(x: jax.Array) -> jax.Array:
    """`x` as its wire dtype (see wire_dtype), bit for bit."""
    w = wire_dtype(x.dtype)
    if w is None:
        return x
    if x.dtype == np.bool_:
        return lax.convert_element_type(x, w)
    return lax.bitcast_convert_type(x, w)


def from_wire(x: jax.Array, dtype: Any) -> jax.Array:
    """Inverse of to_wire for values of `dtype`."""
    dt = np.dtype(dtype)
    if x.dtype == dt:
        return x
    if dt == np.bool_:
        return lax.ne(x, np.zeros((), x.dtype))
    return lax.bitcast_convert_type(x, dt)


def axes_of(entry: SpecEntry) -> tuple[str, ...]:
    """The mesh axes of one spec entry, major first."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def rule_string(factors_in: Sequence[Sequence[str]], factors_out: Sequence[Sequence[str]]
                ) -> str:
    """Einsum-like Shardy rule text; a scalar is an empty entry."""
    side: Callable[[Sequence[Sequence[str]]], str] = (
        lambda vals: ", ".join(" ".join(f) for f in vals))
    return f"{side(factors_in)} -> {side(factors_out)}"


def local_size(n: int, entry: SpecEntry, mesh_shape: Mapping[str, int]) -> int:
    """Size of one shard of a dim of size n sharded by the spec entry (ceil: XLA pads)."""
    k = 1
    for a in (() if entry is None else (entry,) if isinstance(entry, str) else entry):
        k *= mesh_shape[a]
    return -(-n // k)


def merge_specs(what: str, candidates: Sequence[Sequence[SpecEntry]]) -> list[SpecEntry]:
    """The result spec from, per result dim, the spec entries of the operand dims that
    lie along it (None: unsharded). Two different shardings of one dim, or one mesh axis
    on two dims, is an error, as for jax's own ops under explicit axes."""
    out: list[SpecEntry] = []
    used: set[str] = set()
    for d, cands in enumerate(candidates):
        vals = {c for c in cands if c is not None}
        if len(vals) > 1:
            raise _compat_sharding.ShardingTypeError(
                f"{what}: operands shard result dim {d} differently: {sorted(map(str, vals))};"
                " reshard one of them (jax.sharding.reshard)")
        e = vals.pop() if vals else None
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        if used & set(axes):
            raise _compat_sharding.ShardingTypeError(
                f"{what}: mesh axes {sorted(used & set(axes))} would shard two result dims")
        used |= set(axes)
        out.append(e)
    return out


def _wired(local: Callable[..., jax.Array], bind: Callable[..., jax.Array],
           avals_in: Sequence[Aval], aval_out: Aval) -> Callable[..., jax.Array]:
    """`local(bind, *shards)` on wire values: operands back to their dtypes, the result
    to its wire dtype."""
    def fn(*wired: jax.Array) -> jax.Array:
        shards = [from_wire(x, a.dtype) for x, a in zip(wired, avals_in)]
        return to_wire(local(bind, *shards))
    return fn


def _out_dtype(aval: Aval) -> np.dtype[Any]:
    w = wire_dtype(aval.dtype)
    return np.dtype(aval.dtype) if w is None else w


def partitioned(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd, args: Sequence[ir.Value[Any]],
                 params: dict[str, Any], notes: explain.Notes) -> IrValues:
    """Lowers `raw` (the unpartitioned primitive, same operands and params) through
    custom_partitioning: Shardy propagates shardings with spmd.rule, and XLA calls
    back into spmd.partition to lower one shard. Operands and result cross the call as
    wire values (see wire_dtype)."""
    from jax.sharding import NamedSharding

    avals_in, aval_out = ctx.avals_in, ctx.avals_out[0]
    f_in, f_out, replicated, reduction = spmd.rule(avals_in, aval_out, **params)
    def bind(*a: jax.Array, **p: Any) -> jax.Array:
        out: jax.Array = raw.bind(*a, **p)
        return out

    def whole(_: Callable[..., jax.Array], *a: jax.Array) -> jax.Array:
        return bind(*a, **params)
    fn = _compat_sharding.custom_partitioning(_wired(whole, bind, avals_in, aval_out))

    def partition(mesh: jax.sharding.Mesh, arg_shapes: Sequence[jax.ShapeDtypeStruct],
                  result_shape: jax.ShapeDtypeStruct
                  ) -> tuple[jax.sharding.Mesh, Callable[..., jax.Array], NamedSharding,
                             tuple[NamedSharding, ...]]:
        o = _compat_sharding.spec_entries(result_shape)
        mesh_shape = dict(mesh.shape)
        given = [_compat_sharding.spec_entries(a) for a in arg_shapes]
        in_specs, out_spec, local, how = spmd.partition(o, mesh_shape, avals_in, aval_out,
                                                        given, **params)
        if how:
            notes.add(how)
        # The shard's whole computation is one equation, lowered by _shard_local_lowering
        # (see there and _compat_sharding.no_mesh for why).
        out = (tuple(local_size(d, e, mesh_shape) for d, e in zip(aval_out.shape, out_spec)),
               _out_dtype(aval_out))
        body = _ShardBody(_wired(local, bind, avals_in, aval_out))
        return (mesh, lambda *a: _shard_local_p.bind(*a, body=body, out=out),
                NamedSharding(mesh, PartitionSpec(*out_spec)),
                tuple(NamedSharding(mesh, PartitionSpec(*s)) for s in in_specs))

    order = {f: i for i, f in enumerate(dict.fromkeys(f for v in f_in + [f_out] for f in v))}

    def ordered(fs: Sequence[str]) -> tuple[str, ...]:
        # Shardy's verifier wants them in the order the rule introduces them.
        return tuple(sorted(set(fs) & order.keys(), key=order.__getitem__))
    notes.compiled()
    fn.def_partition(partition=partition, sharding_rule=rule_string(f_in, [f_out]),
                     need_replication_factors=ordered(replicated),
                     reduction_factors=ordered(reduction))

    def wired_call(*a: jax.Array) -> jax.Array:
        return from_wire(fn(*map(to_wire, a)), aval_out.dtype)
    rule: mlir.LoweringRule = mlir.lower_fun(wired_call, multiple_results=False)
    return rule(ctx, *args)


def shard_mapped(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd, args: Sequence[ir.Value[Any]],
                  params: dict[str, Any], mesh: Any, notes: explain.Notes) -> IrValues:
    """Lowers `raw` partitioned by `spmd` as a shard_map over the mesh's Explicit axes:
    what jax does with its own ops under jax_partitioning (_compat_sharding.shard_map_partitioning),
    where custom_partitioning has no rule. Operands whose sharding differs from the one
    spmd.partition asks for are resharded first, as XLA would for custom_partitioning;
    as for custom_partitioning, values cross devices as wire values."""
    from jax.sharding import NamedSharding
    avals_in, aval_out = ctx.avals_in, ctx.avals_out[0]
    want = _compat_sharding.spec_entries(aval_out)
    mesh_shape = dict(zip(mesh.axis_names, mesh.axis_sizes))
    given = [_compat_sharding.spec_entries(a) for a in avals_in]
    in_specs, out_spec, local, how = spmd.partition(want, mesh_shape, avals_in, aval_out,
                                                    given, **params)
    if how:
        notes.add(how)
    bind = lambda *a, **p: raw.bind(*a, **p)  # noqa: E731

    def fn(*xs: jax.Array) -> jax.Array:
        xs = tuple(to_wire(x) if _compat_sharding.spec_entries(jax.typeof(x)) == tuple(s)
                   else _compat.reshard(to_wire(x), NamedSharding(mesh, PartitionSpec(*s)))
                   for x, s in zip(xs, in_specs))
        out: jax.Array = jax.shard_map(
            _wired(local, bind, avals_in, aval_out), mesh=mesh,
            in_specs=tuple(PartitionSpec(*s) for s in in_specs),
            out_specs=PartitionSpec(*out_spec), axis_names=set(mesh.explicit_axes),
            check_vma=False)(*xs)
        if tuple(out_spec) != tuple(want):
            out = _compat.reshard(out, NamedSharding(mesh, PartitionSpec(*want)))
        return from_wire(out, aval_out.dtype)
    rule: mlir.LoweringRule = mlir.lower_fun(fn, multiple_results=False)
    return rule(ctx, *args)


def lower_partitioned(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd,
                      args: Sequence[ir.Value[Any]], params: dict[str, Any], *, lax_path: bool,
                      partition_lax: bool, notes: explain.Notes) -> IrValues | None:
    """`raw` partitioned by `spmd` where the call site lies on a mesh of several devices,
    else None (the caller lowers the plain call): through shard_map where jax lowers an
    Explicit mesh's ops so (jax_partitioning) or the program is exported on explicit axes
    (a shard_map region serializes), else through custom_partitioning. The lax path
    (`lax_path`) partitions by `spmd` only where `partition_lax` says so, or under
    jax_partitioning, where jax's gather and scatter cannot infer every result sharding
    and auto_axes is not allowed; elsewhere XLA partitions its ops."""
    if _compat_sharding.spmd_mesh_shape(ctx) is not None:
        mesh = _compat_sharding.shard_map_partitioning()
        if mesh is not None:
            return shard_mapped(ctx, raw, spmd, args, params, mesh, notes)
        return partitioned(ctx, raw, spmd, args, params, notes) \
            if partition_lax or not lax_path else None
    exported = _compat_sharding.export_mesh(ctx)
    if exported is not None and (partition_lax or not lax_path):
        return shard_mapped(ctx, raw, spmd, args, params, exported, notes)
    return None


class _ShardBody:
    """A shard's computation as an equation parameter: hashed and compared by identity."""

    def __init__(self, fn: Callable[..., jax.Array]) -> None:
        self.fn = fn


# One shard of a partitioned call: `body(*shards)` on local shapes, result `out` (shape,
# dtype). XLA asks for it while it compiles, on the thread that called jit on jax 0.12,
# where a `jax.set_mesh` of Explicit axes is still in force: any op traced there would be
# typed on that mesh and lowered with sharding constraints the per-device program cannot
# run. So the body is traced here, in this primitive's lowering, with untyped operands
# and no mesh set: the per-device program is the same on every jax and under any mesh.
_shard_local_p = _compat.Primitive(_names.SHARD_LOCAL)


def _shard_local_abstract_eval(*avals: Aval, body: _ShardBody,
                               out: tuple[tuple[int, ...], np.dtype[Any]]) -> Aval:
    return jax.core.ShapedArray(out[0], out[1])


def _shard_local_lowering(ctx: Ctx, *args: ir.Value[Any], body: _ShardBody,
                          out: tuple[tuple[int, ...], np.dtype[Any]]) -> IrValues:
    with _compat_sharding.no_mesh():
        # LoweringRuleContext.replace is unannotated in jax.
        plain = ctx.replace(  # type: ignore[no-untyped-call]
            avals_in=[_compat_sharding.without_sharding(a) for a in ctx.avals_in],
            avals_out=[_compat_sharding.without_sharding(a) for a in ctx.avals_out])
        rule: mlir.LoweringRule = mlir.lower_fun(body.fn, multiple_results=False)
        return rule(plain, *args)


_shard_local_p.def_abstract_eval(_shard_local_abstract_eval)
_compat.register_lowering(_shard_local_p, _shard_local_lowering)
