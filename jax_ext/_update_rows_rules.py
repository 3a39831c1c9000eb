"""update_rows' primitive, ``jax_ext_update_rows``, and its rules (the front-end is
``_update_rows.py``).

``jax_ext_update_rows(table, offsets, index, num_indices, grads, *row_leaves,
*other_leaves)`` (``grads`` in the table's dtype, or as its wire values where they crossed
devices) returns ``(table, *row_leaves, *other_leaves)`` after one optimizer step
on the rows a gather with the same ``offsets``, ``index``, ``num_indices`` and static
``dim`` read. ``row_leaves`` are the state's leaves of the table's shape
(at positions ``rows_at`` of the flattened state), ``other_leaves`` the rest (scalars).
Static params: ``opt`` (the optimizer, compared by identity), ``treedef`` (the state's),
``rows_at``, ``dim``, ``nbatch`` (leading batch dims every operand carries: vmap over
stacked tables), ``window`` (0: every slot at once; m: m slots at a time, in a loop, which
bounds the step's memory where a device holds only some of the rows) and ``impl``. Rows
are read with bounds checked whatever the gather's
``check_bounds``: an index a gather would clamp into range addresses no row here, so a
write never lands on a row the index did not name.

Every path runs one step, `_step`: a read (the distinct rows U in order of first
occurrence, each given a slot; per slot the gradient rows summed in index order, as
gather's transpose sums them; the slot's row of the table and of each row leaf), the
optimizer's update on those n slots (XLA code, the same on every path), then a write of
the new rows, in place. The native read and write are two kernels (update_rows.cc); the
lax ones sort the ids (`_lax_slots`) and scatter, with the same slots and sums, so the
same bits.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from . import _compat, _compat_sharding, _lowering, _names, _partition, _rows
from . import _update_rows_partition as _over_mesh
from ._compat import Aval, IrValues, ir
from ._primitives import update_rows_p

_PRIM = _names.UPDATE_ROWS.primitive
# (the ids, the gradient sums, the rows of the table and of each row leaf, the number of
# distinct rows)
Read = tuple[jax.Array, jax.Array, list[jax.Array], jax.Array]


class Optimizer:
    """The optimizer as a static param: compared and hashed by identity (a new object is a
    new program), named by its type for call-site fingerprints (stable across runs)."""

    def __init__(self, opt: Any) -> None:
        self.opt = opt

    def __hash__(self) -> int:
        return id(self.opt)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Optimizer) and other.opt is self.opt

    def __repr__(self) -> str:
        update = getattr(self.opt, "update", None)
        name = getattr(update, "__qualname__", type(update).__qualname__)
        return f"optimizer({type(self.opt).__qualname__}, {name})"


def apply(opt: Any, treedef: Any, rows_at: Sequence[int], sums: jax.Array,
          rows: Sequence[jax.Array], other: Sequence[jax.Array]
          ) -> tuple[list[jax.Array], list[jax.Array]]:
    """One optimizer update on n rows, as optax applies it: ``updates, new =
    opt.update(sums, state_rows, table_rows)``, then ``table_rows + updates`` in the
    table's dtype (``optax.apply_updates``). `rows` holds the table's rows then each row
    leaf's; returns (the new rows, table first; the new other leaves)."""
    state = treedef.unflatten(_merge(rows_at, rows[1:], other))
    updates, new = opt.update(sums, state, rows[0])
    table = jnp.asarray(rows[0] + updates).astype(rows[0].dtype)
    leaves, new_def = jax.tree_util.tree_flatten(new)
    if new_def != treedef:
        raise TypeError(f"update_rows: the optimizer's update returned a state of another "
                        f"structure: {new_def} for {treedef}")
    at = set(rows_at)
    return ([table] + [leaves[i] for i in rows_at],
            [x for i, x in enumerate(leaves) if i not in at])


def _per_batch(fn: Callable[..., Any], nbatch: int) -> Callable[..., Any]:
    """`fn` of one batch element, mapped over the `nbatch` leading dims of every operand."""
    for _ in range(nbatch):
        fn = jax.vmap(fn)
    return fn


def _merge(rows_at: Sequence[int], rows: Sequence[Any], other: Sequence[Any]) -> list[Any]:
    """The state's leaves in its own order, from the row leaves (at `rows_at`) and the
    others."""
    out: list[Any] = []
    r, o = iter(rows), iter(other)
    at = set(rows_at)
    for i in range(len(rows) + len(other)):
        out.append(next(r) if i in at else next(o))
    return out


