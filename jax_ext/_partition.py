"""How a primitive's custom call is partitioned over a device mesh: the rules an op gives
(`Spmd`), and the ways jax_ext lowers a partitioned call with them -- through
custom_partitioning (Shardy propagates with the op's rule, XLA asks for each shard's
program); where jax lowers an Explicit mesh's ops through shard_map (jax_partitioning)
or a program is exported on explicit axes, through a shard_map of the same per-shard
computation; and in a program exported on auto axes, as the lax path with the dims the
rule keeps whole constrained so, for XLA to partition (`lower_partitioned` decides which).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _compat, _compat_sharding, _names, _rows
from .auto import explain
from ._compat import Aval, IrValues, PartitionSpec, SpecEntry, ir

mlir = _compat.mlir
Ctx = mlir.LoweringRuleContext
# Spmd.rule's result: a factor name per dim of each operand and of the result (a list per
# result, where the primitive has several), the factors that must never be sharded, and
# the reduction factors (operand dims the result does not have, whose shards the local
# computation combines).
Factors = tuple[list[list[str]], Any, tuple[str, ...], tuple[str, ...]]
# Spmd.partition's result: the operands' specs, the result's, the local computation, and
# how it is laid out where that is worth saying (explain() adds it to the call's reason).
Partition = tuple[list[list[SpecEntry]], Sequence[Any], Callable[..., Any],
                  str | None]


def _none_as_is(avals_in: Sequence[Aval], **params: Any) -> tuple[set[int], set[int]]:
    return set(), set()


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

    A primitive of several results (update_rows) has a factor list per result in `rule`,
    and takes and gives a spec per result in `partition`. ``as_is(avals_in)`` names the
    operands, and the results, that cross the call as they are rather than as wire values
    (see below): a table updated in place, which never moves. It takes the params too.
    """

    def __init__(self, rule: Callable[..., Factors], partition: Callable[..., Partition],
                 as_is: Callable[..., tuple[set[int], set[int]]] | None = None) -> None:
        self.rule, self.partition = rule, partition
        self.as_is: Callable[..., tuple[set[int], set[int]]] = as_is or _none_as_is


# --- values crossing devices -----------------------------------------------------------
# XLA:CPU runs collectives of bfloat16 and the 8-bit floats in a wider float, with converts
# around them, which rewrites NaN payloads; a float all-reduce turns -0.0 into +0.0. So
# every operand and the result of a partitioned call cross the partitioned call's
# boundary as unsigned integers of their width (bool as uint8): the reshards XLA inserts
# there, and the collectives a `local` computation runs, move integers, whose bits
# nothing rewrites. Each shard's computation gets its operands back in their own dtype.
# Packed dtypes cross as uint8, their codes zero-extended through the unsigned integer of
# their width (_PACKED_UINT): XLA:CPU sums float4_e2m1fn in float16 (-0.0 comes back
# +0.0) and has no all-reduce or reduce-scatter of 2-bit integers. The 6-bit floats have
# no such integer in jax (no jax op reads their bits): they cross as they are.
_PACKED_UINT = {"int1": "uint1", "uint1": "uint1", "int2": "uint2", "uint2": "uint2",
                "int4": "uint4", "uint4": "uint4", "float4_e2m1fn": "uint4"}


def _packed_uint(dt: np.dtype[Any]) -> np.dtype[Any]:
    u: np.dtype[Any] = np.dtype(getattr(jnp, _PACKED_UINT[dt.name]))
    return u


