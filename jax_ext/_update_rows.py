"""update_rows: a training step on the rows a gather read, the front-end over the
``jax_ext_update_rows`` primitive (its rules: ``_update_rows_rules.py``).

The front-end checks every argument as gather checks its own (``_gather_args.py``), splits
the optimizer state's leaves into those shaped like the table (read and written at the
touched rows) and the rest (scalars, passed whole), checks that the optimizer's update
keeps every leaf's shape and dtype, and binds the primitive. An eager call runs the same
jitted program, one per optimizer object (a bounded cache).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _compat, _config, _gather_args as _args
# the primitive the front-end binds, whose rules _update_rows_rules registers
from . import _update_rows_rules as _rules
from ._common import as_array, describe, fmt_shape as _fmt
from ._primitives import update_rows_p

_FN = "update_rows"


def update_rows(optimizer: Any, table: ArrayLike, state: Any,
                offsets: Sequence[ArrayLike] | ArrayLike, dim: int, index: ArrayLike,
                grads: ArrayLike, *, check_bounds: bool = True,
                num_indices: ArrayLike | None = None) -> tuple[jax.Array, Any]:
    """One optimizer step on the rows ``gather(table, offsets, dim, index, ...)`` read.

    ``grads`` is the cotangent of that gather's result (``jax.grad`` of the loss with
    respect to the gathered rows). Where ``jax.grad`` with respect to the table would build
    a table-sized gradient and the optimizer would then sweep the whole table,
    ``update_rows`` reads and writes only the rows the gather read: with ``table`` and
    ``state`` donated (``jax.jit(..., donate_argnums=...)``) it works in place, and its cost
    and memory grow with ``n``, not with the table.

    For every distinct row ``r`` the gather read (in range, before ``num_indices``; pad
    rows are no rows), its gradient is ``+0.0`` plus the ``grads`` rows that read it, in
    index order, in the table's dtype (float16 and bfloat16 summed in float32 and rounded
    once): the row the dense gradient through :func:`gather` has, bit for bit. Padding
    columns of ``grads`` are ignored. The optimizer then sees ``n`` rows: the distinct rows
    in order of first occurrence, then padding rows of zeros. State leaves shaped like the
    table are read and written at those rows; every other leaf (a step count) is passed
    whole. Rows not read keep their bits, in the table and in its state.

    With ``optax.sgd`` and ``optax.adagrad`` the whole table and state equal the dense
    step's bit for bit, on every path (an untouched signalling NaN stays signalling where
    the dense step quiets it). Optimizers that move a row whose gradient is zero
    (momentum, Adam) are *lazy* here: untouched rows' state does not decay. Only
    row-separable transformations are meaningful: one that reduces over a leaf (global-norm
    clipping, lamb, lars) or accumulates over steps (``MultiSteps``) sees a batch of rows,
    not the table. The optimizer is a static part of the program: a new optimizer object
    compiles a new one, so build it once.

    Args:
        optimizer: an optax ``GradientTransformation``, or any object with
            ``update(updates, state, params) -> (updates, state)``.
        table: the floating-point array gathered from (rank >= 2).
        state: ``optimizer.init(table)`` or a later state of it: a pytree whose leaves are
            arrays of the table's shape (any dtype) or scalars.
        offsets, dim, index, num_indices: as for :func:`gather`, which read the rows.
        check_bounds: as for :func:`gather` (a static bool). Whatever its value, an index
            out of range (or with offsets out of range) updates no row: where a gather with
            ``check_bounds=False`` clamps it onto an edge row, update_rows never writes
            there.
        grads: shape ``(n, *table.shape[dim+1:-1], L)`` with ``L >= table.shape[-1]``
            (gather's padding columns, ignored), the table's dtype.

    Returns:
        ``(table, state)`` after the step, each of its input's shapes, dtypes and tree.

    Raises:
        TypeError: an optimizer without ``update``; a table that is not floating point;
            an index that is not integer; ``grads`` of another dtype than the table; an
            optimizer whose update changes a leaf's shape or dtype or the state's tree;
            ``jax.grad`` through it.
        ValueError: ``grads`` of the wrong shape; a non-scalar state leaf not shaped like
            the table (its path named); ``offsets``, ``dim``, ``index`` or
            ``num_indices`` as :func:`gather` refuses them.
        NotImplementedError: ``dim`` is the last dimension of ``table``.

    Example:
        >>> import numpy as np, optax, jax_ext
        >>> table, opt = np.zeros((8, 4), np.float32), optax.sgd(0.5)
        >>> ids, grads = np.array([1, 3, 1]), np.ones((3, 4), np.float32)
        >>> new, state = jax_ext.update_rows(opt, table, opt.init(table), [0], 0, ids, grads)
        >>> np.asarray(new)[:4, 0].tolist()  # row 1 read twice: its gradient is 2
        [0.0, -1.0, 0.0, -0.5]
    """
    if not callable(getattr(optimizer, "update", None)):
        raise TypeError(f"{_FN}: optimizer must have an update(updates, state, params) "
                        f"method (an optax GradientTransformation), got {describe(optimizer)}")
    eager = all(not isinstance(x, jax.core.Tracer)
                for x in jax.tree_util.tree_leaves((table, state, offsets, index, grads,
                                                    num_indices)))
    if eager and type(dim) is int and type(check_bounds) is bool and _static_ok(
            offsets, index, num_indices):
        return cast(tuple[jax.Array, Any], _jitted(optimizer)(
            table, state, offsets, dim, index, grads, check_bounds, num_indices))
    return _update_rows(optimizer, table, state, offsets, dim, index, grads, check_bounds,
                        num_indices)


def _update_rows(optimizer: Any, table: ArrayLike, state: Any,
                 offsets: Sequence[ArrayLike] | ArrayLike, dim: int, index: ArrayLike,
                 grads: ArrayLike, check_bounds: bool, num_indices: ArrayLike | None
                 ) -> tuple[jax.Array, Any]:
    table = as_array(table, "table must be an array", _FN)
    if not jnp.issubdtype(table.dtype, jnp.floating):
        raise TypeError(f"{_FN}: table must have a floating-point dtype, got table "
                        f"{_fmt(table.shape)} ({table.dtype})")
    dim = _args.checked_dim(table, dim, _FN)
    offsets_arr = _args.offsets_operand(offsets, dim, _FN)
    index_arr = _args.index_operand(index, _FN)
    num = _args.num_indices_operand(num_indices, index_arr, _FN)
    _args.static_check_bounds(check_bounds, _FN)  # (rows are always checked: see _rules)
    g = _checked_grads(grads, table, dim, index_arr.shape[0])
    if g.shape[-1] != table.shape[-1]:  # gather's padding columns: ignored
        g = g[..., :table.shape[-1]]
    treedef, rows_at, leaves, paths = _split_state(state, table)
    _check_update(optimizer, treedef, rows_at, table, dim, leaves, paths)
    row_leaves = [leaves[i] for i in rows_at]
    other = [x for i, x in enumerate(leaves) if i not in set(rows_at)]
    out = cast(list[jax.Array], _compat.bind(
        update_rows_p, table, offsets_arr, index_arr, num, g, *row_leaves, *other,
        opt=_rules.Optimizer(optimizer), treedef=treedef, rows_at=rows_at, dim=dim,
        nbatch=0, window=0, impl=_config.current()))
    k = len(rows_at)
    new_leaves = _rules._merge(rows_at, out[1:1 + k], out[1 + k:])
    return out[0], treedef.unflatten(new_leaves)


def _checked_grads(grads: ArrayLike, table: jax.Array, dim: int, n: int) -> jax.Array:
    """grads as an array: the table's dtype, shape (n, *table.shape[dim+1:-1], L >= last)."""
    g = as_array(grads, "grads must be an array", _FN)
    if g.dtype != table.dtype:
        raise TypeError(f"{_FN}: grads {_fmt(g.shape)} ({g.dtype}) must have the table's "
                        f"dtype {table.dtype}")
    mid = tuple(table.shape[dim + 1:-1])
    if (g.ndim != len(mid) + 2 or g.shape[0] != n or tuple(g.shape[1:-1]) != mid
            or not _args.maybe_le(table.shape[-1], g.shape[-1])):
        want = ", ".join(map(str, (n,) + mid))
        raise ValueError(f"{_FN}: grads {_fmt(g.shape)} must have shape ({want}, L) with L >= "
                         f"{table.shape[-1]}: gather's result for table "
                         f"{_fmt(table.shape)}, dim {dim} and an index of {n}")
    return g


def _split_state(state: Any, table: jax.Array
                 ) -> tuple[Any, tuple[int, ...], list[jax.Array], list[str]]:
    """(the state's treedef, the positions of its leaves shaped like the table, every leaf
    as an array, every leaf's path). A leaf that is neither shaped like the table nor a
    scalar: ValueError naming its path."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    rows_at, leaves, paths = [], [], []
    for i, (path, leaf) in enumerate(flat):
        where = jax.tree_util.keystr(path)
        x = as_array(leaf, f"the state leaf {where} must be an array", _FN)
        if tuple(x.shape) == tuple(table.shape):
            rows_at.append(i)
        elif x.ndim != 0:
            raise ValueError(f"{_FN}: the state leaf {where} {_fmt(x.shape)} ({x.dtype}) is "
                             f"neither shaped like the table {_fmt(table.shape)} nor a scalar")
        leaves.append(x)
        paths.append(where)
    return treedef, tuple(rows_at), leaves, paths


def _check_update(optimizer: Any, treedef: Any, rows_at: tuple[int, ...], table: jax.Array,
                  dim: int, leaves: Sequence[jax.Array], paths: Sequence[str]) -> None:
    """The optimizer's update, traced on rows, keeps the state's tree and every leaf's
    shape and dtype (TypeError naming the first leaf that changes)."""
    rows_shape = (1,) + tuple(table.shape[dim + 1:])
    spec: Callable[[jax.Array], jax.ShapeDtypeStruct] = lambda x: _compat.ShapeDtypeStruct(
        rows_shape if tuple(x.shape) == tuple(table.shape) else x.shape, x.dtype)
    at = set(rows_at)
    rows = [spec(table)] + [spec(leaves[i]) for i in rows_at]
    other = [spec(x) for i, x in enumerate(leaves) if i not in at]
    names = ["the table"] + [f"the state leaf {paths[i]}" for i in rows_at] + [
        f"the state leaf {p}" for i, p in enumerate(paths) if i not in at]
    new_rows, new_other = jax.eval_shape(
        lambda s, r, o: _rules.apply(optimizer, treedef, rows_at, s, r, o),
        spec(table), rows, other)
    for name, want, got in zip(names, rows + other, list(new_rows) + list(new_other)):
        if (tuple(want.shape), want.dtype) != (tuple(got.shape), got.dtype):
            raise TypeError(f"{_FN}: the optimizer's update turns {name} ({want.dtype}, "
                            f"{_fmt(want.shape)} on a batch of one row) into {got.dtype} "
                            f"{_fmt(got.shape)}; update_rows keeps every leaf's shape and "
                            "dtype")


# --- eager calls ------------------------------------------------------------------------

def _static_ok(offsets: object, index: object, num_indices: object) -> bool:
    """Do the Python and numpy integers among offsets and num_indices pass the checks the
    front-end makes on static values? jit traces them, so where one does not, the call
    runs unjitted and the front-end raises its own error."""
    ints = [_args.static_int(o) for o in (offsets if isinstance(offsets, (list, tuple))
                                          else ())]
    info = np.iinfo(_args.default_int())
    if any(v is not None and not info.min <= v <= info.max for v in ints):
        return False
    num = _args.static_int(_args.concrete_num_indices(num_indices))
    shape = np.shape(index) if hasattr(index, "shape") else ()
    return num is None or (len(shape) == 1 and 0 <= num <= shape[0])


# One jitted step per optimizer object (static: its update is traced into the program),
# in a bounded cache holding the object itself, so an id is never reused while cached.
_CACHE: OrderedDict[int, tuple[Any, Callable[..., Any]]] = OrderedDict()
_CACHE_SIZE = 64
_LOCK = threading.Lock()


def _jitted(optimizer: Any) -> Callable[..., Any]:
    with _LOCK:
        hit = _CACHE.get(id(optimizer))
        if hit is not None and hit[0] is optimizer:
            _CACHE.move_to_end(id(optimizer))
            return hit[1]

    def step(table: Any, state: Any, offsets: Any, dim: int, index: Any, grads: Any,
             check_bounds: bool, num_indices: Any) -> tuple[jax.Array, Any]:
        return _update_rows(optimizer, table, state, offsets, dim, index, grads,
                            check_bounds, num_indices)
    fn: Callable[..., Any] = jax.jit(step, static_argnums=(3, 6))
    with _LOCK:
        _CACHE[id(optimizer)] = (optimizer, fn)
        _CACHE.move_to_end(id(optimizer))
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return fn


