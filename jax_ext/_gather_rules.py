"""The rules of the gather primitive (front-end: ``_gather.py``).

``jax_ext_gather(src, offsets, index, num_indices, pad_value)`` with static params

* ``dim``: the indexed dimension of one ``src`` (after the batch dims);
* ``row_len``: the padded length ``L`` of the result's last dimension;
* ``check_bounds``: pad (True) or clamp (False) out-of-range rows;
* ``nbatch``: the number of leading batch dimensions every operand carries. Each
  operand's batch dimension is either the batch size or 1 (broadcast: the kernel reads
  it with batch stride 0, nothing is materialized). vmap prepends one more;
* ``impl``: the implementation requested, "auto", "native" or "lax", fixed when the
  primitive is bound; what runs is settled per call site when it is lowered.

Operands: ``offsets`` is one vector of ``dim + 1`` values and ``num_indices`` a scalar,
both of the default integer type (int64 under ``jax_enable_x64``, else int32), and
``pad_value`` a scalar of ``src``'s dtype -- always operands, static or traced, so one
compiled program serves every value. The result has ``pad_value``'s dtype: ``src``'s, or
its wire dtype (_partition.wire_dtype), where a partitioned call's shard gathers rows it
sums across devices as integers; and ``src`` may be the wire values of ``pad_value``'s
dtype, where a shard gathers from a table that crossed devices as them (the kernel moves
bytes, so neither is converted).
``index`` keeps its own integer dtype: the kernel reads any width and signedness and adds
it to ``offsets[dim]`` in 128-bit arithmetic, which is exact for uint64 indices too (a
conversion to int64 would cost a pass and wrap uint64 values >= 2**63 into range).

Its transpose with respect to ``src`` is the scatter-add primitive of ``_scatter_add.py``,
whose own transpose is this gather (both primitives live in ``_primitives.py``); the row
and batch geometry they share is in ``_rows.py``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from . import _compat, _compat_sharding, _gather_args as _args, _lowering, _names, _partition, _rows
from . import _gather_partition
from ._compat import Aval, PartitionSpec, Primal, SpecEntry, Tangent, ir
# gather's transpose binds the scatter-add, whose rules _scatter_add registers
from . import _scatter_add  # noqa: F401
from ._primitives import gather_p, scatter_add_p
from ._shard_like import shard_like
from ._common import sum_to_shape

Zero = _compat.Zero


# --- shapes -------------------------------------------------------------------------

def _gather_abstract_eval(src: Aval, offsets: Aval, index: Aval, num: Aval, pad: Aval, *,
                          dim: int, row_len: int, check_bounds: bool, nbatch: int,
                          impl: str) -> Aval:
    prim = _names.GATHER.primitive
    bshape = _rows.batch_shape((src, offsets, index, num, pad), nbatch)
    sshape = src.shape[nbatch:]
    for name, a, r in (("src", src, len(sshape)), ("offsets", offsets, 1), ("index", index, 1),
                       ("num_indices", num, 0), ("pad_value", pad, 0)):
        _rows.check_batch(prim, name, a, bshape, nbatch, r)
    if (offsets.shape[-1] != dim + 1 or offsets.dtype not in (np.int32, np.int64)
            or num.dtype not in (np.int32, np.int64)):
        raise TypeError(f"{prim}: offsets/num_indices must be int32/int64 of the right "
                        "length")
    if not _wire_pair(src.dtype, pad.dtype) or not _args.is_int_dtype(index.dtype):
        raise TypeError(f"{prim}: bad dtypes src {src.dtype}, pad {pad.dtype}, "
                        f"index {index.dtype}")
    n = index.shape[-1]
    shape = bshape + (n,) + tuple(sshape[dim + 1:-1]) + (row_len,)
    avals = (src, offsets, index, num, pad)
    ss = _compat_sharding.spec_entries(src)[nbatch:]
    spec = _partition.merge_specs(prim, _rows.batch_spec_candidates(avals, bshape) + [
        [_compat_sharding.spec_entries(index)[-1]]] + [[e] for e in ss[dim + 1:-1]] + [
        [ss[-1]] if sshape[-1] == row_len else []])
    return _compat_sharding.typed_result(prim, avals, src, spec, shape=shape, dtype=pad.dtype,
                                weak_type=bool(src.weak_type))


def _wire_pair(src: Any, pad: Any) -> bool:
    """May a gather read `src` and write `pad`'s dtype? The same dtype, or one the other's
    wire dtype (_partition.wire_dtype): rows gathered for an integer sum, or from a src
    that crossed devices as wire values. Bytes are never read as bool."""
    src, pad = np.dtype(src), np.dtype(pad)
    return src == pad or _partition.is_wire(pad, src) or (
        pad != np.bool_ and _partition.is_wire(src, pad))


# --- lax implementations --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _LaxGeometry:
    """What the ops of the lax gather share: the result's shape (with the byte view's
    trailing dim), and under explicit mesh axes its spec, which every op states."""
    bshape: tuple[int, ...]
    n: int
    mid: tuple[int, ...]
    last: int
    rows: int                   # prod(src_shape[:dim + 1]): src's rows in one dim
    ex: tuple[int, ...]         # the byte view's trailing dim, or ()
    row_shape: tuple[int, ...]  # one row of the result, unpadded
    shape: tuple[int, ...]      # the result before padding columns
    # the result's NamedSharding under explicit axes, else None
    sharding: jax.sharding.NamedSharding | None
    spec: tuple[SpecEntry, ...]  # the result's spec entries, the padded last dim unsharded

    def bcast(self, x: jax.Array, shape: Sequence[int],
              spec: Sequence[SpecEntry] | None = None) -> jax.Array:
        """broadcast_in_dim of x (of shape's rank), with the result sharding spelled out
        under explicit axes."""
        spec = self.spec if spec is None else spec
        out = None if self.sharding is None else jax.sharding.NamedSharding(
            self.sharding.mesh, PartitionSpec(*spec))
        return lax.broadcast_in_dim(x, shape, tuple(range(len(shape))), out_sharding=out)


def _lax_geometry(src: jax.Array, avals: Sequence[Aval], *, dim: int, row_len: int,
                  nbatch: int, params: dict[str, Any]) -> _LaxGeometry:
    bshape = _rows.batch_shape(avals, nbatch)
    sshape = src.shape[nbatch:]
    mid, last, n = tuple(sshape[dim + 1:-1]), sshape[-1], avals[2].shape[-1]
    # The gather feeds a select and a pad in one fused loop: bytes (see exact_view).
    ex = _lowering.view_dims(src.dtype, bytes=True)
    row_shape = mid + (last,) + ex
    out_aval = _gather_abstract_eval(*avals, dim=dim, row_len=row_len, nbatch=nbatch, **params)
    # Under explicit mesh axes every op states its result's sharding: the result's spec,
    # with src's row dims (0..dim) replicated, as the kernels have them where this runs
    # unpartitioned (a row-sharded src is partitioned by the kernels' rule first).
    o = _compat_sharding.spec_entries(out_aval)
    o = o[:-1] + ((o[-1] if row_len == last else None),) + (None,) * len(ex)
    return _LaxGeometry(bshape, n, mid, last, math.prod(sshape[:dim + 1]), ex, row_shape,
                        bshape + (n,) + row_shape, _lowering.explicit_sharding(out_aval, ex), o)


def _lax_take(geo: _LaxGeometry, src: jax.Array, sv: jax.Array, row: jax.Array,
              nbatch: int) -> jax.Array:
    """The rows of src (viewed as sv) at `row`: one lax.gather keeping the batch dims as
    batching dims; every row a pad row where src has none."""
    if _lowering.definitely_zero(math.prod(src.shape) * geo.rows):
        return geo.bcast(jnp.zeros((1,) * len(geo.shape), sv.dtype), geo.shape)
    full = [j for j in range(nbatch)
            if src.shape[j] == geo.bshape[j] and not _rows.is_one(geo.bshape[j])]
    k, o = len(full), geo.spec
    # src without its broadcast (size-1) batch dims, its rows in one dim.
    flat = sv.reshape(tuple(src.shape[j] for j in full) + (geo.rows,) + geo.row_shape)
    ids = geo.bcast(row.reshape((1,) * (nbatch + 1 - row.ndim) + row.shape)[..., None],
                    geo.bshape + (geo.n, 1), o[:nbatch + 1] + (None,))
    if geo.sharding is not None:
        flat = _compat.reshard(flat, jax.sharding.NamedSharding(
            geo.sharding.mesh, PartitionSpec(
                *[o[j] for j in full], None, *o[nbatch + 1:])))
    dnums = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(nbatch + 1, nbatch + 1 + len(geo.row_shape))),
        collapsed_slice_dims=(k,), start_index_map=(k,),
        operand_batching_dims=tuple(range(k)), start_indices_batching_dims=tuple(full))
    # Rows are clamped into range by _rows.rows: no bounds handling left for XLA.
    take: Callable[[jax.Array, jax.Array], jax.Array] = lambda f, i: lax.gather(
        f, i, dnums, (1,) * (k + 1) + geo.row_shape,
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    if geo.sharding is not None:  # jax's gather cannot infer every result sharding
        take = _compat_sharding.auto_axes(take, geo.sharding)
    return take(flat, ids)


def _lax_pads(geo: _LaxGeometry, g: jax.Array, valid: jax.Array, pad: jax.Array,
              pv: jax.Array, row_len: int, nbatch: int) -> jax.Array:
    """Pad rows selected in, padding columns added."""
    ones = (1,) * (len(geo.mid) + 1)
    v = geo.bcast(valid.reshape((1,) * (nbatch + 1 - valid.ndim) + valid.shape + ones
                                + (1,) * len(geo.ex)), geo.shape)
    pb = pv.reshape(pad.shape + (1,) + ones + geo.ex)
    g = lax.select_n(v, geo.bcast(pb, geo.shape), g)
    if row_len == geo.last:
        return g
    extra = row_len - geo.last
    if pad.size == 1 and not geo.ex:
        return lax.pad(g, pv.reshape(()), [(0, 0, 0)] * (g.ndim - 1) + [(0, extra, 0)])
    # a batched pad value, or bytes: one column block
    cols = geo.shape[:nbatch + 1 + len(geo.mid)] + (extra,) + geo.ex
    return jnp.concatenate([g, geo.bcast(pb, cols)], axis=nbatch + 1 + len(geo.mid))


def _gather_lax(src: jax.Array, offsets: jax.Array, index: jax.Array, num: jax.Array,
                pad: jax.Array, *, dim: int, row_len: int, check_bounds: bool, nbatch: int,
                impl: str) -> jax.Array:
    """One lax.gather of whole rows, pad rows selected in, pad columns added: ops XLA fuses
    with their producers and consumers, as for jnp.take. Batch dims stay batch dims
    (operand_batching_dims), as vmap of jnp.take gives, so XLA partitions a sharded batch
    without communication; a src broadcast along a batch dim is read without it.
    Exact: every value moves through _lowering.exact_view, every float as integers, a
    packed dtype as its uint8 codes. A src
    sharded along its rows (dims 0..dim) stays so on CPU meshes by the kernels'
    partitioning rule (`partition_lax` below); where XLA partitions this gather itself
    (auto axes on other platforms, the GSPMD partitioner, an exported program), it masks
    and all-reduces with an add, as for jnp.take, but of integers: the bits are kept."""
    avals = tuple(map(jax.typeof, (src, offsets, index, num, pad)))
    geo = _lax_geometry(src, avals, dim=dim, row_len=row_len, nbatch=nbatch,
                        params=dict(check_bounds=check_bounds, impl=impl))
    valid, row = _rows.rows(offsets, index, num, sshape=src.shape[nbatch:], dim=dim,
                            check_bounds=check_bounds)
    # Every float as integers (a packed dtype as uint8 codes): where XLA partitions this
    # gather itself (auto axes on other platforms, the GSPMD partitioner, an exported
    # program), it masks the rows a device does not hold and all-reduces with an add,
    # which on integers keeps every bit.
    out_dtype = pad.dtype
    pad = _partition.rewire(pad, src.dtype)  # src or pad_value as wire values: module doc
    sv, pv = (_lowering.exact_view(a, bytes=True, every_float=True) for a in (src, pad))
    g = _lax_take(geo, src, sv, row, nbatch)
    out = _lowering.from_view(_lax_pads(geo, g, valid, pad, pv, row_len, nbatch), src.dtype)
    return _partition.rewire(out, out_dtype)


# --- native lowerings -----------------------------------------------------------------

def _gather_native(ctx: _lowering.Ctx, src: ir.Value[Any], offsets: ir.Value[Any],
                   index: ir.Value[Any], num: ir.Value[Any], pad: ir.Value[Any], *, dim: int,
                   row_len: int, check_bounds: bool, nbatch: int,
                   impl: str) -> _compat.IrValues | None:
    avals: Sequence[Aval] = ctx.avals_in
    # A packed src, index or pad_value runs through lax, and so does a packed table's
    # uint8 codes (the wire values of a src that crossed devices) beside its packed
    # pad_value: the kernel moves elements by width, and a code is not its element's width.
    if not all(_lowering.native_dtype_ok(a.dtype, _names.GATHER if k == 0 else None)
               for k, a in ((0, avals[0]), (2, avals[2]), (4, avals[4]))):
        return None
    # The kernel reads every size from the buffers (static or symbolic alike).
    return _lowering.ffi_call(ctx, _names.GATHER.target, (src, offsets, index, num, pad),
                              dim=dim, nbatch=nbatch, check_bounds=check_bounds)


# --- autodiff ---------------------------------------------------------------------------

def _gather_jvp(primals: Sequence[jax.Array], tangents: Sequence[Tangent], *, dim: int,
                row_len: int, check_bounds: bool, nbatch: int,
                impl: str) -> tuple[jax.Array, Tangent]:
    src, offsets, index, num, pad = primals
    ts, tp = (_compat.instantiate_tangent(tangents[k], primals[k]) for k in (0, 4))
    params = dict(dim=dim, row_len=row_len, check_bounds=check_bounds, nbatch=nbatch, impl=impl)
    out = _compat.bind(gather_p, src, offsets, index, num, pad, **params)
    if type(ts) is Zero and type(tp) is Zero:
        return out, Zero(jax.typeof(out).to_tangent_aval())
    if type(ts) is Zero:
        # Only pad_value moves: its tangent at every padded position, 0 elsewhere.
        sshape = src.shape[nbatch:]
        valid, _ = _rows.rows(offsets, index, num, sshape=sshape, dim=dim,
                              check_bounds=check_bounds)
        mid = tuple(sshape[dim + 1:-1])
        mask = _rows.pad_mask(valid, sshape[-1], row_len, mid)
        tpb = tp.reshape(tp.shape + (1,) * (1 + len(mid) + 1))
        t = jnp.where(mask, tpb, jnp.zeros((), tp.dtype))
        return out, jnp.broadcast_to(t, out.shape).astype(out.dtype)
    if type(tp) is Zero:
        tp = jnp.zeros((1,) * nbatch, ts.dtype)
    # The table's tangent tied to the table: its transpose, the gradient, is sharded as
    # the table where XLA partitions the program (see _shard_like).
    ts = shard_like(ts, src)
    return out, _compat.bind(gather_p, ts, offsets, index, num, tp, **params)


def _gather_transpose(ct: Tangent, src: Primal, offsets: Primal, index: Primal, num: Primal,
                      pad: Primal, *, dim: int, row_len: int, check_bounds: bool, nbatch: int,
                      impl: str) -> list[Tangent | None]:
    offsets, index, num = _rows.not_linear(_names.GATHER.primitive, (
        ("offsets", offsets), ("index", index), ("num_indices", num)))
    s_undef, p_undef = _compat.is_undefined_primal(src), _compat.is_undefined_primal(pad)
    src_aval = src.aval if s_undef else jax.typeof(src)
    sshape = src_aval.shape[nbatch:]
    outs: list[Tangent | None] = [None, None, None, None, None]
    if type(ct) is Zero:
        if s_undef:
            outs[0] = Zero(src.aval)
        if p_undef:
            outs[4] = Zero(pad.aval)
        return outs
    if s_undef:
        outs[0] = _like_primal(lambda *a: _compat.bind(
            scatter_add_p, *a, dim=dim, src_shape=tuple(sshape),
            out_bshape=tuple(src_aval.shape[:nbatch]), check_bounds=check_bounds,
            nbatch=nbatch, impl=impl, wire_of=None), (ct, offsets, index, num), src_aval)
    if p_undef:
        valid, _ = _rows.rows(offsets, index, num, sshape=sshape, dim=dim,
                              check_bounds=check_bounds)
        mask = _rows.pad_mask(valid, sshape[-1], row_len, tuple(sshape[dim + 1:-1]))
        # Summed as the scatter-add sums (narrow floats in float32), rounded once.
        masked = jnp.where(mask, ct, jnp.zeros((), ct.dtype)).astype(
            _rows.acc_dtype(ct.dtype))
        t = jnp.sum(masked, axis=tuple(range(nbatch, ct.ndim)))
        outs[4] = sum_to_shape(t, pad.aval.shape).astype(pad.aval.dtype)
    return outs


def _like_primal(scatter: Callable[..., jax.Array], args: Sequence[jax.Array],
                 aval: Aval) -> jax.Array:
    """`scatter(*args)`, which under explicit mesh axes must carry its primal's sharding.
    The scatter-add types the rows it accumulates unsharded (every row may receive from
    any index), so for a row-sharded src it is computed under that sharding (auto_axes:
    the partitioner then accumulates each shard's rows on its device), or, where jax
    lowers explicit axes through shard_map (jax_partitioning), resharded to it."""
    want = getattr(aval, "sharding", None)
    mesh = getattr(want, "mesh", None)
    if mesh is None or mesh.empty or not _compat_sharding.explicit_axes(mesh):
        return scatter(*args)
    # On the primal's mesh: a bare PartitionSpec would need jax.set_mesh.
    target = jax.sharding.NamedSharding(mesh, aval.sharding.spec)
    if _compat_sharding.shard_map_partitioning() is None and any(
            e is not None for e in _compat_sharding.spec_entries(aval)):
        return _compat_sharding.auto_axes(scatter, target)(*args)
    t = scatter(*args)
    if _compat_sharding.spec_entries(jax.typeof(t)) == _compat_sharding.spec_entries(aval):
        return t
    return _compat.reshard(t, target)


# --- batching ---------------------------------------------------------------------------

def _gather_batch(axis_size: int, args: Sequence[jax.Array], bdims: Sequence[int | None], *,
                  dim: int, row_len: int, check_bounds: bool, nbatch: int,
                  impl: str) -> tuple[jax.Array, int]:
    args = [_rows.lead(a, bd) for a, bd in zip(args, bdims)]
    # Some operand is batched (register_batcher binds directly otherwise), so the
    # result's new dim has its extent, axis_size.
    out = _compat.bind(gather_p, *args, dim=dim, row_len=row_len, check_bounds=check_bounds,
                        nbatch=nbatch + 1, impl=impl)
    return out, 0


# --- registration: every rule of jax_ext_gather -------------------------------------

gather_p.def_impl(lambda *args, **params: _compat.apply_primitive(gather_p, *args, **params))
gather_p.def_abstract_eval(_gather_abstract_eval)
# partition_lax: the lax path partitions by the kernels' rule too, so that on CPU meshes
# every path gives the same bits, memory and collectives (XLA's own partitioning of a
# row-sharded gather all-reduces the whole result, with the index replicated).
_lowering.register(gather_p, _names.GATHER, _gather_lax, _gather_native,
                   spmd=_partition.Spmd(_gather_partition.spmd_rule,
                                        _gather_partition.spmd_partition),
                   partition_lax=True)
_compat.ad.primitive_jvps[gather_p] = _gather_jvp
_compat.ad.primitive_transposes[gather_p] = _gather_transpose
_compat.register_batcher(gather_p, _gather_batch)