def _step(read: Callable[..., Read], write: Callable[..., list[jax.Array]], table: jax.Array,
          offsets: jax.Array, index: jax.Array, num: jax.Array, grads: jax.Array,
          *leaves: jax.Array, opt: Optimizer, treedef: Any, rows_at: tuple[int, ...],
          dim: int, nbatch: int, window: int, impl: str) -> list[jax.Array]:
    """The whole step on every path: read, the optimizer on the slots, write; with a
    `window` of m < n slots, the distinct rows m at a time, in a loop (the same step on
    each window: the rows' arithmetic does not depend on their batch)."""
    k, n = len(rows_at), index.shape[-1]
    row_leaves, other = list(leaves[:k]), list(leaves[k:])
    m = n if not 0 < window < n else window
    nrows = math.prod(table.shape[nbatch:nbatch + dim + 1])
    # each batch element is a table of its own
    step: Callable[..., tuple[list[jax.Array], list[jax.Array]]] = _per_batch(
        functools.partial(apply, opt.opt, treedef, rows_at), nbatch)

    def one(first: jax.Array, tables: list[jax.Array]
            ) -> tuple[list[jax.Array], list[jax.Array], jax.Array]:
        ids, sums, rows, count = read(tables[0], offsets, index, num, first, grads,
                                      tables[1:], dim=dim, nbatch=nbatch, m=m)
        # The optimizer's arithmetic is one program of its own, between materialized rows,
        # as the dense step's is between the table and its gradient: a barrier on each
        # side keeps XLA from fusing the rows' gather into it or it into the rows' scatter
        # (the lax path), where it would contract multiply-adds into FMAs otherwise.
        barrier: Callable[[Any], Any] = lax.optimization_barrier  # unannotated in jax
        new_rows, new_other = barrier(step(*barrier((sums, rows, other))))
        return (write(ids, tables, new_rows, nbatch=nbatch, rows=nrows), list(new_other),
                count.astype(first.dtype))
    first = jnp.zeros(table.shape[:nbatch], offsets.dtype)
    if m == n:
        out, new_other, _ = one(first, [table, *row_leaves])
        return out + new_other

    def body(c: tuple[Any, ...]) -> tuple[Any, ...]:
        # Every window takes the state's other leaves (a step count) as the call got them,
        # so they advance once per call.
        out, new_other, count = one(c[0], c[2])
        return c[0] + m, count, out, new_other
    _, _, out, new_other = lax.while_loop(
        lambda c: jnp.any(c[0] < c[1]), body,
        (first, first + 1, [table, *row_leaves], other))
    return list(out) + list(new_other)


# --- the lax read and write ------------------------------------------------------------

def _lax_slots(valid: jax.Array, row: jax.Array, rows: int
               ) -> tuple[jax.Array, jax.Array]:
    """(slot of each index, n for a pad row; the flat row of each slot, -1 past the
    distinct rows), slots in order of first occurrence, as the native read assigns them:
    one stable sort of the rows, then scans and scatters of n values."""
    n = row.shape[-1]
    pos = jnp.arange(n, dtype=np.int32)
    key = jnp.where(valid, row, rows).astype(row.dtype)
    skey, spos = lax.sort((key, pos), num_keys=1, is_stable=True)
    real = skey < rows
    start = real & jnp.concatenate([jnp.ones((1,), bool), skey[1:] != skey[:-1]])
    # Each run of one row starts at its first occurrence (the sort is stable).
    run_start = lax.cummax(jnp.where(start, pos, 0), axis=0)
    first_of = spos[run_start]
    is_first = jnp.zeros((n,), bool).at[spos].set(start)
    slot_of_first = jnp.cumsum(is_first.astype(np.int32)) - 1
    slot = jnp.full((n,), n, np.int32).at[spos].set(
        jnp.where(real, slot_of_first[first_of], n))
    ids = jnp.full((n,), -1, row.dtype).at[slot].set(row, mode="drop")
    return slot, ids


def _moved(x: jax.Array) -> jax.Array:
    """x as the unsigned integers of its width, which XLA moves bit for bit (inside a
    gather of its rows the view costs nothing)."""
    return _partition.to_wire(x)


