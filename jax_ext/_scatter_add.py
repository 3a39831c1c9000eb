"""scatter-add: the transpose of gather with respect to ``src``, a primitive of its own.

``jax_ext_scatter_add(ct, offsets, index, num_indices)`` adds the cotangent rows ``ct``
(the shape of a gather's result, ``(*batch, n, *mid, L)``) into a zero ``src`` at the rows
the gather read: row ``i`` goes to ``offsets[0], ..., offsets[dim-1], offsets[dim] +
index[i]``; pad rows and padding columns add nothing. Static params as gather's (``dim``,
``check_bounds``, ``nbatch``, ``impl``), plus ``src_shape`` (one src), ``out_bshape``
(the result's batch dims, 1 where several batch elements accumulate into one result) and
``wire_of``: None, or the name of the result's dtype where ``ct`` holds its wire values
(_partition.wire_dtype: a partitioned call's cotangent as the collective that gathered it
delivers it, which the kernel reads as that dtype; a conversion first would be a copy).
Its transpose binds gather, and gather's transpose binds it (both primitives live in
``_primitives.py``; _gather.py imports this module, never the other way).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from . import _compat, _compat_sharding, _lowering, _names, _partition, _rows
from ._compat import Aval, PartitionSpec, Primal, SpecEntry, Tangent, ir
from ._primitives import gather_p, scatter_add_p

Zero = _compat.Zero


def _scatter_abstract_eval(ct: Aval, offsets: Aval, index: Aval, num: Aval, *, dim: int,
                           src_shape: Sequence[int], out_bshape: Sequence[int],
                           check_bounds: bool, nbatch: int, impl: str,
                           wire_of: str | None) -> Aval:
    if wire_of is not None and _partition.wire_dtype(wire_of) != ct.dtype:
        raise TypeError(f"{_names.SCATTER_ADD.primitive}: ct {ct.dtype} is not the wire "
                        f"dtype of {wire_of}")
    bshape = _rows.batch_shape((ct, offsets, index, num), nbatch)
    if len(out_bshape) != nbatch or any(o not in (1, b) for o, b in zip(out_bshape, bshape)):
        raise ValueError(f"{_names.SCATTER_ADD.primitive}: out_bshape {out_bshape} vs batch "
                         f"{bshape}")
    avals = (ct, offsets, index, num)
    cs = _compat_sharding.spec_entries(ct)[nbatch:]
    bspec = _rows.batch_spec_candidates(avals, bshape)
    spec = _partition.merge_specs(_names.SCATTER_ADD.primitive, [
        c if o == b else [] for c, o, b in zip(bspec, out_bshape, bshape)] + [
        []] * (dim + 1) + [[e] for e in cs[1:-1]] + [
        [cs[-1]] if ct.shape[-1] == src_shape[-1] else []])
    return _compat_sharding.typed_result(_names.SCATTER_ADD.primitive, avals, ct, spec,
                                shape=tuple(out_bshape) + tuple(src_shape),
                                dtype=ct.dtype if wire_of is None else np.dtype(wire_of),
                                weak_type=bool(ct.weak_type))


def _scatter_lax(ct: jax.Array, offsets: jax.Array, index: jax.Array, num: jax.Array, *,
                 dim: int, src_shape: Sequence[int], out_bshape: Sequence[int],
                 check_bounds: bool, nbatch: int, impl: str, wire_of: str | None) -> jax.Array:
    """One lax.scatter_add of whole rows into zeros, accumulated in _rows.acc_dtype. A batch dim
    the result keeps stays a batch dim (operand_batching_dims), as vmap of jnp's .at[].add
    gives, so XLA partitions a sharded batch without communication; one the result sums
    over (out_bshape 1) is scattered like the index dim. Pad rows point past the end and
    are dropped."""
    aval = _scatter_abstract_eval(*map(jax.typeof, (ct, offsets, index, num)), dim=dim,
                                  src_shape=src_shape, out_bshape=out_bshape,
                                  check_bounds=check_bounds, nbatch=nbatch, impl=impl,
                                  wire_of=wire_of)
    if wire_of is not None:
        ct = _partition.from_wire(ct, wire_of)
    bshape = _rows.batch_shape((ct, offsets, index, num), nbatch)
    n = index.shape[-1]
    mid = tuple(src_shape[dim + 1:-1])
    last = src_shape[-1]
    rows = math.prod(src_shape[:dim + 1])
    acc = _rows.acc_dtype(ct.dtype)
    sharding = _lowering.explicit_sharding(aval)
    o = _compat_sharding.spec_entries(aval)
    c = _compat_sharding.spec_entries(jax.typeof(ct))

    def named(*spec: SpecEntry) -> jax.sharding.NamedSharding:
        # on the operands' mesh: a bare PartitionSpec needs jax.set_mesh
        assert sharding is not None  # called only under explicit axes
        return jax.sharding.NamedSharding(sharding.mesh, PartitionSpec(*spec))
    valid, row = _rows.rows(offsets, index, num, sshape=src_shape, dim=dim,
                            check_bounds=check_bounds)
    row = jnp.where(valid, row, rows)  # past the end: dropped
    full = [j for j in range(nbatch)
            if out_bshape[j] == bshape[j] and not _rows.is_one(bshape[j])]
    keep = tuple(bshape[j] for j in full)
    row_shape = mid + (last,)
    ids = row.reshape((1,) * (nbatch + 1 - row.ndim) + row.shape)[..., None]
    ids = lax.broadcast_in_dim(
        ids, bshape + (n, 1), tuple(range(nbatch + 2)),
        out_sharding=None if sharding is None else named(*c[:nbatch + 1], None))
    # Rows keep their own shape (no merged middle dim): a reshape XLA cannot make a bitcast
    # would copy the whole cotangent first.
    upd = ct[..., :last].astype(acc) if ct.shape[-1] != last else ct.astype(acc)
    k = len(full)
    zspec = None if sharding is None else named(*[o[j] for j in full], None, *o[nbatch + dim + 1:])
    zeros = lax.broadcast_in_dim(jnp.zeros((), acc), keep + (rows,) + row_shape, (),
                                 out_sharding=zspec)
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(nbatch + 1, nbatch + 1 + len(row_shape))),
        inserted_window_dims=(k,), scatter_dims_to_operand_dims=(k,),
        operand_batching_dims=tuple(range(k)), scatter_indices_batching_dims=tuple(full))
    add: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] = lambda z, i, u: lax.scatter_add(
        z, i, u, dnums, mode=lax.GatherScatterMode.FILL_OR_DROP)
    if zspec is not None:  # jax cannot infer every scatter's result sharding
        add = _compat_sharding.auto_axes(add, zspec)
    out = add(zeros, ids, upd)
    out = out.astype(ct.dtype).reshape(tuple(out_bshape) + tuple(src_shape))
    return out


def _scatter_native(ctx: _lowering.Ctx, ct: ir.Value[Any], offsets: ir.Value[Any],
                    index: ir.Value[Any], num: ir.Value[Any], *, dim: int,
                    src_shape: Sequence[int], out_bshape: Sequence[int], check_bounds: bool,
                    nbatch: int, impl: str, wire_of: str | None) -> _compat.IrValues | None:
    avals: Sequence[Aval] = ctx.avals_in
    if (not _lowering.native_dtype_ok(ctx.avals_out[0].dtype, _names.SCATTER_ADD)
            or not _lowering.native_dtype_ok(avals[2].dtype)):  # an int4/uint4 index
        return None
    # The kernel reads every size from the buffers, the result's included, and a ct of
    # wire values as the result's dtype (CheckDtypeOrWire).
    return _lowering.ffi_call(ctx, _names.SCATTER_ADD.target, (ct, offsets, index, num),
                              dim=dim, nbatch=nbatch, check_bounds=check_bounds)


def _scatter_spmd_rule(avals_in: Sequence[Aval], aval_out: Aval, *, dim: int,
                       src_shape: Sequence[int], out_bshape: Sequence[int], nbatch: int,
                       **_: Any) -> _partition.Factors:
    """Batch dims the result keeps shard, and so do the result's rows (dims 0..dim, which
    only the result has: Shardy takes their sharding from the result's users, such as a
    table's update). Dims that accumulate (n, and batch dims the result has as 1) are
    replicated, so every element sums its contributions in index order as on one device
    (exact, deterministic) at the cost of gathering ct."""
    bshape = _rows.batch_shape(avals_in, nbatch)
    full = [out_bshape[j] == bshape[j] for j in range(nbatch)]
    b = [f"b{j}" if full[j] else f"a{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(src_shape) - dim - 2)]
    shared = avals_in[0].shape[-1] == src_shape[-1]
    rows = [f"s{i}" for i in range(dim + 1)]
    f_in = [_rows.batch_factors(0, avals_in[0], bshape, b) + ["n"] + mid
            + ["l" if shared else "cl"],
            _rows.batch_factors(1, avals_in[1], bshape, b) + ["q"],
            _rows.batch_factors(2, avals_in[2], bshape, b) + ["n"],
            _rows.batch_factors(3, avals_in[3], bshape, b)]
    f_out = [b[j] if full[j] else f"ob{j}" for j in range(nbatch)] + rows + mid + \
        ["l" if shared else "sl"]
    rep = ["n", "q"] + [b[j] for j in range(nbatch) if not full[j]]
    return f_in, f_out, tuple(rep + ([] if shared else ["cl", "sl"])), ()


def _scatter_spmd_partition(o: Sequence[SpecEntry], mesh_shape: Mapping[str, int],
                            avals_in: Sequence[Aval], aval_out: Aval,
                            given: Sequence[Sequence[SpecEntry]], *, dim: int,
                            src_shape: Sequence[int], out_bshape: Sequence[int], nbatch: int,
                            check_bounds: bool, **params: Any) -> _partition.Partition:
    """Each device accumulates the rows of its block of the result, from every
    cotangent row (ct and the indices replicated along n). Where the result's rows are
    sharded, each device adds, in index order, the cotangent rows of the rows its shard
    holds (so its bits are the one-device result's) and drops the others."""
    bshape = _rows.batch_shape(avals_in, nbatch)
    ct = avals_in[0]
    shared = ct.shape[-1] == src_shape[-1]
    o = _rows.nonunit(o, aval_out.shape)
    for j in range(nbatch):
        if out_bshape[j] != bshape[j]:
            o[j] = None
    if not shared:
        o[-1] = None
    row_specs = o[nbatch:nbatch + dim + 1]
    in_specs = [_rows.batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += [None] + o[nbatch + dim + 1:]
    in_specs[1] += [None]
    in_specs[2] += [None]
    loc = [_partition.local_size(s, e, mesh_shape) for s, e in zip(aval_out.shape, o)]
    local_src, local_b = tuple(loc[nbatch:]), tuple(loc[:nbatch])
    # A ct XLA reshards first (gathers along n) arrives as the collective's wire values:
    # the kernel reads those as ct's dtype, where the view back would be copied.
    wired = tuple(given[0]) != tuple(in_specs[0]) and \
        _partition.wire_dtype(ct.dtype) is not None

    def wire(ct: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
        if not wired:
            return ct, dict(params, wire_of=None)
        return _partition.to_wire(ct), dict(params, wire_of=np.dtype(ct.dtype).name)
    if all(e is None for e in row_specs):
        def local(bind: Callable[..., jax.Array], ct: jax.Array,
                  *args: jax.Array) -> jax.Array:
            ct, p = wire(ct)
            return bind(ct, *args, dim=dim, src_shape=local_src, out_bshape=local_b,
                        nbatch=nbatch, check_bounds=check_bounds, **p)
        return in_specs, o, local, None
    local_rows = local_src[:dim + 1]

    def local_rows_sharded(bind: Callable[..., jax.Array], ct: jax.Array, offsets: jax.Array,
                           index: jax.Array, num: jax.Array) -> jax.Array:
        valid, row = _rows.rows(offsets, index, num, sshape=src_shape, dim=dim,
                                check_bounds=check_bounds)
        held, lrow = _rows.held_rows(valid, row, src_shape[:dim + 1], local_rows, row_specs)
        ob = (1,) * nbatch
        ct, p = wire(ct)
        out = bind(ct, jnp.zeros(ob + (1,), offsets.dtype), jnp.where(held, lrow, -1),
                   jnp.full(ob, index.shape[-1], num.dtype), dim=0,
                   src_shape=(math.prod(local_rows),) + local_src[dim + 1:],
                   out_bshape=local_b, nbatch=nbatch, check_bounds=True, **p)
        return out.reshape(local_b + local_src)
    axes = ", ".join(a for e in row_specs for a in _partition.axes_of(e))
    return in_specs, o, local_rows_sharded, (
        f"the gradient stays sharded along its rows ({axes}): each device adds, in index "
        "order, the cotangent rows of the rows it holds")


def _scatter_jvp(primals: Sequence[jax.Array], tangents: Sequence[Tangent],
                 **params: Any) -> tuple[jax.Array, Tangent]:
    ct, offsets, index, num = primals
    out = _compat.bind(scatter_add_p, ct, offsets, index, num, **params)
    t = _compat.instantiate_tangent(tangents[0], ct)
    if type(t) is Zero:
        return out, Zero(jax.typeof(out).to_tangent_aval())
    return out, _compat.bind(scatter_add_p, t, offsets, index, num, **params)


def _scatter_transpose(cts: Tangent, ct: Primal, offsets: Primal, index: Primal, num: Primal,
                       *, dim: int, src_shape: Sequence[int], out_bshape: Sequence[int],
                       check_bounds: bool, nbatch: int, impl: str,
                       wire_of: str | None) -> list[Tangent | None]:
    # wire_of is set only inside a partitioned call's shard, where no transform runs.
    offsets, index, num = _rows.not_linear(_names.SCATTER_ADD.primitive, (
        ("offsets", offsets), ("index", index), ("num_indices", num)))
    if not _compat.is_undefined_primal(ct):
        return [None] * 4
    if type(cts) is Zero:
        return [Zero(ct.aval), None, None, None]
    row_len = ct.aval.shape[-1]
    pad = jnp.zeros((1,) * nbatch, cts.dtype)
    g = _compat.bind(gather_p, cts, offsets, index, num, pad, dim=dim, row_len=row_len,
                      check_bounds=check_bounds, nbatch=nbatch, impl=impl)
    if g.shape != ct.aval.shape:
        # ct alone carried a batch dim (a vmap over pad_value only, say) that the scatter
        # summed over: every batch element gets the same rows.
        g = jnp.broadcast_to(g, ct.aval.shape)
    return [g, None, None, None]


def _scatter_batch(axis_size: int, args: Sequence[jax.Array], bdims: Sequence[int | None], *,
                   dim: int, src_shape: Sequence[int], out_bshape: Sequence[int],
                   check_bounds: bool, nbatch: int, impl: str,
                   wire_of: str | None) -> tuple[jax.Array, int]:
    ct, offsets, index, num = [_rows.lead(a, bd) for a, bd in zip(args, bdims)]
    if bdims[0] is None:
        # ct always carries the full batch shape (its transpose, gather, returns it).
        ct = jnp.broadcast_to(ct, (axis_size,) + ct.shape[1:])
    out = _compat.bind(scatter_add_p, ct, offsets, index, num, dim=dim, src_shape=src_shape,
                             out_bshape=(axis_size,) + tuple(out_bshape),
                             check_bounds=check_bounds, nbatch=nbatch + 1, impl=impl,
                             wire_of=wire_of)
    return out, 0


# --- registration: every rule of jax_ext_scatter_add -------------------------------

scatter_add_p.def_impl(
    lambda *args, **params: _compat.apply_primitive(scatter_add_p, *args, **params))
scatter_add_p.def_abstract_eval(_scatter_abstract_eval)
# partition_lax: XLA partitions a scatter-add into a replicated result by scattering each
# device's cotangent rows and adding the results in float, in another order than one
# device's; the kernels' rule keeps every row's sum in index order on the lax path too.
_lowering.register(scatter_add_p, _names.SCATTER_ADD, _scatter_lax, _scatter_native,
                   spmd=_partition.Spmd(_scatter_spmd_rule, _scatter_spmd_partition),
                   partition_lax=True)
_compat.ad.primitive_jvps[scatter_add_p] = _scatter_jvp
_compat.ad.primitive_transposes[scatter_add_p] = _scatter_transpose
_compat.register_batcher(scatter_add_p, _scatter_batch)
