"""The version-dependent and private jax pieces jax_ext's sharding uses: partitioning a
custom call (custom_partitioning, the lowering's mesh), sharding in types (explicit mesh
axes), shard_map's varying manual axes, and lowering one shard. Like ``_compat.py``, of
which it is the sharding half, it is the only place these are imported; every private
name is listed in ``_compat.PRIVATE_NAMES``.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import jax

from ._compat import JAX_VERSION, Aval, PartitionSpec, Primitive, SpecEntry, fallback, mlir

# --- SPMD partitioning --------------------------------------------------------------
# jax_ext partitions its custom calls with jax.experimental.custom_partitioning (the
# mechanism jax's own cuDNN kernels use). It needs two private pieces: the set of
# primitives whose lowering must see the device assignment, and the lowering's axis
# context.
# jax leaves custom_partitioning unannotated: typed here by what jax_ext does with it
# (wrap a function, then def_partition).
from jax.experimental.custom_partitioning import custom_partitioning as _cp
from jax._src import dispatch as _dispatch
# Shardy's sharding group (what jax's shard_alike, gone in jax 0.12, lowered to): values
# in one group get one sharding.
from jax._src.lib.mlir.dialects import sdy as _sdy  # type: ignore[attr-defined, unused-ignore]

custom_partitioning: Callable[[Callable[..., Any]], Any] = _cp
# The axis context of a jit lowering that will be partitioned (not a shard_map body or
# pmap); public in jax.interpreters.mlir at both ends of the window.
ShardingContext = mlir.ShardingContext


_groups = itertools.count()


def sharding_group(*values: Any) -> None:
    """Puts the lowered `values` (of one shape) in one new Shardy sharding group."""
    g = next(_groups)
    for v in values:
        _sdy.sharding_group(v, g)


def require_devices_during_lowering(prim: Primitive) -> bool:
    """Asks jax to lower `prim` with its device assignment known (custom_partitioning
    needs it). True: the lowering may partition `prim`."""
    _dispatch.prim_requires_devices_during_lowering.add(prim)
    return True


# jax_use_shardy_partitioner=False selects XLA's GSPMD partitioner, which cannot run a
# custom_partitioning call that has only a Shardy rule. jax 0.12 deprecated the option
# ("Shardy is now always enabled; this flag has no effect"; jax 0.10.2 still reads it), so
# jax_ext reads it only on the releases before: reading a dead option would test nothing,
# and once jax removes it, reading it would fail every partitioned call.
GSPMD_SELECTABLE = JAX_VERSION < (0, 12)


def gspmd() -> bool:
    """Is XLA's GSPMD partitioner selected (jax_use_shardy_partitioner=False, on a jax
    where that option has an effect)?"""
    # jax 0.10.2's Config stub lacks this flag, which its config defines.
    return GSPMD_SELECTABLE and not jax.config.jax_use_shardy_partitioner  # type: ignore[attr-defined, unused-ignore]


def spmd_mesh_shape(ctx: mlir.LoweringRuleContext) -> dict[str, int] | None:
    """{axis name: size} of the mesh a custom call lowered in `ctx` will be partitioned
    over, or None when it must be lowered as is: one device, a body where every mesh
    axis is manual (shard_map), a program lowered for jax.export (custom_partitioning
    cannot be serialized), the GSPMD partitioner (`gspmd`), or
    a sharding without a named mesh. Any surprise in jax's lowering context is a
    fallback: the call lowers unpartitioned (XLA all-gathers its operands)."""
    try:
        mc = ctx.module_context
        if mc.lowering_parameters.for_export or gspmd():
            return None
        ac = mc.axis_context
        if not isinstance(ac, ShardingContext):
            return None  # shard_map bodies (SPMDAxisContext), pmap (replica context)
        devices, am = ac.device_assignment, ac.abstract_mesh
        if devices is None or len(devices) <= 1 or am is None or am.empty:
            return None
        return dict(zip(am.axis_names, am.axis_sizes))
    except Exception as e:
        fallback("jax's lowering context did not say how the call is partitioned: it "
                 "lowers unpartitioned (replicated)", e)
        return None


def several_devices(ctx: mlir.LoweringRuleContext) -> bool:
    """Will XLA partition the program `ctx` lowers across several devices (a jit or an
    export on a mesh, not a shard_map body, pmap or the GSPMD partitioner)?"""
    try:
        ac = ctx.module_context.axis_context
        return isinstance(ac, ShardingContext) and ac.num_devices > 1 and not gspmd()
    except Exception as e:
        fallback("jax's lowering context did not say how many devices the program runs "
                 "on: it lowers as for one", e)
        return False


def export_mesh(ctx: mlir.LoweringRuleContext) -> Any | None:
    """The abstract mesh with Explicit axes that a call lowered for jax.export is typed on,
    or None. custom_partitioning's partitioner is a Python callback, which jax cannot
    serialize; a shard_map region serializes, so there the call is partitioned through
    one (`_partition.shard_mapped`). With auto axes nothing in the lowering says how the
    operands are sharded: None."""
    try:
        mc = ctx.module_context
        if not mc.lowering_parameters.for_export or gspmd():
            return None
        if not isinstance(mc.axis_context, ShardingContext):
            return None  # shard_map bodies, pmap
        for a in ctx.avals_in:
            mesh = getattr(getattr(a, "sharding", None), "mesh", None)
            if (mesh is not None and not mesh.empty and not mesh.are_all_axes_manual
                    and mesh.explicit_axes):
                return mesh
        return None
    except Exception as e:
        fallback("jax's lowering context did not say how an exported call is sharded: it "
                 "lowers unpartitioned (replicated)", e)
        return None


def exported_auto_sharded(ctx: mlir.LoweringRuleContext) -> bool:
    """Is the call lowered for jax.export, for several devices, with no Explicit mesh axis
    to partition it by (`export_mesh`)? XLA partitions such a program after it is
    deserialized, with no Python callback: a custom call would see whole operands."""
    try:
        mc = ctx.module_context
        if not mc.lowering_parameters.for_export:
            return False
        ac = mc.axis_context
        return (isinstance(ac, ShardingContext) and ac.num_devices > 1
                and export_mesh(ctx) is None)
    except Exception as e:
        fallback("jax's lowering context did not say how many devices an exported call "
                 "runs on: it lowers as for one", e)
        return False


def exported_auto_mesh(ctx: mlir.LoweringRuleContext) -> Any | None:
    """The abstract mesh of a call that `exported_auto_sharded`, all its axes Auto (the
    call may lie in an auto_axes region of an Explicit mesh), or None (none named, or
    the GSPMD partitioner).
    Sharding constraints on its axes serialize (`_partition.constrained`)."""
    from jax.sharding import AxisType
    if gspmd() or not exported_auto_sharded(ctx):
        return None
    am = getattr(ctx.module_context.axis_context, "abstract_mesh", None)
    if am is None or am.empty:
        return None
    return am.update_axis_types({a: AxisType.Auto for a in am.axis_names})


def shard_map_partitioning() -> Any | None:
    """The abstract mesh, when jax lowers the ops of an Explicit mesh through shard_map
    (jax_partitioning on, jax 0.12+: custom_partitioning has no rule there); else None."""
    # jax 0.10.2 has no such option; its Config stub has no attributes for options.
    if not getattr(jax.config, "jax_partitioning", False):
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.are_all_axes_manual or not mesh.explicit_axes:
        return None
    return mesh


# --- sharding in types (explicit mesh axes) ----------------------------------------------
from jax._src.core import ShardingTypeError as ShardingTypeError  # noqa: E402


def explicit_axes(mesh: Any) -> bool:
    """Does `mesh` have an Explicit axis (sharding in types)? A mesh without axis types
    has none."""
    from jax.sharding import AxisType
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def auto_axes(fn: Callable[..., jax.Array],
              out_sharding: jax.sharding.NamedSharding) -> Callable[..., jax.Array]:
    """`jax.sharding.auto_axes(fn, out_sharding=...)` over the mesh's Explicit axes only.
    Inside a partial-manual shard_map the mesh also has Manual axes, which auto_axes may
    not turn Auto (jax raises NotImplementedError); they stay as they are."""
    from jax.sharding import AxisType
    mesh = out_sharding.mesh
    axes = tuple(n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit)
    wrapped: Callable[..., jax.Array] = jax.sharding.auto_axes(fn, axes=axes,
                                                               out_sharding=out_sharding)
    return wrapped


def spec_entries(aval: Aval) -> tuple[SpecEntry, ...]:
    """The PartitionSpec entry of every dim of `aval` (an aval, or anything with `ndim`
    and `sharding`, such as a ShapeDtypeStruct): None where unsharded or unknown."""
    found = getattr(getattr(aval, "sharding", None), "spec", None)
    spec = () if found is None else tuple(found)
    ndim: int = aval.ndim
    return spec + (None,) * (ndim - len(spec))


def typed_result(prim: str, avals_in: Sequence[Aval], like: Aval, spec: Sequence[SpecEntry],
                 **updates: Any) -> Aval:
    """`like.update(**updates)`, typed with the result spec `spec` when an operand's type
    carries a mesh (explicit axes); unchanged otherwise (Auto axes: the partitioner
    decides, as for any jax op). Inside shard_map the operands' varying axes must match
    (see varying_update; `prim` names the primitive in jax's error)."""
    sh = next((a.sharding for a in avals_in if not getattr(
        getattr(getattr(a, "sharding", None), "mesh", None), "empty", True)), None)
    updates.update(varying_update(prim, avals_in, like))
    if sh is None:
        return like.update(**updates)
    return like.update(sharding=sh.update(spec=PartitionSpec(*spec)), **updates)


# --- varying manual axes (shard_map's check_vma typing) ----------------------------------
# Inside shard_map, jax types each value with the mesh axes it varies over (`aval.mat.varying`
# at both ends of the window). lax's primitives bind through `core.auto_insert_reshard`,
# which makes invariant operands varying (`pvary`; its transpose is a psum, so a replicated
# operand's gradient is summed over devices), and type the result with
# `core.standard_vma_rule`, which raises ValueError "requires varying manual axes to match"
# when the operands still differ. Which operands auto_insert_reshard pvarys is jax's
# `jax_auto_pcast` option (and its version's reading of it): all of them while it is True
# (the default); with it False, none on jax 0.10.2, and only integer and bool ones on jax
# 0.12. jax_ext's primitives call the same two functions, so they accept and reject
# exactly what jnp.where / jnp.take do under either setting, forward and under every
# transform. There is no public spelling of either (`lax.pcast` takes explicit axes).

def varying_update(prim: str, avals_in: Sequence[Aval], like: Aval) -> dict[str, Any]:
    """The `update` keywords that type a result as varying over the operands' axes (empty
    when nothing varies, so outside shard_map nothing changes); jax's ValueError when the
    operands' axes differ (only reachable when jax_auto_pcast is False)."""
    from jax._src import core as _src_core
    rule: Callable[..., frozenset[Any]] = _src_core.standard_vma_rule
    axes = frozenset(rule(prim, *(a for a in avals_in if getattr(a, "mat", None) is not None)))
    mat = getattr(like, "mat", None)
    if mat is None or axes == frozenset(mat.varying):
        return {}
    return {"manual_axis_type": mat.update(varying=axes)}


# --- lowering one shard of a custom_partitioning call ---------------------------------
# XLA asks custom_partitioning's `partition` callback for the per-device program while it
# compiles. jaxlib 0.10.2 runs that callback on a thread of its own, where no mesh is set;
# jaxlib 0.12 runs it on the thread that called jit, so under `jax.set_mesh` with
# Explicit axes the per-device function is traced with every value typed on that mesh,
# and jax wraps each op's result in a sharding constraint. The per-device module is never
# partitioned again, so those constraints reach the CPU backend as `Sharding` custom
# calls it cannot run ("No registered implementation for untyped custom call to Sharding
# for Host"). jax_ext therefore lowers each shard's computation itself, with its values
# untyped and no mesh set, as it is on 0.10.2 (see _partition.partitioned).

def no_mesh() -> AbstractContextManager[None]:
    """A context in which no abstract mesh is set (values trace without sharding types)."""
    from jax.sharding import AbstractMesh, use_abstract_mesh
    return use_abstract_mesh(AbstractMesh((), ()))


def without_sharding(aval: Aval) -> Aval:
    """`aval` without a mesh in its type (a ShapedArray typed on no mesh); others as is."""
    if getattr(aval, "sharding", None) is None or not hasattr(aval, "ndim"):
        return aval
    from jax.sharding import AbstractMesh, NamedSharding
    return aval.update(sharding=NamedSharding(AbstractMesh((), ()),
                                              PartitionSpec(*[None] * aval.ndim)))
