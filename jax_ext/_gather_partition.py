"""How the gather primitive partitions over a device mesh (its rules: ``_gather_rules.py``):
the Shardy rule, and each shard's computation, from a src replicated along its rows or
sharded along them (`_rows_sharded`: the table stays sharded, the devices sum their rows
as integers), whichever moves fewer bytes (`keep_rows_sharded`)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from . import _partition, _rows
from ._compat import Aval, SpecEntry


# Batch dims, the index dim n, the middle dims and -- when no padding column is added --
# the last dim shard freely; a size-1 (broadcast) batch dim gets a factor of its own.
# src's row dims (0..dim) are reduction factors: a src sharded along them stays so, each
# device gathers the rows it holds and the devices combine their results by an integer
# sum (`_rows_sharded`), unless copying src moves fewer bytes (`keep_rows_sharded`).

def spmd_rule(avals_in: Sequence[Aval], aval_out: Aval, *, dim: int, row_len: int,
                      nbatch: int, **_: Any) -> _partition.Factors:
    bshape = aval_out.shape[:nbatch]
    src = avals_in[0]
    sshape = src.shape[nbatch:]
    b = [f"b{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(sshape) - dim - 2)]
    shared = sshape[-1] == row_len  # no padding columns: the last dim shards too
    rows = [f"s{i}" for i in range(dim + 1)]
    f_in = [_rows.batch_factors(0, src, bshape, b) + rows + mid + ["l" if shared else "sl"],
            _rows.batch_factors(1, avals_in[1], bshape, b) + ["q"],
            _rows.batch_factors(2, avals_in[2], bshape, b) + ["n"],
            _rows.batch_factors(3, avals_in[3], bshape, b),
            _rows.batch_factors(4, avals_in[4], bshape, b)]
    f_out = b + ["n"] + mid + ["l" if shared else "ol"]
    return f_in, f_out, tuple(["q"] + ([] if shared else ["sl", "ol"])), tuple(rows)


def rows_sharded_bytes(src: Aval, aval_out: Aval, scatter: bool) -> tuple[int, int]:
    """What a gather from a src sharded along its rows moves across devices, (keeping it
    sharded, copying it): the combine moves about the result's bytes (a reduce-scatter;
    twice that for an all-reduce, where the result is not sharded along the index),
    copying src its bytes."""
    size = np.dtype(src.dtype).itemsize
    return (math.prod(aval_out.shape) * (1 if scatter else 2) * size,
            math.prod(src.shape) * size)


def keep_rows_sharded(src: Aval, aval_out: Aval, scatter: bool) -> bool:
    """Does the gather from a src sharded along its rows keep it so? Where that moves
    fewer bytes than copying it (rows_sharded_bytes)."""
    keep, copy = rows_sharded_bytes(src, aval_out, scatter)
    return keep < copy


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.3g} MiB"


def _rows_note(src: Aval, aval_out: Aval, row_axes: tuple[str, ...], scatter: bool,
               kept: bool) -> str:
    """explain()'s note on a gather from a src sharded along its rows."""
    keep, copy = rows_sharded_bytes(src, aval_out, scatter)
    axes = ", ".join(row_axes)
    if kept:
        how = "reduce-scatter" if scatter else "all-reduce"
        return (f"the table stays sharded along its rows ({axes}): each device gathers the "
                f"rows it holds, an integer {how} combines them (about {_mib(keep)}; "
                f"copying the table would move {_mib(copy)})")
    return (f"the table, sharded along its rows ({axes}), is copied to every device "
            f"({_mib(copy)}): fewer bytes than combining the rows (about {_mib(keep)})")


