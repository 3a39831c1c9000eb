"""gather (Ascend asctile.gather): the gather primitive and its rules.

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
compiled program serves every value. ``index`` keeps its own integer
dtype: the kernel reads any width and signedness and adds it to ``offsets[dim]`` in
128-bit arithmetic, which is exact for uint64 indices too (a conversion to int64 would
cost a pass and wrap uint64 values >= 2**63 into range).

Its transpose with respect to ``src`` is the scatter-add primitive of ``_scatter_add.py``,
whose own transpose is this gather (both primitives live in ``_primitives.py``); the row
and batch geometry they share is in ``_rows.py``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from . import _compat, _config, _eager, _gather_args as _args, _lowering, _names, _rows
from ._compat import Aval, PartitionSpec, Primal, SpecEntry, Tangent, ir
# gather's transpose binds the scatter-add, whose rules _scatter_add registers
from . import _scatter_add  # noqa: F401
from ._primitives import gather_p, scatter_add_p
from ._common import (as_array, check_extended, fmt_shape as _fmt, is_extended, is_key,
                      result_dim, sum_to_shape)

Zero = _compat.Zero


def gather(src: ArrayLike, offsets: Sequence[ArrayLike] | ArrayLike, dim: int,
           index: ArrayLike, *, check_bounds: bool = True,
           num_indices: ArrayLike | None = None, pad_value: ArrayLike | None = None,
           align_bytes: int | None = 32) -> jax.Array:
    """Gather rows of ``src`` picked by ``index`` along ``dim``: Ascend ``asctile.gather``.

    For ``i < n = index.shape[0]``, with ``r = offsets[dim] + index[i]``::

        result[i] = src[offsets[0], ..., offsets[dim-1], r, :, ..., :]

    The result has shape ``(n, *src.shape[dim+1:-1], L)`` and ``src``'s dtype, where ``L``
    is ``src.shape[-1]`` rounded up so that ``L * itemsize`` is a multiple of
    ``align_bytes``: by default the last dimension is **padded to 32 bytes** (a 5-column
    float32 ``src`` gives 8 columns); pass ``align_bytes=None`` for no padding. The extra
    columns hold ``pad_value``. Negative and past-the-end positions are out of range (not
    wrapped, unlike ``jnp.take``). Values move bit for bit.

    ``offsets``, ``num_indices`` and ``pad_value`` may each be static or traced; they are
    operands either way, so one compiled program serves every value. ``offsets`` and
    ``num_indices`` travel in jax's default integer type (int64 under
    ``jax_enable_x64``, else int32); ``offsets[dim] + index[i]`` is computed exactly.

    Gradients: ``src`` gets a scatter-add of the cotangent rows (duplicates accumulate in
    index order, deterministically; padded rows and columns contribute nothing;
    float16/bfloat16 accumulate in float32 and round once). ``pad_value`` gets the sum of
    the cotangent over every padded position; ``offsets``, ``index`` and ``num_indices``
    get none. ``vmap`` over any operand is one call with a batch dimension. The
    documentation's "Sharp bits" page lists the decisions taken where the contract is
    silent.

    Args:
        src: the array to gather from, of rank >= 2 and any JAX dtype, or a typed PRNG key
            array (gathered key by key: ``align_bytes`` counts whole keys, padded positions
            hold the all-zero key, and ``pad_value`` must be ``None``).
        offsets: ``dim + 1`` integers (Python ints or integer scalar arrays, traced
            allowed), or a rank-1 integer array of that length: the start position in
            each of ``src``'s dimensions ``0 .. dim``.
        dim: a Python int, ``0 <= dim < src.ndim - 1``: the dimension ``index`` walks.
        index: a rank-1 array of any integer dtype, shape ``(n,)``, traced allowed.
        check_bounds: ``True``: a row whose ``offsets[:dim]`` or ``r`` lie outside
            ``src`` holds ``pad_value``. ``False``: positions are clamped into ``src``
            (memory outside it is never read), so an out-of-range row holds the nearest
            edge row and its gradient goes there. A static Python bool (or ``np.bool_``);
            a traced value raises ``TypeError`` (mark it static in ``jit``).
        num_indices: ``None`` (all ``n`` rows) or an integer scalar, traced allowed:
            rows ``num_indices .. n-1`` hold ``pad_value``. A Python int or a numpy
            integer (scalar or 0-d array) is static: outside ``[0, n]`` it raises
            ``ValueError``, eagerly and under ``jit``. A jax array, traced or concrete, is
            clamped to ``[0, n]``, eagerly as under ``jit``.
        pad_value: ``None`` (0) or a scalar, traced allowed. A Python scalar (or a weakly
            typed one, as a Python scalar passed to ``jit`` is) takes ``src.dtype`` when it
            is of ``src``'s kind or a lower one (bool < int < float < complex); one that
            would promote ``src`` (0.5 for an int32 ``src``) raises ``TypeError`` rather
            than be cut, and a Python int that does not fit raises ``ValueError``. A typed
            scalar array is cast to ``src.dtype`` (as ``astype``).
        align_bytes: ``None`` or a positive multiple of ``src``'s itemsize, at most
            ``2**31`` (sub-byte dtypes count as 1 byte). Default 32.

    Returns:
        A ``jax.Array`` of shape ``(n, *src.shape[dim+1:-1], L)`` and dtype ``src.dtype``.

    Raises:
        TypeError: ``src``, ``index`` or an offset is not an array of integers where one is
            needed (``index`` of a float or bool dtype, ``dim`` not an int, a
            ``pad_value`` that would promote ``src.dtype``, a traced ``check_bounds``, an
            operand that is not an array or a scalar).
        ValueError: ``dim`` out of range; ``offsets`` of the wrong length; ``index`` not of
            rank 1, or (x64 off) a numpy ``index`` holding values that do not fit int32;
            a static (Python or numpy) ``num_indices`` outside ``[0, n]``; a ``pad_value``
            that is not a scalar or does not fit ``src.dtype``; a bad ``align_bytes``.
        NotImplementedError: ``dim`` is the last dimension of ``src`` (as in the seed).

    Example:
        >>> import numpy as np, jax_ext
        >>> src = np.arange(256, dtype=np.int32).reshape(32, 8)
        >>> rows = jax_ext.gather(src, [0], 0, np.arange(0, 32, 2))  # every other row
        >>> rows.shape, bool((np.asarray(rows) == src[::2]).all())
        ((16, 8), True)
        >>> table = np.ones((10, 5), np.float32)
        >>> jax_ext.gather(table, [0], 0, np.array([1, -1, 9]), pad_value=-1.0).tolist()[1]
        [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
        >>> jax_ext.gather(table, [0], 0, np.array([1]), align_bytes=None).shape
        (1, 5)
    """
    # The commonest eager call (jax arrays, Python-int offsets, no num_indices or
    # pad_value) in the fewest Python steps: each costs microseconds before a dispatch of
    # about ten. _eager_args takes every other call that jit can take.
    if (type(src) in _eager.CONCRETE and type(index) in _eager.CONCRETE
            and type(offsets) in (list, tuple) and type(dim) is int
            and num_indices is None and pad_value is None
            and (check_bounds is True or check_bounds is False)
            and (align_bytes is None or type(align_bytes) is int) and _eager.ENABLED):
        offs = _eager.int_offsets(offsets)  # type: ignore[arg-type]
        if offs is not None:
            return cast(jax.Array, _gather_jit(src, offs, dim, index, check_bounds, None,
                                               None, align_bytes))
    fast = _eager_args(src, offsets, dim, index, check_bounds, num_indices, pad_value,
                       align_bytes)
    if fast is None:
        return _gather(src, offsets, dim, index, check_bounds, num_indices, pad_value,
                       align_bytes)
    return cast(jax.Array, _gather_jit(*fast))


def _eager_args(src: object, offsets: object, dim: object, index: object,
                check_bounds: object, num_indices: object, pad_value: object,
                align_bytes: object) -> tuple[object, ...] | None:
    """gather's arguments as its jitted front-end takes them (see _eager), or None where
    it runs unjitted: static dim, check_bounds and align_bytes of the types gather
    takes; offsets, num_indices and pad_value as arrays, or concrete values that pass
    here the checks the front-end makes on them (jit traces those, so the front-end's
    own checks would not see their values)."""
    if not (_eager.ENABLED and type(dim) is int and type(check_bounds) in (bool, np.bool_)
            and (align_bytes is None or type(align_bytes) is int)
            and _eager.array(src) and _eager.array(index)):
        return None
    eager = _eager.concrete(src)  # else traced: Python ints stay constants of the trace
    offsets = _eager_offsets(offsets, eager)
    if offsets is None:
        return None
    num = _args.concrete_num_indices(num_indices)
    s = _eager.static_int(num)
    if s is not None:
        shape: tuple[Any, ...] = getattr(index, "shape", ())
        if len(shape) != 1 or type(shape[0]) is not int or not 0 <= s <= shape[0]:
            return None  # (a symbolic n: the front-end's checks know how to compare)
        num = _eager.ints(s) if eager else s  # (in range of the default int: n is)
    elif num is not None and (isinstance(num, np.generic) or not _eager.array(num)):
        return None  # (a numpy bool or float: the front-end names its type)
    pad = pad_value
    if type(pad_value) in _eager.PY_SCALARS:
        pad = _eager.pad(pad_value, src)  # type: ignore[arg-type]
        if pad is None:
            return None
    elif pad_value is not None and not _eager.array(pad_value):
        return None
    return src, offsets, dim, index, check_bounds, num, pad, align_bytes


def _eager_offsets(offsets: object, eager: bool) -> object:
    """gather's offsets as its jitted front-end takes them, or None where it runs
    unjitted: Python ints and numpy integer scalars, checked to fit the default integer
    type (a device array, made once, where the call is eager), or arrays."""
    if isinstance(offsets, (list, tuple)):
        static = [_eager.static_int(o) for o in offsets]
        if all(s is not None for s in static):
            made = _eager.ints(tuple(static))  # type: ignore[arg-type]
            if made is None:
                return None  # out of range: the front-end says so
            return made if eager else tuple(static)
        if not all(s is None and not isinstance(o, (np.generic, *_eager.PY_SCALARS))
                   and _eager.array(o) for s, o in zip(static, offsets)):
            return None  # mixed, or a numpy bool: the front-end checks each
        return tuple(offsets)
    return offsets if _eager.array(offsets) else None


def _gather(src: ArrayLike, offsets: Sequence[ArrayLike] | ArrayLike, dim: int,
            index: ArrayLike, check_bounds: bool, num_indices: ArrayLike | None,
            pad_value: ArrayLike | None, align_bytes: int | None) -> jax.Array:
    fn = "gather"
    if is_extended(src):
        return _gather_keys(src, offsets, dim, index, check_bounds=check_bounds,
                            num_indices=num_indices, pad_value=pad_value,
                            align_bytes=align_bytes)
    # Each argument checked and made an operand, in the order their errors are reported.
    src = as_array(src, "src must be an array", fn)
    dim = _args.checked_dim(src, dim, fn)
    offsets_arr = _args.offsets_operand(offsets, dim, fn)
    index = _args.index_operand(index, fn)
    num = _args.num_indices_operand(num_indices, index, fn)
    pad = _args.pad_operand(pad_value, src, fn)
    check_bounds = _args.static_check_bounds(check_bounds, fn)
    itemsize = np.dtype(src.dtype).itemsize
    align_bytes = _args.checked_align_bytes(
        align_bytes, itemsize, f"src's itemsize {itemsize} ({src.dtype})", fn)
    L = _args.padded_row_len(src.shape[-1], itemsize, align_bytes)
    return _compat.bind(gather_p, src, offsets_arr, index, num, pad, dim=dim, row_len=result_dim(L),
                         check_bounds=check_bounds, nbatch=0, impl=_config.current())


def _gather_keys(src: ArrayLike, offsets: Sequence[ArrayLike] | ArrayLike, dim: int,
                 index: ArrayLike, *, check_bounds: bool, num_indices: ArrayLike | None,
                 pad_value: ArrayLike | None, align_bytes: int | None) -> jax.Array:
    """gather for a typed PRNG key array: each key is one element. Its key data
    (uint32[..., k]) is gathered with the last two dims merged, so a row is the words of
    its keys, and wrapped back. Padding counts whole keys: align_bytes must be None or a
    multiple of one key's size (k * 4 bytes); padded positions (and out-of-range rows)
    hold the key whose data is all zeros, so pad_value must be None."""
    fn = "gather"
    check_extended(src, "src", fn)
    assert is_key(src)  # check_extended lets only key arrays through
    if pad_value is not None:
        raise TypeError(f"{fn}: pad_value must be None for a key array src {_fmt(src.shape)} "
                        f"({src.dtype}): padded positions hold the all-zero key")
    impl = jax.random.key_impl(src)
    data = jax.random.key_data(src)
    k = data.shape[-1]
    key_bytes = k * data.dtype.itemsize
    _args.checked_align_bytes(align_bytes, key_bytes,
                              f"one key's size {key_bytes} bytes ({src.dtype})", fn)
    d = _args.static_int(dim)
    if src.ndim < 2 or d is None or not 0 <= d < src.ndim - 1:
        try:  # the usual dim errors, told in terms of the key array
            jax.eval_shape(lambda: gather(jnp.zeros(src.shape, np.uint8), offsets, dim, index))
        except (TypeError, ValueError, NotImplementedError) as e:
            raise type(e)(str(e).replace("(uint8)", f"({src.dtype})")) from None
    merged = data.reshape(src.shape[:-1] + (src.shape[-1] * k,))
    out = gather(merged, offsets, dim, index, check_bounds=check_bounds,
                 num_indices=num_indices, align_bytes=align_bytes)
    out = out.reshape(out.shape[:-1] + (out.shape[-1] // k, k))
    keys: jax.Array = jax.random.wrap_key_data(out, impl=impl)  # untyped on jax 0.10.2
    return keys


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
    if pad.dtype != src.dtype or not _args.is_int_dtype(index.dtype):
        raise TypeError(f"{prim}: bad dtypes src {src.dtype}, pad {pad.dtype}, "
                        f"index {index.dtype}")
    n = index.shape[-1]
    shape = bshape + (n,) + tuple(sshape[dim + 1:-1]) + (row_len,)
    avals = (src, offsets, index, num, pad)
    ss = _compat.spec_entries(src)[nbatch:]
    spec = _lowering.merge_specs(prim, _rows.batch_spec_candidates(avals, bshape) + [
        [_compat.spec_entries(index)[-1]]] + [[e] for e in ss[dim + 1:-1]] + [
        [ss[-1]] if sshape[-1] == row_len else []])
    return _compat.typed_result(prim, avals, src, spec, shape=shape, dtype=src.dtype,
                                weak_type=bool(src.weak_type))


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
    # with src's row dims (0..dim) replicated, as the kernels have them, which keeps the
    # bits (XLA's own partitioning of a row-sharded gather masks and all-reduces, which
    # turns -0.0 into +0.0 and quiets signalling NaNs).
    o = _compat.spec_entries(out_aval)
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
        take = _compat.auto_axes(take, geo.sharding)
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
    Exact: every value moves through _lowering.exact_view. A src sharded along its rows
    (dims 0..dim) is replicated along them first, as for the kernels: on CPU meshes by
    the kernels' partitioning rule (`partition_lax` below), under explicit axes by the
    sharding spelled out here; only XLA's own partitioning of auto axes elsewhere (other
    platforms, the GSPMD partitioner) masks and all-reduces, as for jnp.take."""
    avals = tuple(map(jax.typeof, (src, offsets, index, num, pad)))
    geo = _lax_geometry(src, avals, dim=dim, row_len=row_len, nbatch=nbatch,
                        params=dict(check_bounds=check_bounds, impl=impl))
    valid, row = _rows.rows(offsets, index, num, sshape=src.shape[nbatch:], dim=dim,
                            check_bounds=check_bounds)
    sv, pv = _lowering.exact_view(src, bytes=True), _lowering.exact_view(pad, bytes=True)
    g = _lax_take(geo, src, sv, row, nbatch)
    return _lowering.from_view(_lax_pads(geo, g, valid, pad, pv, row_len, nbatch), src.dtype)


# --- native lowerings -----------------------------------------------------------------

def _gather_native(ctx: _lowering.Ctx, src: ir.Value[Any], offsets: ir.Value[Any],
                   index: ir.Value[Any], num: ir.Value[Any], pad: ir.Value[Any], *, dim: int,
                   row_len: int, check_bounds: bool, nbatch: int,
                   impl: str) -> _compat.IrValues | None:
    avals: Sequence[Aval] = ctx.avals_in
    if not (_lowering.native_dtype_ok(avals[0].dtype, _names.GATHER)
            and _lowering.native_dtype_ok(avals[2].dtype)):  # int4/uint4 src or index
        return None
    # The kernel reads every size from the buffers (static or symbolic alike).
    return _lowering.ffi_call(ctx, _names.GATHER.target, (src, offsets, index, num, pad),
                              dim=dim, nbatch=nbatch, check_bounds=check_bounds)


# --- SPMD partitioning ---------------------------------------------------------------
# The kernels index src globally along dims 0..dim (offsets and index are global row
# numbers), so those dims are never sharded (a sharded src is all-gathered along them).
# Batch dims, the index dim n, the middle dims and -- when no padding column is added --
# the last dim shard freely; a size-1 (broadcast) batch dim gets a factor of its own.

def _gather_spmd_rule(avals_in: Sequence[Aval], aval_out: Aval, *, dim: int, row_len: int,
                      nbatch: int, **_: Any) -> _lowering.Factors:
    bshape = aval_out.shape[:nbatch]
    src = avals_in[0]
    sshape = src.shape[nbatch:]
    b = [f"b{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(sshape) - dim - 2)]
    shared = sshape[-1] == row_len  # no padding columns: the last dim shards too
    fixed = [f"s{i}" for i in range(dim + 1)]
    f_in = [_rows.batch_factors(0, src, bshape, b) + fixed + mid + ["l" if shared else "sl"],
            _rows.batch_factors(1, avals_in[1], bshape, b) + ["q"],
            _rows.batch_factors(2, avals_in[2], bshape, b) + ["n"],
            _rows.batch_factors(3, avals_in[3], bshape, b),
            _rows.batch_factors(4, avals_in[4], bshape, b)]
    f_out = b + ["n"] + mid + ["l" if shared else "ol"]
    return f_in, f_out, tuple(fixed + ["q"] + ([] if shared else ["sl", "ol"]))


def _gather_spmd_partition(o: Sequence[SpecEntry], mesh_shape: Mapping[str, int],
                           avals_in: Sequence[Aval], aval_out: Aval, *, dim: int, row_len: int,
                           nbatch: int, **params: Any) -> _lowering.Partition:
    """Each device gathers the rows of its index shard (and batch/column block) from a
    src replicated along dims 0..dim. num_indices counts global rows, so each shard
    gets it shifted by the shard's first row."""
    bshape = aval_out.shape[:nbatch]
    src, n = avals_in[0], avals_in[2].shape[-1]
    shared = src.shape[-1] == row_len
    o = _rows.nonunit(o, aval_out.shape)
    if not shared:
        o[-1] = None
    in_specs = [_rows.batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += [None] * (dim + 1) + o[nbatch + 1:]
    in_specs[1] += [None]
    in_specs[2] += [o[nbatch]]
    local_row_len = _lowering.local_size(row_len, o[-1], mesh_shape)
    n_axes, n_local = o[nbatch], _lowering.local_size(n, o[nbatch], mesh_shape)

    def local(bind: Callable[..., jax.Array], s: jax.Array, offsets: jax.Array,
              index: jax.Array, num: jax.Array, pad: jax.Array) -> jax.Array:
        if n_axes is not None:
            first = lax.convert_element_type(lax.axis_index(n_axes), num.dtype) * n_local
            num = lax.clamp(np.array(0, num.dtype), num - first, np.array(n_local, num.dtype))
        return bind(s, offsets, index, num, pad, dim=dim, row_len=local_row_len,
                    nbatch=nbatch, **params)
    return in_specs, o, local


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
        t_src = _compat.bind(scatter_add_p, ct, offsets, index, num, dim=dim,
                             src_shape=tuple(sshape),
                                   out_bshape=tuple(src_aval.shape[:nbatch]),
                                   check_bounds=check_bounds, nbatch=nbatch, impl=impl)
        outs[0] = _like_primal(t_src, src_aval)
    if p_undef:
        valid, _ = _rows.rows(offsets, index, num, sshape=sshape, dim=dim,
                              check_bounds=check_bounds)
        mask = _rows.pad_mask(valid, sshape[-1], row_len, tuple(sshape[dim + 1:-1]))
        masked = jnp.where(mask, ct, jnp.zeros((), ct.dtype))
        t = jnp.sum(masked, axis=tuple(range(nbatch, ct.ndim)))
        outs[4] = sum_to_shape(t, pad.aval.shape).astype(pad.aval.dtype)
    return outs


def _like_primal(t: jax.Array, aval: Aval) -> jax.Array:
    """Under explicit mesh axes a cotangent must carry its primal's sharding. The
    scatter-add leaves the rows it accumulates unsharded (every row may receive from
    any index), so a row-sharded src gets its cotangent resharded to match."""
    want = getattr(aval, "sharding", None)
    mesh = getattr(want, "mesh", None)
    if mesh is None or mesh.empty or not _compat.explicit_axes(mesh):
        return t
    if _compat.spec_entries(jax.typeof(t)) == _compat.spec_entries(aval):
        return t
    # On the primal's mesh: a bare PartitionSpec would need jax.set_mesh.
    return _compat.reshard(t, jax.sharding.NamedSharding(mesh, aval.sharding.spec))


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


# One dispatch per eager call, traced once per shapes and static values (see _eager).
_gather_jit = _eager.jitted(_gather, "gather", (2, 4, 7))  # dim, check_bounds, align_bytes


# --- registration: every rule of jax_ext_gather -------------------------------------

gather_p.def_impl(lambda *args, **params: _compat.apply_primitive(gather_p, *args, **params))
gather_p.def_abstract_eval(_gather_abstract_eval)
# partition_lax: XLA partitions a gather from a src sharded along its rows as mask and
# all-reduce, which turns -0.0 into +0.0 and quiets signalling NaNs; the kernels' rule
# (src replicated along dims 0..dim) keeps the bits on the lax path too.
_lowering.register(gather_p, _names.GATHER, _gather_lax, _gather_native,
                   spmd=_lowering.Spmd(_gather_spmd_rule, _gather_spmd_partition),
                   partition_lax=True)
_compat.ad.primitive_jvps[gather_p] = _gather_jvp
_compat.ad.primitive_transposes[gather_p] = _gather_transpose
_compat.register_batcher(gather_p, _gather_batch)

