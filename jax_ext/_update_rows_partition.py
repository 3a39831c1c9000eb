"""How update_rows partitions over a device mesh (its rules: ``_update_rows_rules.py``).

The table and its table-shaped state keep their sharding, and are updated in place where
they lie: they never cross devices (``as_is``). What moves is the step's input, O(n): the
index and the gradient rows are gathered along the index dim to every device, as
unsigned integers of their width (the partitioned call's wire values), which the step
reads as they came (a view back to floats would copy them). Then each device runs the
one-device step on its shard:

* a table whose rows (dims 0..dim) are not sharded (replicated, or sharded along its
  columns or batch): the step on the local shard, every device the same rows;
* a table sharded along its rows: each device computes, with the global geometry, which
  of the rows read it holds (`_rows.held_rows`), and steps on those alone, named by their
  row in its shard (every other index is a pad row there). Each row's gradient rows are
  summed in index order on the device that holds it, so its bits are one device's.

Either way each device traces the optimizer's arithmetic from the same function as one
device. On a row-sharded table a device steps on its distinct rows a window of slots at a
time (`window`): it holds about 1/devices of the rows read, so its memory stays a fraction
of the gradient rows' however many indices it sees.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import _partition, _rows
from ._compat import Aval, SpecEntry

# The operands: table, offsets, index, num_indices, grads, then the row leaves (as many
# as rows_at has) and the other leaves; the results: the table, the row leaves, the others.
_TABLE, _OFFSETS, _INDEX, _NUM, _GRADS, _LEAVES = range(6)


def as_is(avals_in: Sequence[Aval], *, rows_at: tuple[int, ...], **_: Any
          ) -> tuple[set[int], set[int]]:
    """The table and its row leaves, in and out, cross the call as they are: they stay
    where they lie."""
    k = len(rows_at)
    return {_TABLE} | set(range(_LEAVES, _LEAVES + k)), set(range(1 + k))


def spmd_rule(avals_in: Sequence[Aval], avals_out: Sequence[Aval], *, dim: int,
              nbatch: int, rows_at: tuple[int, ...], **_: Any) -> _partition.Factors:
    """The table, its row leaves and their results share every factor; the gradient rows
    share the table's middle and last dims (the front-end cut its padding columns); the
    index dim (n) and the offsets are replicated: gathered to every device."""
    sshape = avals_in[_TABLE].shape[nbatch:]
    b = [f"b{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(sshape) - dim - 2)]
    table = b + [f"s{i}" for i in range(dim + 1)] + mid + ["l"]
    k, others = len(rows_at), len(avals_in) - _LEAVES - len(rows_at)
    f_in = [table, b + ["q"], b + ["n"], b, b + ["n"] + mid + ["l"]] + [table] * k + [b] * others
    f_out = [table] * (1 + k) + [b] * others
    return f_in, f_out, ("q", "n"), ()


def spmd_partition(o: Sequence[Sequence[SpecEntry]], mesh_shape: Mapping[str, int],
                   avals_in: Sequence[Aval], avals_out: Sequence[Aval],
                   given: Sequence[Sequence[SpecEntry]], *, dim: int, nbatch: int,
                   rows_at: tuple[int, ...], **params: Any) -> _partition.Partition:
    table = avals_in[_TABLE]
    t = _rows.nonunit(list(o[0]), table.shape)
    bspec, row_specs, rest = t[:nbatch], t[nbatch:nbatch + dim + 1], t[nbatch + dim + 1:]
    k, others = len(rows_at), len(avals_in) - _LEAVES - len(rows_at)
    params = dict(params, rows_at=rows_at, nbatch=nbatch)
    in_specs = ([t, bspec + [None], bspec + [None], bspec, bspec + [None] + rest]
                + [t] * k + [bspec] * others)
    out_specs = [t] * (1 + k) + [bspec] * others
    if all(e is None for e in row_specs):
        def local(bind: Callable[..., Any], table: jax.Array, offsets: jax.Array,
                  index: jax.Array, num: jax.Array, grads: jax.Array, *leaves: jax.Array) -> Any:
            return bind(table, offsets, index, num, _partition.to_wire(grads), *leaves, dim=dim,
                        **params)
        return in_specs, out_specs, local, None
    devices = math.prod(mesh_shape[a] for e in row_specs for a in _partition.axes_of(e))
    plan = _Rows(tuple(table.shape[nbatch:]), dim, nbatch, k, tuple(row_specs),
                 tuple(_partition.local_size(d, e, mesh_shape)
                       for d, e in zip(table.shape[nbatch:nbatch + dim + 1], row_specs)),
                 dict(params, window=window(avals_in[_INDEX].shape[-1], devices)))
    axes = ", ".join(a for e in row_specs for a in _partition.axes_of(e))
    return in_specs, out_specs, plan.gathered, (
        f"the table stays sharded along its rows ({axes}): each device updates the rows it "
        "holds, from the gradient rows gathered to every device")


def window(n: int, devices: int) -> int:
    """The slots a device steps on at a time, where it holds 1/devices of the rows: about
    half its even share of the n indices, in whole blocks of 64, so that its memory is a
    fraction of the gradient rows' (a device holding more distinct rows loops over them)."""
    share = -(-n // (2 * devices))
    return min(n, max(64, -(-share // 64) * 64))


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The step on a table sharded along its rows, on one device (see the module's doc)."""
    sshape: tuple[int, ...]           # one global table
    dim: int
    nbatch: int
    k: int                            # row leaves
    row_specs: tuple[SpecEntry, ...]  # the table's row dims (0..dim)
    local_rows: tuple[int, ...]       # a shard's extent along each row dim
    params: dict[str, Any]

    def step(self, bind: Callable[..., Any], table: jax.Array, ids: jax.Array,
             grads: jax.Array, leaves: Sequence[jax.Array]) -> list[jax.Array]:
        """The one-device step on this shard, each index a row of it (-1: a pad row)."""
        lead, nb = table.shape[:self.nbatch], self.nbatch

        def flat(x: jax.Array) -> jax.Array:
            return x.reshape(lead + (math.prod(self.local_rows),) + x.shape[nb + self.dim + 1:])
        out = bind(flat(table), jnp.zeros(lead + (1,), ids.dtype), ids,
                   jnp.full(lead, ids.shape[-1], ids.dtype), _partition.to_wire(grads),
                   *map(flat, leaves[:self.k]), *leaves[self.k:], dim=0, **self.params)
        return [x.reshape(table.shape) for x in out[:1 + self.k]] + list(out[1 + self.k:])

    def held(self, offsets: jax.Array, index: jax.Array, num: jax.Array) -> jax.Array:
        """Each index's row in this shard, -1 where this shard does not hold it."""
        valid, row = _rows.rows(offsets, index, num, sshape=self.sshape, dim=self.dim,
                                check_bounds=True)
        held, lrow = _rows.held_rows(valid, row, self.sshape[:self.dim + 1], self.local_rows,
                                     self.row_specs)
        return jnp.where(held, lrow, -1)

    def gathered(self, bind: Callable[..., Any], table: jax.Array, offsets: jax.Array,
                 index: jax.Array, num: jax.Array, grads: jax.Array,
                 *leaves: jax.Array) -> list[jax.Array]:
        """Every index and gradient row here (XLA gathered them): the rows held."""
        return self.step(bind, table, self.held(offsets, index, num), grads, leaves)