def spmd_partition(o: Sequence[SpecEntry], mesh_shape: Mapping[str, int],
                           avals_in: Sequence[Aval], aval_out: Aval,
                           given: Sequence[Sequence[SpecEntry]], *, dim: int, row_len: int,
                           nbatch: int, **params: Any) -> _partition.Partition:
    """Each device gathers the rows of its index shard (and batch/column block). From a
    src sharded along its rows, see `_rows_sharded`; otherwise from a src replicated
    along dims 0..dim: num_indices counts global rows, so each shard gets it shifted by
    the shard's first row."""
    bshape = aval_out.shape[:nbatch]
    src, n = avals_in[0], avals_in[2].shape[-1]
    shared = src.shape[-1] == row_len
    o = _rows.nonunit(o, aval_out.shape)
    if not shared:
        o[-1] = None
    row_specs = [e if not _rows.is_one(d) else None for d, e in
                 zip(src.shape[nbatch:nbatch + dim + 1], given[0][nbatch:nbatch + dim + 1])]
    row_axes = tuple(a for e in row_specs for a in _partition.axes_of(e))
    scatter = bool(set(row_axes) & set(_partition.axes_of(o[nbatch])))
    if row_axes and keep_rows_sharded(src, aval_out, scatter):
        return _rows_sharded(o, mesh_shape, avals_in, aval_out, row_specs, row_axes, scatter,
                             dim=dim, row_len=row_len, nbatch=nbatch, **params)
    note = _rows_note(src, aval_out, row_axes, scatter, False) if row_axes else None
    in_specs = [_rows.batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += [None] * (dim + 1) + o[nbatch + 1:]
    in_specs[1] += [None]
    in_specs[2] += [o[nbatch]]
    local_row_len = _partition.local_size(row_len, o[-1], mesh_shape)
    n_axes, n_local = o[nbatch], _partition.local_size(n, o[nbatch], mesh_shape)
    # A src XLA reshards first (all-gathers) arrives as the collective's wire values: the
    # kernel, which moves bytes by width, reads those, where a view back would be copied,
    # and writes the rows in src's dtype (pad_value's), which leave the call as they are
    # (a bool's bytes are never read as bool: its rows come out as uint8).
    wired = tuple(given[0]) != tuple(in_specs[0])

    def local(bind: Callable[..., jax.Array], s: jax.Array, offsets: jax.Array,
              index: jax.Array, num: jax.Array, pad: jax.Array) -> jax.Array:
        if n_axes is not None:
            first = lax.convert_element_type(lax.axis_index(n_axes), num.dtype) * n_local
            num = lax.clamp(np.array(0, num.dtype), num - first, np.array(n_local, num.dtype))
        if not wired:
            return bind(s, offsets, index, num, pad, dim=dim, row_len=local_row_len,
                        nbatch=nbatch, **params)
        p = _partition.to_wire(pad) if pad.dtype == np.bool_ else pad
        return _partition.from_wire(bind(
            _partition.to_wire(s), offsets, index, num, p, dim=dim,
            row_len=local_row_len, nbatch=nbatch, **params), s.dtype)
    return in_specs, o, local, note


@dataclasses.dataclass(frozen=True)
class _RowsSharded:
    """The gather from a src that stays sharded along its rows (the `row_axes`), on one
    device: see `_rows_sharded`."""
    sshape: tuple[int, ...]          # one global src
    dim: int
    nbatch: int
    check_bounds: bool
    row_specs: tuple[SpecEntry, ...]  # src's row dims (0..dim)
    row_axes: tuple[str, ...]
    local_rows: tuple[int, ...]       # a shard's extent along each row dim
    n_spec: SpecEntry                 # the result's index dim
    n_block: int                      # the result's index dim on one device
    n_pad: int                        # the indices each device gathers for
    scatter: bool                     # a reduce-scatter (else an all-reduce)
    last: int                         # src's last dim on one device
    row_len: int                      # the result's last dim on one device

    def ids(self, offsets: jax.Array, index: jax.Array,
            num: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(this shard's flat row for each index, -1 where it holds none; valid)."""
        if not self.scatter and self.n_spec is not None:  # this device's block of indices
            first = lax.convert_element_type(lax.axis_index(self.n_spec), num.dtype)
            num = lax.clamp(np.array(0, num.dtype), num - first * self.n_block,
                            np.array(self.n_block, num.dtype))
        valid, row = _rows.rows(offsets, index, num, sshape=self.sshape, dim=self.dim,
                                check_bounds=self.check_bounds)
        held, lrow = _rows.held_rows(valid, row, self.sshape[:self.dim + 1],
                                     self.local_rows, self.row_specs)
        ids = jnp.where(held, lrow, -1)
        more = self.n_pad - ids.shape[-1]
        if more:  # the reduce-scatter's blocks: pad rows past n
            ids = jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(0, more)], constant_values=-1)
            valid = jnp.pad(valid, [(0, 0)] * (valid.ndim - 1) + [(0, more)])
        return ids, valid

    def combine(self, part: jax.Array, valid: jax.Array, pad: jax.Array) -> jax.Array:
        """The devices' rows (wire values, zero where a device holds none) summed, this
        device's block of the result kept, pad rows and padding columns set to `pad`
        (a wire value too)."""
        nb = self.nbatch
        if self.scatter:
            part = lax.psum_scatter(  # type: ignore[no-untyped-call]  # unannotated in jax
                part, self.row_axes, scatter_dimension=nb, tiled=True)
            blk = lax.axis_index(self.row_axes) * self.n_block
            valid = lax.dynamic_slice_in_dim(valid, blk, self.n_block, axis=valid.ndim - 1)
        else:
            part = lax.psum(part, self.row_axes)  # type: ignore[no-untyped-call]  # unannotated in jax
        mask = _rows.pad_mask(valid, self.last, self.row_len, tuple(part.shape[nb + 1:-1]))
        return jnp.where(mask, pad.reshape(pad.shape + (1,) * (part.ndim - nb)), part)


def _rows_sharded(o: list[SpecEntry], mesh_shape: Mapping[str, int], avals_in: Sequence[Aval],
                  aval_out: Aval, row_specs: Sequence[SpecEntry], row_axes: tuple[str, ...],
                  scatter: bool, *, dim: int, row_len: int, nbatch: int, check_bounds: bool,
                  **params: Any) -> _partition.Partition:
    """The gather from a src that stays sharded along its rows (the `row_axes`).

    Every device computes which rows are real and where each lies (`_rows.rows`, on the
    global geometry), gathers the rows it holds from its shard, with every other row
    zero bits, and the devices add their results as unsigned integers of the element's
    width: exactly one device contributes a real row's bits, so the sum is those bits.
    Where the result is sharded along the index by those axes, the sum is a
    reduce-scatter (every device gathers for all the indices, its block comes back);
    elsewhere an all-reduce. Pad rows and padding columns get pad_value after the sum.
    Per device: src's shard and O(result); across devices: O(result) bytes."""
    bshape = aval_out.shape[:nbatch]
    src, n = avals_in[0], avals_in[2].shape[-1]
    sshape = src.shape[nbatch:]
    # The result's dims other than n may not use the rows' axes.
    o = [None if set(_partition.axes_of(e)) & set(row_axes) else e for e in o]
    if scatter:
        o[nbatch] = row_axes[0] if len(row_axes) == 1 else row_axes
    in_specs = [_rows.batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += list(row_specs) + o[nbatch + 1:]
    in_specs[1] += [None]
    in_specs[2] += [None if scatter else o[nbatch]]
    n_block = _partition.local_size(n, o[nbatch], mesh_shape)
    k = math.prod(mesh_shape[a] for a in row_axes)
    plan = _RowsSharded(
        tuple(sshape), dim, nbatch, check_bounds, tuple(row_specs), row_axes,
        tuple(_partition.local_size(d, e, mesh_shape) for d, e in zip(sshape[:dim + 1],
                                                                        row_specs)),
        o[nbatch], n_block, n_block * k if scatter else n_block, scatter,
        _partition.local_size(sshape[-1], o[-1], mesh_shape),
        _partition.local_size(row_len, o[-1], mesh_shape))

    def local(bind: Callable[..., jax.Array], s: jax.Array, offsets: jax.Array,
              index: jax.Array, num: jax.Array, pad: jax.Array) -> jax.Array:
        ids, valid = plan.ids(offsets, index, num)
        flat = s.reshape(s.shape[:nbatch] + (math.prod(plan.local_rows),)
                         + s.shape[nbatch + dim + 1:])
        ob = (1,) * nbatch
        # src as it is (its wire view would be copied for the kernel), a wire pad_value:
        # the rows come out as wire values (summed next), with no conversion.
        pw = _partition.to_wire(pad)
        part = bind(flat, jnp.zeros(ob + (1,), offsets.dtype), ids,
                    jnp.full(ob, plan.n_pad, num.dtype), jnp.zeros(ob, pw.dtype), dim=0,
                    row_len=plan.row_len, nbatch=nbatch, check_bounds=True, **params)
        return _partition.from_wire(plan.combine(part, valid, pw), s.dtype)
    return in_specs, o, local, _rows_note(src, aval_out, row_axes, scatter, True)