def _scattered(x: jax.Array) -> jax.Array:
    """x as XLA:CPU scatters it bit for bit: as it is, but for bfloat16 and the 8-bit
    floats, which XLA:CPU scatters through a wider float (rewriting NaN payloads) and which
    move as unsigned integers instead. A view of the whole table is a copy there, as XLA's
    own conversion is."""
    dt = np.dtype(x.dtype)
    return x if dt.itemsize >= 2 and dt.name not in _lowering.XLA_INEXACT else _moved(x)


def _lax_read(table: jax.Array, offsets: jax.Array, index: jax.Array, num: jax.Array,
              first: jax.Array, grads: jax.Array, row_leaves: Sequence[jax.Array], *,
              dim: int, nbatch: int, m: int) -> Read:
    if nbatch:
        read: Read = _per_batch(functools.partial(_lax_read, dim=dim, nbatch=0, m=m), nbatch)(
            table, offsets, index, num, first, grads, list(row_leaves))
        return read
    sshape = table.shape
    rows = math.prod(sshape[:dim + 1])
    row_shape = tuple(sshape[dim + 1:])
    valid, row = _rows.rows(offsets, index, num, sshape=sshape, dim=dim, check_bounds=True)
    slot, ids = _lax_slots(valid, row, rows)
    start = jnp.maximum(first, 0)
    at = slot - start.astype(slot.dtype)
    at = jnp.where((at >= 0) & (at < m), at, m)  # this window's slots; the others dropped
    g = _partition.from_wire(grads, table.dtype)  # gathered across devices: wire values
    g = g[..., :sshape[-1]] if g.shape[-1] != sshape[-1] else g
    acc = _rows.acc_dtype(table.dtype)
    sums = jnp.zeros((m,) + row_shape, acc).at[at].add(g.astype(acc), mode="drop")
    wids = lax.dynamic_slice(jnp.concatenate([ids, jnp.full((m,), -1, ids.dtype)]),
                             (start.astype(np.int32),), (m,))
    take = jnp.where(wids < 0, rows, wids)
    taken = [_partition.from_wire(_moved(x).reshape((rows,) + row_shape).at[take].get(
        mode="fill", fill_value=0), x.dtype) for x in (table, *row_leaves)]
    return wids, sums.astype(table.dtype), taken, jnp.sum(ids >= 0).astype(ids.dtype)


def _lax_write(ids: jax.Array, leaves: Sequence[jax.Array], new_rows: Sequence[jax.Array], *,
               nbatch: int, rows: int) -> list[jax.Array]:
    if nbatch:
        written: list[jax.Array] = _per_batch(
            functools.partial(_lax_write, nbatch=0, rows=rows), nbatch)(
            ids, list(leaves), list(new_rows))
        return written
    at = jnp.where(ids < 0, rows, ids)
    out = []
    for x, r in zip(leaves, new_rows):
        flat = _scattered(x).reshape((rows,) + r.shape[1:])
        new = flat.at[at].set(_scattered(r), mode="drop")
        out.append(_partition.from_wire(new, x.dtype).reshape(x.shape))
    return out


# --- the native read and write ---------------------------------------------------------

def _ids_dtype(rows: int) -> np.dtype[Any]:
    """The ids' dtype: int32 where every flat row fits it, else int64."""
    return np.dtype(np.int32 if rows <= np.iinfo(np.int32).max else np.int64)


def _native_read(table: jax.Array, offsets: jax.Array, index: jax.Array, num: jax.Array,
                 first: jax.Array, grads: jax.Array, row_leaves: Sequence[jax.Array], *,
                 dim: int, nbatch: int, m: int) -> Read:
    bshape = tuple(table.shape[:nbatch])
    sshape = table.shape[nbatch:]
    ids_dtype = _ids_dtype(math.prod(sshape[:dim + 1]))
    rows_shape = bshape + (m,) + tuple(sshape[dim + 1:])
    results = [_compat.ShapeDtypeStruct(bshape + (m,), ids_dtype),
               _compat.ShapeDtypeStruct(rows_shape, table.dtype),
               _compat.ShapeDtypeStruct(bshape, ids_dtype)] + [
        _compat.ShapeDtypeStruct(rows_shape, x.dtype) for x in (table, *row_leaves)]
    out = _lowering.ffi_function(_names.UPDATE_ROWS_READ, results, dim=dim, nbatch=nbatch,
                                 check_bounds=True)(
        offsets, index, num, first, grads, table, *row_leaves)
    return out[0], out[1], list(out[3:]), out[2]