def wire_dtype(dtype: Any) -> np.dtype[Any] | None:
    """The unsigned integer dtype a value of `dtype` crosses devices as; None where it
    crosses as it is (unsigned ints of a whole byte or more already, complex, the 6-bit
    floats, whose bits no jax op reads)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.dtype(np.uint8)
    if dt.name in _names.SUB_BYTE:
        return np.dtype(np.uint8) if dt.name in _PACKED_UINT else None
    if dt.kind in "fiV" and dt.itemsize in (1, 2, 4, 8):
        return np.dtype(f"uint{8 * dt.itemsize}")
    return None


def to_wire(x: jax.Array) -> jax.Array:
    """`x` as its wire dtype (see wire_dtype), bit for bit."""
    w = wire_dtype(x.dtype)
    if w is None:
        return x
    if x.dtype == np.bool_:
        return lax.convert_element_type(x, w)
    if x.dtype.name in _PACKED_UINT:
        return lax.convert_element_type(lax.bitcast_convert_type(x, _packed_uint(x.dtype)), w)
    return lax.bitcast_convert_type(x, w)


def from_wire(x: jax.Array, dtype: Any) -> jax.Array:
    """Inverse of to_wire for values of `dtype`."""
    dt = np.dtype(dtype)
    if x.dtype == dt:
        return x
    if dt == np.bool_:
        return lax.ne(x, np.zeros((), x.dtype))
    if dt.name in _PACKED_UINT:
        return lax.bitcast_convert_type(lax.convert_element_type(x, _packed_uint(dt)), dt)
    return lax.bitcast_convert_type(x, dt)


def rewire(x: jax.Array, dtype: Any) -> jax.Array:
    """`x` as `dtype`, bit for bit, where one of the two dtypes is the other's wire dtype
    (to_wire or from_wire, whichever applies)."""
    dt = np.dtype(dtype)
    if x.dtype == dt:
        return x
    return to_wire(x) if is_wire(dt, x.dtype) else from_wire(x, dt)


def is_wire(w: Any, dtype: Any) -> bool:
    """Is `w` the wire dtype of `dtype`? (A dtype compared with None reads it as float64.)"""
    wd = wire_dtype(dtype)
    return wd is not None and wd == np.dtype(w)


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


class _Crossing:
    """How a partitioned call's values cross its boundary: as wire values, but the
    operands and results `spmd.as_is` names; the results as a list where the primitive
    has several."""

    def __init__(self, spmd: Spmd, avals_in: Sequence[Aval], avals_out: Sequence[Aval],
                 multiple: bool, params: Mapping[str, Any]) -> None:
        self.avals_in, self.avals_out, self.multiple = avals_in, avals_out, multiple
        ins, outs = spmd.as_is(avals_in, **params)
        self.ins: set[int] = ins
        self.outs: set[int] = outs

    def to_wire_in(self, xs: Sequence[jax.Array]) -> list[jax.Array]:
        return [x if k in self.ins else to_wire(x) for k, x in enumerate(xs)]

    def from_wire_in(self, xs: Sequence[jax.Array]) -> list[jax.Array]:
        return [x if k in self.ins else from_wire(x, a.dtype)
                for k, (x, a) in enumerate(zip(xs, self.avals_in))]

    def results(self, out: Any) -> list[Any]:
        return list(out) if self.multiple else [out]

    def pack(self, outs: Sequence[Any]) -> Any:
        return tuple(outs) if self.multiple else outs[0]

    def to_wire_out(self, out: Any) -> Any:
        return self.pack([o if k in self.outs else to_wire(o)
                          for k, o in enumerate(self.results(out))])

    def from_wire_out(self, out: Any) -> Any:
        return self.pack([o if k in self.outs else from_wire(o, a.dtype)
                          for k, (o, a) in enumerate(zip(self.results(out), self.avals_out))])

    def out_dtype(self, k: int) -> np.dtype[Any]:
        dt = np.dtype(self.avals_out[k].dtype)
        w = None if k in self.outs else wire_dtype(dt)
        return dt if w is None else w

    def wired(self, local: Callable[..., Any], bind: Callable[..., Any]) -> Callable[..., Any]:
        """`local(bind, *shards)` on wire values: operands back to their dtypes, the
        results to their wire dtypes."""
        def fn(*wired: jax.Array) -> Any:
            return self.to_wire_out(local(bind, *self.from_wire_in(wired)))
        return fn


def partitioned(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd, args: Sequence[ir.Value[Any]],
                 params: dict[str, Any], notes: explain.Notes) -> IrValues:
    """Lowers `raw` (the unpartitioned primitive, same operands and params) through
    custom_partitioning: Shardy propagates shardings with spmd.rule, and XLA calls
    back into spmd.partition to lower one shard. Operands and results cross the call as
    wire values (see wire_dtype), but those spmd.as_is names."""
    from jax.sharding import NamedSharding

    multi = raw.multiple_results
    avals_in, avals_out = ctx.avals_in, ctx.avals_out
    aval_out = avals_out if multi else avals_out[0]
    f_in, f_out, replicated, reduction = spmd.rule(avals_in, aval_out, **params)
    f_outs: list[list[str]] = f_out if multi else [f_out]
    cross = _Crossing(spmd, avals_in, avals_out, multi, params)

    def bind(*a: jax.Array, **p: Any) -> Any:
        return raw.bind(*a, **p)

    def whole(_: Callable[..., Any], *a: jax.Array) -> Any:
        return bind(*a, **params)
    fn = _compat_sharding.custom_partitioning(cross.wired(whole, bind))

    def partition(mesh: jax.sharding.Mesh, arg_shapes: Sequence[jax.ShapeDtypeStruct],
                  result_shape: Any) -> tuple[jax.sharding.Mesh, Callable[..., Any], Any,
                                              tuple[NamedSharding, ...]]:
        o = ([_compat_sharding.spec_entries(r) for r in result_shape] if multi
             else _compat_sharding.spec_entries(result_shape))
        mesh_shape = dict(mesh.shape)
        given = [_compat_sharding.spec_entries(a) for a in arg_shapes]
        in_specs, out_spec, local, how = spmd.partition(o, mesh_shape, avals_in, aval_out,
                                                        given, **params)
        if how:
            notes.add(how)
        out_specs: Sequence[Sequence[SpecEntry]] = out_spec if multi else [out_spec]
        # The shard's whole computation is one equation, lowered by _shard_local_lowering
        # (see there and _compat_sharding.no_mesh for why).
        outs = tuple((tuple(local_size(d, e, mesh_shape) for d, e in zip(a.shape, sp)),
                      cross.out_dtype(k)) for k, (a, sp) in enumerate(zip(avals_out, out_specs)))
        wired = cross.wired(local, bind)
        body = _ShardBody(lambda *a: cross.results(wired(*a)))
        shardings = [NamedSharding(mesh, PartitionSpec(*sp)) for sp in out_specs]
        return (mesh, lambda *a: cross.pack(_shard_local_p.bind(*a, body=body, out=outs)),  # type: ignore[arg-type]
                cross.pack(shardings),
                tuple(NamedSharding(mesh, PartitionSpec(*s)) for s in in_specs))

    order = {f: i for i, f in enumerate(dict.fromkeys(f for v in f_in + f_outs for f in v))}

    def ordered(fs: Sequence[str]) -> tuple[str, ...]:
        # Shardy's verifier wants them in the order the rule introduces them.
        return tuple(sorted(set(fs) & order.keys(), key=order.__getitem__))
    notes.compiled()
    fn.def_partition(partition=partition, sharding_rule=rule_string(f_in, f_outs),
                     need_replication_factors=ordered(replicated),
                     reduction_factors=ordered(reduction))

    def wired_call(*a: jax.Array) -> Any:
        return cross.from_wire_out(fn(*cross.to_wire_in(a)))
    rule: mlir.LoweringRule = mlir.lower_fun(wired_call, multiple_results=multi)
    return rule(ctx, *args)


def shard_mapped(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd, args: Sequence[ir.Value[Any]],
                  params: dict[str, Any], mesh: Any, notes: explain.Notes) -> IrValues:
    """Lowers `raw` partitioned by `spmd` as a shard_map over the mesh's Explicit axes:
    what jax does with its own ops under jax_partitioning (_compat_sharding.shard_map_partitioning),
    where custom_partitioning has no rule. Operands whose sharding differs from the one
    spmd.partition asks for are resharded first, as XLA would for custom_partitioning;
    as for custom_partitioning, values cross devices as wire values."""
    from jax.sharding import NamedSharding
    multi = raw.multiple_results
    avals_in, avals_out = ctx.avals_in, ctx.avals_out
    aval_out = avals_out if multi else avals_out[0]
    cross = _Crossing(spmd, avals_in, avals_out, multi, params)
    wants = [_compat_sharding.spec_entries(a) for a in avals_out]
    mesh_shape = dict(zip(mesh.axis_names, mesh.axis_sizes))
    given = [_compat_sharding.spec_entries(a) for a in avals_in]
    in_specs, out_spec, local, how = spmd.partition(wants if multi else wants[0], mesh_shape,
                                                    avals_in, aval_out, given, **params)
    if how:
        notes.add(how)
    out_specs: Sequence[Sequence[SpecEntry]] = out_spec if multi else [out_spec]
    bind = lambda *a, **p: raw.bind(*a, **p)  # noqa: E731

    def fn(*xs: jax.Array) -> Any:
        xs = tuple(x if _compat_sharding.spec_entries(jax.typeof(x)) == tuple(s)
                   else _compat.reshard(x, NamedSharding(mesh, PartitionSpec(*s)))
                   for x, s in zip(cross.to_wire_in(xs), in_specs))
        out = cross.results(jax.shard_map(
            cross.wired(local, bind), mesh=mesh,
            in_specs=tuple(PartitionSpec(*s) for s in in_specs),
            out_specs=cross.pack([PartitionSpec(*s) for s in out_specs]),
            axis_names=set(mesh.explicit_axes), check_vma=False)(*xs))
        out = [o if tuple(s) == tuple(w) else
               _compat.reshard(o, NamedSharding(mesh, PartitionSpec(*w)))
               for o, s, w in zip(out, out_specs, wants)]
        return cross.from_wire_out(cross.pack(out))
    rule: mlir.LoweringRule = mlir.lower_fun(fn, multiple_results=multi)
    return rule(ctx, *args)


def constrained(ctx: Ctx, raw: _compat.Primitive, spmd: Spmd, args: Sequence[ir.Value[Any]],
                params: dict[str, Any], mesh: Any) -> IrValues | None:
    """`raw` (the lax path) for XLA to partition with no Python callback (a program
    exported on auto mesh axes, where nothing says how the operands are sharded): every
    operand dim that spmd.rule keeps whole on each device (its `replicated` factors: a
    scatter-add's index dim, padding columns) is constrained so, as wire values, and XLA
    propagates the rest. A gradient's cotangent rows are then all-gathered as integers
    and each device adds them into its own block of the gradient, in index order, as
    under custom_partitioning. None where the rule keeps no dim whole (the plain lax
    call, which XLA partitions as it is)."""
    from jax.sharding import NamedSharding
    avals_in: Sequence[Aval] = ctx.avals_in
    multi = raw.multiple_results
    f_in, _, replicated, _ = spmd.rule(avals_in, ctx.avals_out if multi else ctx.avals_out[0],
                                       **params)
    whole = [[f in replicated and not _rows.is_one(d) for f, d in zip(fs, a.shape)]
             for fs, a in zip(f_in, avals_in)]
    free = jax.sharding.PartitionSpec.UNCONSTRAINED  # a dim XLA propagates to
    if not any(map(any, whole)):
        return None

    def fn(*xs: jax.Array) -> Any:
        kept = []
        for x, w in zip(xs, whole):
            if any(w):
                spec = NamedSharding(mesh, jax.sharding.PartitionSpec(  # type: ignore[no-untyped-call]  # unannotated in jax
                    *[None if k else free for k in w]))
                x = from_wire(lax.with_sharding_constraint(  # type: ignore[no-untyped-call]  # unannotated in jax
                    to_wire(x), spec), x.dtype)
            kept.append(x)
        return raw.bind(*kept, **params)
    rule: mlir.LoweringRule = mlir.lower_fun(fn, multiple_results=multi)
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
    and auto_axes is not allowed; elsewhere XLA partitions its ops, in a program
    exported on auto axes with the dims `spmd` keeps whole constrained so (`constrained`)."""
    if _compat_sharding.spmd_mesh_shape(ctx) is not None:
        mesh = _compat_sharding.shard_map_partitioning()
        if mesh is not None:
            return shard_mapped(ctx, raw, spmd, args, params, mesh, notes)
        return partitioned(ctx, raw, spmd, args, params, notes) \
            if partition_lax or not lax_path else None
    exported = _compat_sharding.export_mesh(ctx)
    if exported is not None and (partition_lax or not lax_path):
        return shard_mapped(ctx, raw, spmd, args, params, exported, notes)
    auto_mesh = _compat_sharding.exported_auto_mesh(ctx)
    if auto_mesh is not None and lax_path:
        return constrained(ctx, raw, spmd, args, params, auto_mesh)
    return None


class _ShardBody:
    """A shard's computation as an equation parameter, returning a list of its results:
    hashed and compared by identity."""

    def __init__(self, fn: Callable[..., list[jax.Array]]) -> None:
        self.fn = fn


# One shard of a partitioned call: `body(*shards)` on local shapes, its results `out`
# ((shape, dtype) of each). XLA asks for it while it compiles, on the thread that called
# jit on jax 0.12, where a `jax.set_mesh` of Explicit axes is still in force: any op
# traced there would be typed on that mesh and lowered with sharding constraints the
# per-device program cannot run. So the body is traced here, in this primitive's
# lowering, with untyped operands and no mesh set: the per-device program is the same on
# every jax and under any mesh.
_shard_local_p = _compat.Primitive(_names.SHARD_LOCAL)


def _shard_local_abstract_eval(*avals: Aval, body: _ShardBody,
                               out: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
                               ) -> list[Aval]:
    return [jax.core.ShapedArray(shape, dtype) for shape, dtype in out]


def _shard_local_lowering(ctx: Ctx, *args: ir.Value[Any], body: _ShardBody,
                          out: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]) -> IrValues:
    with _compat_sharding.no_mesh():
        # LoweringRuleContext.replace is unannotated in jax.
        plain = ctx.replace(  # type: ignore[no-untyped-call]
            avals_in=[_compat_sharding.without_sharding(a) for a in ctx.avals_in],
            avals_out=[_compat_sharding.without_sharding(a) for a in ctx.avals_out])
        rule: mlir.LoweringRule = mlir.lower_fun(body.fn, multiple_results=True)
        return rule(plain, *args)


_shard_local_p.multiple_results = True  # one per result of the partitioned primitive
_shard_local_p.def_abstract_eval(_shard_local_abstract_eval)
_compat.register_lowering(_shard_local_p, _shard_local_lowering)