def _native_write(ids: jax.Array, leaves: Sequence[jax.Array], new_rows: Sequence[jax.Array],
                  *, nbatch: int, rows: int) -> list[jax.Array]:
    bshape, n = tuple(ids.shape[:nbatch]), ids.shape[-1]
    views, news = [], []
    for x, r in zip(leaves, new_rows):
        e = math.prod(r.shape[nbatch + 1:])
        views.append(x.reshape(bshape + (rows, e)))
        news.append(r.reshape(bshape + (n, e)))
    k = len(views)
    out = _lowering.ffi_function(
        _names.UPDATE_ROWS_WRITE, [_compat.ShapeDtypeStruct(v.shape, v.dtype) for v in views],
        aliases={1 + j: j for j in range(k)}, nbatch=nbatch)(ids, *views, *news)
    return [o.reshape(x.shape) for o, x in zip(out, leaves)]


def _update_lax(*args: jax.Array, **params: Any) -> list[jax.Array]:
    return _step(_lax_read, _lax_write, *args, **params)


def _update_native(ctx: _lowering.Ctx, *args: ir.Value[Any], **params: Any) -> IrValues | None:
    avals: Sequence[Aval] = ctx.avals_in
    k = len(params["rows_at"])
    if not (_lowering.native_dtype_ok(avals[0].dtype, _names.UPDATE_ROWS)
            and _lowering.native_dtype_ok(avals[2].dtype)
            and all(_lowering.native_dtype_ok(a.dtype) for a in avals[5:5 + k])):
        return None
    rule: _compat.mlir.LoweringRule = _compat.mlir.lower_fun(
        functools.partial(_step, _native_read, _native_write, **params),
        multiple_results=True)
    out: IrValues = rule(ctx, *args)
    return out


# --- abstract evaluation, autodiff, batching ---------------------------------------------

def _abstract_eval(table: Aval, offsets: Aval, index: Aval, num: Aval, grads: Aval,
                   *leaves: Aval, opt: Optimizer, treedef: Any, rows_at: tuple[int, ...],
                   dim: int, nbatch: int, window: int, impl: str) -> list[Aval]:
    avals = (table, offsets, index, num, grads, *leaves)
    k = len(rows_at)
    for a in leaves[:k]:
        if a.shape != table.shape:
            raise ValueError(f"{_PRIM}: a row leaf {a.str_short()} is not shaped like the "
                             f"table {table.str_short()}")
    return [a.update(**_compat_sharding.varying_update(_PRIM, avals, a))
            for a in (table, *leaves)]


def _jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], **params: Any) -> Any:
    raise TypeError("update_rows is a training step: it has no derivative (differentiate "
                    "the loss that gives its grads, then pass them to update_rows)")


def _batch(axis_size: int, args: Sequence[jax.Array], bdims: Sequence[int | None],
           **params: Any) -> tuple[list[jax.Array], list[int]]:
    """Every operand carries the whole batch (the kernels update each batch element's
    table in place): unbatched operands are broadcast."""
    lead = [_rows.lead(a, d) for a, d in zip(args, bdims)]
    full = [jnp.broadcast_to(a, (axis_size,) + a.shape[1:]) for a in lead]
    params = dict(params, nbatch=params["nbatch"] + 1)
    out: list[jax.Array] = update_rows_p.bind(*full, **params)  # type: ignore[assignment]
    return out, [0] * len(out)


# --- registration: every rule of jax_ext_update_rows ---------------------------------

update_rows_p.def_impl(
    lambda *args, **params: _compat.apply_primitive(update_rows_p, *args, **params))
update_rows_p.def_abstract_eval(_abstract_eval)
# partition_lax: the lax path partitions by the same rule (XLA's own partitioning of its
# sort and scatter would gather the table), so every path keeps the table where it lies.
_lowering.register(update_rows_p, _names.UPDATE_ROWS, _update_lax, _update_native,
                   spmd=_partition.Spmd(_over_mesh.spmd_rule, _over_mesh.spmd_partition,
                                        _over_mesh.as_is),
                   partition_lax=True)
_compat.ad.primitive_jvps[update_rows_p] = _jvp
_compat.register_batcher(update_rows_p, _batch)
