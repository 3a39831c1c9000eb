"""gather (Ascend asctile.gather): a gather primitive and its transpose, scatter-add.

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

``jax_ext_scatter_add(ct, offsets, index, num_indices)`` is the transpose with respect to
``src``; its extra params ``src_shape`` (one src) and ``out_bshape`` (the result's batch
dims, 1 where several batch elements accumulate into one result).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from . import _auto as _auto_mod, _compat, _config, _lowering
from ._common import (as_array, check_extended, fmt_shape as _fmt, is_extended, result_dim,
                      sum_to_shape)

Zero = _compat.Zero

# The primitives; their rules are registered at the end, one block each.
gather_p = _compat.Primitive("jax_ext_gather")
scatter_add_p = _compat.Primitive("jax_ext_scatter_add")

def _is_int_dtype(dt) -> bool:
    return jnp.issubdtype(dt, jnp.integer)


def _static_int(v):
    """A Python/numpy integer as int, None for anything else (bool is not an integer)."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    return None


def _int_scalar(v, what: str, fn: str):
    """A static int or an integer 0-d array -> (static int or None, array or None)."""
    s = _static_int(v)
    if s is not None:
        return s, None
    if isinstance(v, (bool, np.bool_, float, complex, str, bytes)):
        raise TypeError(f"{fn}: {what} must be an integer, got {type(v).__name__} {v!r}")
    try:
        a = jnp.asarray(v)
    except (TypeError, ValueError) as e:  # ValueError: None
        raise TypeError(f"{fn}: {what} must be an integer or an integer scalar array, got "
                        f"{type(v).__name__}: {e}") from None
    if not _is_int_dtype(a.dtype):
        raise TypeError(f"{fn}: {what} must have an integer dtype, got {a.dtype} with shape "
                        f"{_fmt(a.shape)}")
    if a.ndim != 0:
        raise ValueError(f"{fn}: {what} must be a scalar, got shape {_fmt(a.shape)} "
                         f"({a.dtype})")
    return None, a


def _carrier():
    """The integer type offsets and num_indices travel in: int64 with jax_enable_x64,
    int32 without (jax has no 64-bit arrays then)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def _to_carrier(a, *, saturate_to=None):
    """Integer scalar array -> the carrier type; unsigned values above its maximum
    saturate (to `saturate_to` when given)."""
    c = _carrier()
    if saturate_to is not None and not isinstance(saturate_to, (int, np.integer)):
        saturate_to = None  # a symbolic n (jax.export): the kernel clamps to [0, n] anyway
    top = np.iinfo(c).max if saturate_to is None else min(saturate_to, np.iinfo(c).max)
    if a.dtype.kind == "u" and a.dtype.itemsize >= c.itemsize:
        a = jnp.minimum(a, np.array(top, a.dtype))
    # Any other integer array converts exactly: jax makes none wider than the carrier.
    return a.astype(c)


def _maybe_le(a, b) -> bool:
    """a <= b, or True when b is a symbolic dim the comparison cannot decide (the kernel
    clamps num_indices into [0, n] at run time)."""
    try:
        return bool(a <= b)
    except Exception:  # InconclusiveDimensionOperation
        return True


def _align_bytes(align_bytes, unit: int, what: str, fn: str):
    """align_bytes as an int (or None), checked: a positive multiple of `unit` bytes (an
    element, or one key), at most 2**31."""
    if align_bytes is None:
        return None
    ab = _static_int(align_bytes)
    if ab is None or ab <= 0 or ab % unit or ab > 2 ** 31:
        raise ValueError(f"{fn}: align_bytes must be None or a positive multiple of {what} "
                         f"up to 2**31, got {align_bytes!r}")
    return ab


def _row_len(last: int, itemsize: int, align_bytes) -> int:
    if align_bytes is None:
        return last
    nbytes = last * itemsize
    return -(-nbytes // align_bytes) * align_bytes // itemsize


def gather(src: ArrayLike, offsets: Sequence[ArrayLike] | ArrayLike, dim: int,
           index: ArrayLike, *, check_bounds: bool = True,
           num_indices: ArrayLike | None = None, pad_value: ArrayLike | None = None,
           align_bytes: int | None = 32) -> jax.Array:
    """Ascend ``asctile.gather``: rows of ``src`` picked by ``index`` along ``dim``.

    For ``i < n = index.shape[0]`` with ``r = offsets[dim] + index[i]``::

        result[i] = src[offsets[0], ..., offsets[dim-1], r, :, ..., :]

    The result has shape ``(n, *src.shape[dim+1:-1], L)`` and ``src``'s dtype; ``L`` is
    ``src.shape[-1]`` rounded up so that ``L * itemsize`` is a multiple of
    ``align_bytes`` (``None``: no padding); the extra columns hold ``pad_value``.

    * ``check_bounds=True``: a row whose ``offsets[:dim]`` or ``r`` lie outside ``src``
      (negative included) holds ``pad_value``. ``check_bounds=False``: offsets and ``r``
      are clamped into ``src`` (memory outside ``src`` is never read; an out-of-range row
      holds the nearest edge row, and its gradient goes there). A ``src`` with no rows
      to read gives pad rows either way.
    * ``num_indices``: rows ``num_indices..n-1`` hold ``pad_value``. A static value must
      lie in ``[0, n]``; a traced one is clamped to ``[0, n]``.
    * ``pad_value``: ``None`` means 0; cast to ``src.dtype`` (as ``astype``).
    * ``offsets``, ``num_indices``, ``pad_value`` may each be static or traced; they are
      operands either way, so one compiled program serves every value.

    Decisions where the contract is silent:

    * ``offsets`` may also be a rank-1 integer array of length ``dim + 1``. Offsets and
      ``num_indices`` travel in jax's default integer type: int64 under
      ``jax_enable_x64``, else int32. A static offset outside that range raises
      ``ValueError``; a traced unsigned offset above its maximum saturates to it.
      ``offsets[dim] + index[i]`` is computed exactly (no wrap-around), for unsigned
      64-bit indices too.
    * ``dim`` must be a Python int (``TypeError`` otherwise, bool included); ``index``
      must be an integer array, bool is not (``TypeError``); ``align_bytes`` must be a
      positive int multiple of the itemsize (``ValueError``), sub-byte dtypes count as
      1 byte.
    * Values move bit for bit (NaN payloads, -0.0), natively and through lax.
    * A typed PRNG key array ``src`` (any implementation) is gathered key by key, as its
      key data words: ``align_bytes`` must be ``None`` or a multiple of one key's size,
      padded and out-of-range positions hold the all-zero key, and ``pad_value`` must be
      ``None``. Other extended dtypes raise ``TypeError``.
    * Gradients: ``src`` gets a scatter-add of the cotangent rows (duplicates
      accumulate; padded rows and columns contribute nothing). Every element receives
      its contributions in index order on every thread count (deterministic);
      float16/bfloat16 accumulate in float32 and round once. ``pad_value`` gets the sum
      of the cotangent over every padded position. ``offsets``, ``index`` and
      ``num_indices`` get none.
    """
    fn = "gather"
    if is_extended(src):
        return _gather_keys(src, offsets, dim, index, check_bounds=check_bounds,
                            num_indices=num_indices, pad_value=pad_value,
                            align_bytes=align_bytes)
    # Each argument checked and made an operand, in the order their errors are reported.
    src = as_array(src, "src must be an array", fn)
    dim = _check_dim(src, dim, fn)
    offsets_arr = _offsets_operand(offsets, dim, fn)
    index = _index_operand(index, fn)
    num = _num_indices_operand(num_indices, index, fn)
    pad = _pad_operand(pad_value, src, fn)
    itemsize = np.dtype(src.dtype).itemsize
    align_bytes = _align_bytes(align_bytes, itemsize, f"src's itemsize {itemsize} ({src.dtype})",
                               fn)
    L = _row_len(src.shape[-1], itemsize, align_bytes)
    return gather_p.bind(src, offsets_arr, index, num, pad, dim=dim, row_len=result_dim(L),
                         check_bounds=bool(check_bounds), nbatch=0, impl=_config.current())


# --- gather's arguments, one step each ------------------------------------------------

def _check_dim(src, dim, fn: str) -> int:
    """dim as an int: a Python int with 0 <= dim < src.ndim - 1."""
    d = _static_int(dim)
    if d is None:
        raise TypeError(f"{fn}: dim must be a Python int, got {type(dim).__name__} {dim!r}")
    if src.ndim >= 1 and d == src.ndim - 1:
        raise NotImplementedError(
            f"{fn}: dim={d} is the last dimension of src {_fmt(src.shape)} ({src.dtype}); "
            "gathering single elements along the last dimension is not implemented")
    if not 0 <= d < src.ndim - 1:
        raise ValueError(f"{fn}: dim must satisfy 0 <= dim < src.ndim - 1 = {src.ndim - 1}, got "
                         f"dim={d} for src {_fmt(src.shape)} ({src.dtype})")
    return d


def _offsets_operand(offsets, dim: int, fn: str):
    """offsets (a sequence of dim + 1 integers, static or traced, or a rank-1 integer
    array) as one vector of the carrier type."""
    if hasattr(offsets, "shape") and hasattr(offsets, "dtype") and np.ndim(offsets) == 1:
        if not _is_int_dtype(offsets.dtype):
            raise TypeError(f"{fn}: offsets must have an integer dtype, got {offsets.dtype} "
                            f"with shape {_fmt(offsets.shape)}")
        offsets = [offsets[k] for k in range(offsets.shape[0])]
    elif (isinstance(offsets, (str, bytes)) or not hasattr(offsets, "__len__")
          or getattr(offsets, "ndim", None) == 0):  # a 0-d array: __len__ but no length
        raise TypeError(f"{fn}: offsets must be a sequence of dim + 1 = {dim + 1} integers, got "
                        f"{type(offsets).__name__}")
    offsets = list(offsets)
    if len(offsets) != dim + 1:
        raise ValueError(f"{fn}: offsets must hold dim + 1 = {dim + 1} values for dim={dim}, "
                         f"got {len(offsets)}")
    offs = []
    cdt = _carrier()
    for k, o in enumerate(offsets):
        s, a = _int_scalar(o, f"offsets[{k}]", fn)
        if s is not None:
            if not np.iinfo(cdt).min <= s <= np.iinfo(cdt).max:
                raise ValueError(f"{fn}: offsets[{k}]={s} does not fit in {cdt.name}"
                                 + ("" if cdt == np.int64 else " (enable jax_enable_x64 for "
                                    "64-bit offsets)"))
            offs.append(jnp.asarray(s, cdt))
        else:
            offs.append(_to_carrier(a))
    return jnp.stack(offs)


def _index_operand(index, fn: str):
    """index as a rank-1 integer array, in its own dtype."""
    index = as_array(index, "index must be an integer array", fn)
    if index.ndim != 1:
        raise ValueError(f"{fn}: index must have rank 1, got shape {_fmt(index.shape)} "
                         f"({index.dtype})")
    if not _is_int_dtype(index.dtype):
        raise TypeError(f"{fn}: index must have an integer dtype, got {index.dtype} with shape "
                        f"{_fmt(index.shape)}")
    return index


def _num_indices_operand(num_indices, index, fn: str):
    """num_indices (None: all n rows) as a carrier scalar; a static one must lie in
    [0, n], a traced one saturates."""
    n = index.shape[0]
    cdt = _carrier()
    if num_indices is None:
        return jnp.asarray(n, cdt)
    s, a = _int_scalar(num_indices, "num_indices", fn)
    if s is None:
        return _to_carrier(a, saturate_to=n)
    if not (0 <= s and _maybe_le(s, n)):
        raise ValueError(f"{fn}: num_indices={s} must lie in [0, n] = [0, {n}] for index "
                         f"{_fmt(index.shape)}")
    return jnp.asarray(s, cdt)


def _pad_operand(pad_value, src, fn: str):
    """pad_value (None: 0) as a scalar of src's dtype; a Python scalar must fit it."""
    if pad_value is None:
        return jnp.zeros((), src.dtype)
    if isinstance(pad_value, (str, bytes)):
        raise TypeError(f"{fn}: pad_value must be a scalar, got {type(pad_value).__name__}")
    try:
        p = jnp.asarray(pad_value)
    except OverflowError as e:
        raise ValueError(f"{fn}: pad_value={pad_value!r} does not fit in src's dtype "
                         f"{src.dtype}: {e}") from None
    except (TypeError, ValueError) as e:  # ValueError: a ragged list
        raise TypeError(f"{fn}: pad_value must be a scalar, got "
                        f"{type(pad_value).__name__}: {e}") from None
    if p.ndim != 0:
        raise ValueError(f"{fn}: pad_value must be a scalar, got shape {_fmt(p.shape)} "
                         f"({p.dtype})")
    if not (isinstance(pad_value, (int, float, complex, bool))
            and not isinstance(pad_value, np.generic)):
        return p.astype(src.dtype)
    try:
        return jnp.asarray(pad_value, dtype=src.dtype)
    except (OverflowError, ValueError) as e:  # ValueError: NaN into an integer
        raise ValueError(f"{fn}: pad_value={pad_value!r} does not fit in src's dtype "
                         f"{src.dtype}: {e}") from None
    except TypeError as e:  # a complex into a real dtype
        raise TypeError(f"{fn}: pad_value={pad_value!r} cannot be cast to src's dtype "
                        f"{src.dtype}: {e}") from None


def _gather_keys(src, offsets, dim, index, *, check_bounds, num_indices, pad_value,
                 align_bytes):
    """gather for a typed PRNG key array: each key is one element. Its key data
    (uint32[..., k]) is gathered with the last two dims merged, so a row is the words of
    its keys, and wrapped back. Padding counts whole keys: align_bytes must be None or a
    multiple of one key's size (k * 4 bytes); padded positions (and out-of-range rows)
    hold the key whose data is all zeros, so pad_value must be None."""
    fn = "gather"
    check_extended(src, "src", fn)
    if pad_value is not None:
        raise TypeError(f"{fn}: pad_value must be None for a key array src {_fmt(src.shape)} "
                        f"({src.dtype}): padded positions hold the all-zero key")
    impl = jax.random.key_impl(src)
    data = jax.random.key_data(src)
    k = data.shape[-1]
    key_bytes = k * data.dtype.itemsize
    _align_bytes(align_bytes, key_bytes, f"one key's size {key_bytes} bytes ({src.dtype})", fn)
    if src.ndim < 2 or _static_int(dim) is None or not 0 <= _static_int(dim) < src.ndim - 1:
        try:  # the usual dim errors, told in terms of the key array
            jax.eval_shape(lambda: gather(jnp.zeros(src.shape, np.uint8), offsets, dim, index))
        except (TypeError, ValueError, NotImplementedError) as e:
            raise type(e)(str(e).replace("(uint8)", f"({src.dtype})")) from None
    merged = data.reshape(src.shape[:-1] + (src.shape[-1] * k,))
    out = gather(merged, offsets, dim, index, check_bounds=check_bounds,
                 num_indices=num_indices, align_bytes=align_bytes)
    out = out.reshape(out.shape[:-1] + (out.shape[-1] // k, k))
    return jax.random.wrap_key_data(out, impl=impl)


# --- shapes -------------------------------------------------------------------------

def _batch_shape(avals, nbatch):
    """The full batch shape: per dim, the extent of the operands that are not broadcast
    along it (those have 1). Not the largest extent: a vmap over 0 examples has batch 0,
    and a symbolic extent (jax.export) cannot be compared with another."""
    out = []
    for j in range(nbatch):
        sizes = [a.shape[j] for a in avals if not _is_one(a.shape[j])]
        out.append(sizes[0] if sizes else 1)
    return tuple(out)


def _is_one(d) -> bool:
    """d == 1 for an int; for a symbolic dim, only when it is the constant 1."""
    return isinstance(d, (int, np.integer)) and int(d) == 1


def _check_batch(name, a, bshape, nbatch, rest_rank):
    if a.ndim != nbatch + rest_rank or any(
            a.shape[j] not in (1, bshape[j]) for j in range(nbatch)):
        raise ValueError(f"jax_ext_gather: {name} {_fmt(a.shape)} does not fit batch "
                         f"{_fmt(bshape)}")


def _batch_spec_candidates(avals, bshape):
    """Per batch dim, the spec entries of the operands that carry it at full size."""
    return [[_compat.spec_entries(a)[j] for a in avals if a.shape[j] == b and b != 1]
            for j, b in enumerate(bshape)]


def _gather_abstract_eval(src, offsets, index, num, pad, *, dim, row_len, check_bounds, nbatch,
                          impl):
    bshape = _batch_shape((src, offsets, index, num, pad), nbatch)
    sshape = src.shape[nbatch:]
    for name, a, r in (("src", src, len(sshape)), ("offsets", offsets, 1), ("index", index, 1),
                       ("num_indices", num, 0), ("pad_value", pad, 0)):
        _check_batch(name, a, bshape, nbatch, r)
    if (offsets.shape[-1] != dim + 1 or offsets.dtype not in (np.int32, np.int64)
            or num.dtype not in (np.int32, np.int64)):
        raise TypeError("jax_ext_gather: offsets/num_indices must be int32/int64 of the right "
                        "length")
    if pad.dtype != src.dtype or not _is_int_dtype(index.dtype):
        raise TypeError(f"jax_ext_gather: bad dtypes src {src.dtype}, pad {pad.dtype}, "
                        f"index {index.dtype}")
    n = index.shape[-1]
    shape = bshape + (n,) + tuple(sshape[dim + 1:-1]) + (row_len,)
    avals = (src, offsets, index, num, pad)
    ss = _compat.spec_entries(src)[nbatch:]
    spec = _lowering.merge_specs("jax_ext_gather", _batch_spec_candidates(avals, bshape) + [
        [_compat.spec_entries(index)[-1]]] + [[e] for e in ss[dim + 1:-1]] + [
        [ss[-1]] if sshape[-1] == row_len else []])
    return _compat.typed_result(avals, src, spec, shape=shape, dtype=src.dtype,
                                weak_type=bool(src.weak_type))


def _scatter_abstract_eval(ct, offsets, index, num, *, dim, src_shape, out_bshape,
                           check_bounds, nbatch, impl):
    bshape = _batch_shape((ct, offsets, index, num), nbatch)
    if len(out_bshape) != nbatch or any(o not in (1, b) for o, b in zip(out_bshape, bshape)):
        raise ValueError(f"jax_ext_scatter_add: out_bshape {out_bshape} vs batch {bshape}")
    avals = (ct, offsets, index, num)
    cs = _compat.spec_entries(ct)[nbatch:]
    bspec = _batch_spec_candidates(avals, bshape)
    spec = _lowering.merge_specs("jax_ext_scatter_add", [
        c if o == b else [] for c, o, b in zip(bspec, out_bshape, bshape)] + [
        []] * (dim + 1) + [[e] for e in cs[1:-1]] + [
        [cs[-1]] if ct.shape[-1] == src_shape[-1] else []])
    return _compat.typed_result(avals, ct, spec, shape=tuple(out_bshape) + tuple(src_shape),
                                dtype=ct.dtype, weak_type=bool(ct.weak_type))


# --- which rows are real: shared by the lax paths, the JVP and the pad gradient -----

def _rows(offsets, index, num, *, sshape, dim, check_bounds):
    """For operands with leading (broadcastable) batch dims: (valid, row), both of the
    broadcast batch shape + (n,). `row` is the flat row of one src viewed as
    (prod(sshape[:dim+1]), ...), clamped into range (0 where invalid); `valid` is False
    for pad rows. Exact 64-bit arithmetic, like the kernel's 128-bit one."""
    n = index.shape[-1]
    wide = offsets.dtype  # the carrier: int64, or int32 without jax_enable_x64
    ok = jnp.ones(offsets.shape[:-1], bool)
    p = jnp.zeros(offsets.shape[:-1], wide)
    for k in range(dim):
        o, s = offsets[..., k], sshape[k]
        inr = (o >= 0) & (o < s)
        ok = ok & (inr if check_bounds else (s > 0))
        p = p * s + jnp.clip(o, 0, max(s - 1, 0))
    R = sshape[dim]
    odim = offsets[..., dim][..., None]
    if index.dtype.kind == "u" and index.dtype.itemsize == np.dtype(wide).itemsize:
        # unsigned values at or above 2**(bits-1) do not fit: shift both terms by it.
        mn = np.array(np.iinfo(wide).min, wide)
        big = index >= np.array(np.iinfo(wide).max, index.dtype) + np.array(1, index.dtype)
        x = jnp.where(big, odim ^ mn, odim)
        y = jnp.where(big, lax.bitcast_convert_type(index, wide) ^ mn, index.astype(wide))
        huge = big & (odim >= 0)  # r >= 2**(bits-1): beyond every row
    else:
        x, y, huge = odim, index.astype(wide), None
    r = x + y  # wraps on overflow; the overflow has the sign of x (and y)
    ovf = ((x >= 0) == (y >= 0)) & ((r >= 0) != (x >= 0))
    neg = jnp.where(ovf, x < 0, r < 0)
    over = jnp.where(ovf, x >= 0, r >= R)
    if huge is not None:
        neg, over = neg & ~huge, over | huge
    inr = ~neg & ~over
    rc = jnp.where(neg, 0, jnp.where(over, max(R - 1, 0), r))
    live = jnp.arange(n, dtype=wide) < num[..., None].astype(wide)
    if check_bounds:
        valid = ok[..., None] & inr & live
    else:
        valid = ok[..., None] & live & (R > 0)
    row = jnp.where(valid, p[..., None] * R + rc, 0)
    return valid, row


def _batch_lin(ashape, bshape):
    """Linear index over an operand's batch dims (size 1: broadcast) for every point of
    the full batch shape: an integer array of bshape."""
    st = _lowering.dense_strides(ashape)
    c = _carrier()
    lin = jnp.zeros(bshape, c)
    for j, a in enumerate(ashape):
        if a != 1:
            lin = lin + lax.broadcasted_iota(c, bshape, j) * st[j]
    return lin


def _pad_mask(valid, last, row_len, mid):
    """True at every padded position of a result: bshape + (n, *mid, row_len)."""
    col = jnp.arange(row_len) >= last
    v = valid.reshape(valid.shape + (1,) * len(mid) + (1,))
    return ~v | col


# --- lax implementations --------------------------------------------------------------

def _take_sharding(*args, **params):
    """Under explicit mesh axes jax's gather needs its result's sharding spelled out: the
    one abstract evaluation gives (the last dim's entry holds for the unpadded rows too)."""
    sharding = _gather_abstract_eval(*map(jax.typeof, args), **params).sharding
    mesh = getattr(sharding, "mesh", None)
    return None if mesh is None or mesh.empty or not _compat.explicit_axes(mesh) else sharding


def _gather_lax(src, offsets, index, num, pad, *, dim, row_len, check_bounds, nbatch, impl):
    """take (clip) of the flattened rows, pad rows selected in, pad columns added with
    lax.pad: ops XLA fuses with their producers and consumers, as for jnp.take. Exact:
    XLA's gather moves every dtype as is; select and pad see _lowering.exact_view."""
    bshape = _batch_shape((src, offsets, index, num, pad), nbatch)
    sb, sshape = src.shape[:nbatch], src.shape[nbatch:]
    n = index.shape[-1]
    mid = tuple(sshape[dim + 1:-1])
    last = sshape[-1]
    inner, rows = math.prod(mid), math.prod(sshape[:dim + 1])
    valid, row = _rows(offsets, index, num, sshape=sshape, dim=dim, check_bounds=check_bounds)
    sv, pv = _lowering.exact_view(src), _lowering.exact_view(pad)
    row_shape = mid + (last,)
    shape = bshape + (n,) + row_shape
    ones = (1,) * len(row_shape)
    total_src_rows = math.prod(sb) * rows
    if _lowering.definitely_zero(total_src_rows * inner * last):
        g = jnp.zeros(shape, sv.dtype)  # nothing to read: every row is a pad row
    else:
        flat = sv.reshape((total_src_rows,) + row_shape)
        ids = _batch_lin(sb, bshape)[..., None] * rows + row
        g = flat.at[ids].get(mode="clip", out_sharding=_take_sharding(
            src, offsets, index, num, pad, dim=dim, row_len=row_len, check_bounds=check_bounds,
            nbatch=nbatch, impl=impl))
    v = jnp.broadcast_to(valid.reshape(valid.shape + ones), shape)
    pb = pv.reshape(pad.shape + (1,) + ones)
    g = lax.select_n(v, jnp.broadcast_to(pb, shape), g)
    if row_len != last:
        extra = row_len - last
        if pad.size == 1:
            g = lax.pad(g, pv.reshape(()), [(0, 0, 0)] * (g.ndim - 1) + [(0, extra, 0)])
        else:  # a batched pad value: one column block per batch element
            g = jnp.concatenate([g, jnp.broadcast_to(pb, shape[:-1] + (extra,))], axis=-1)
    return _lowering.from_view(g, src.dtype)


def _acc_dtype(dt):
    dt = np.dtype(dt)
    if jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 4:
        return np.dtype(np.float32)  # float16/bfloat16/float8 accumulate in float32
    return dt


def _scatter_lax(ct, offsets, index, num, *, dim, src_shape, out_bshape, check_bounds, nbatch,
                 impl):
    bshape = _batch_shape((ct, offsets, index, num), nbatch)
    n = index.shape[-1]
    mid = tuple(src_shape[dim + 1:-1])
    last = src_shape[-1]
    rows = math.prod(src_shape[:dim + 1])
    total = math.prod(out_bshape) * rows
    acc = _acc_dtype(ct.dtype)
    valid, row = _rows(offsets, index, num, sshape=src_shape, dim=dim, check_bounds=check_bounds)
    valid = jnp.broadcast_to(valid, bshape + (n,))
    ids = _batch_lin(tuple(out_bshape), bshape)[..., None] * rows + row
    ids = jnp.where(valid, ids, total).reshape(-1)  # out of range: dropped
    # Rows keep their own shape (no merged middle dim): a reshape XLA cannot make a bitcast
    # would copy the whole cotangent first.
    row_shape = mid + (last,)
    upd = ct[..., :last].reshape((-1,) + row_shape).astype(acc)
    out = jnp.zeros((total,) + row_shape, acc).at[ids].add(upd, mode="drop")
    return out.astype(ct.dtype).reshape(tuple(out_bshape) + tuple(src_shape))


# --- native lowerings -----------------------------------------------------------------

def _bstrides(ashape, bshape, slice_size):
    """Element strides of an operand over the batch dims (0 where broadcast); at least
    one batch dim is always passed, so an unbatched call has batch (1,), stride 0."""
    if not bshape:
        return [0]
    st = _lowering.dense_strides(ashape)
    return [st[j] * slice_size if ashape[j] != 1 else 0 for j in range(len(bshape))]


def _gather_native(ctx, src, offsets, index, num, pad, *, dim, row_len, check_bounds, nbatch,
                   impl):
    avals = ctx.avals_in
    if not (_lowering.native_dtype_ok(avals[0].dtype)
            and _lowering.native_dtype_ok(avals[2].dtype)):  # int4/uint4 src or index
        return None
    if not _lowering.static_shapes(ctx):
        # Symbolic dims (jax.export): v2 reads the sizes from the buffers at run time.
        return _lowering.ffi_call(ctx, "jax_ext_gather_v2", (src, offsets, index, num, pad),
                                  dim=dim, nbatch=nbatch, check_bounds=check_bounds)
    bshape = _batch_shape(avals, nbatch)
    sshape = avals[0].shape[nbatch:]
    slices = (int(np.prod(sshape, dtype=np.int64)), dim + 1, avals[2].shape[-1], 1, 1)
    st = [_bstrides(a.shape[:nbatch], bshape, s) for a, s in zip(avals, slices)]
    return _lowering.ffi_call(
        ctx, "jax_ext_gather_v1", (src, offsets, index, num, pad), src_shape=list(sshape),
        dim=dim, row_len=row_len, n=avals[2].shape[-1], check_bounds=check_bounds,
        batch_shape=list(bshape) or [1], src_bstrides=st[0], offsets_bstrides=st[1],
        index_bstrides=st[2], num_bstrides=st[3], pad_bstrides=st[4])


_NATIVE_SCATTER = {np.dtype(t) for t in (
    np.float32, np.float64, np.complex64, np.complex128, np.float16, jnp.bfloat16,
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)}


def _scatter_native(ctx, ct, offsets, index, num, *, dim, src_shape, out_bshape, check_bounds,
                    nbatch, impl):
    avals = ctx.avals_in
    if (np.dtype(avals[0].dtype) not in _NATIVE_SCATTER
            or not _lowering.native_dtype_ok(avals[2].dtype)):  # an int4/uint4 index
        return None
    if not _lowering.static_shapes(ctx):
        return _lowering.ffi_call(ctx, "jax_ext_scatter_add_v2", (ct, offsets, index, num),
                                  dim=dim, nbatch=nbatch, check_bounds=check_bounds)
    bshape = _batch_shape(avals, nbatch)
    size = int(np.prod(src_shape, dtype=np.int64))
    n = avals[2].shape[-1]
    return _lowering.ffi_call(
        ctx, "jax_ext_scatter_add_v1", (ct, offsets, index, num), src_shape=list(src_shape),
        dim=dim, row_len=avals[0].shape[-1], n=n, check_bounds=check_bounds,
        batch_shape=list(bshape) or [1],
        out_bstrides=_bstrides(tuple(out_bshape), bshape, size),
        offsets_bstrides=_bstrides(avals[1].shape[:nbatch], bshape, dim + 1),
        index_bstrides=_bstrides(avals[2].shape[:nbatch], bshape, n),
        num_bstrides=_bstrides(avals[3].shape[:nbatch], bshape, 1))


# --- SPMD partitioning ---------------------------------------------------------------
# The kernels index src globally along dims 0..dim (offsets and index are global row
# numbers), so those dims are never sharded (a sharded src is all-gathered along them).
# Batch dims, the index dim n, the middle dims and -- when no padding column is added --
# the last dim shard freely; a size-1 (broadcast) batch dim gets a factor of its own.

def _batch_factors(k, a, bshape, names):
    return [names[j] if a.shape[j] == bshape[j] else f"z{k}_{j}" for j in range(len(bshape))]


def _batch_spec(o, a, bshape):
    """The batch part of operand `a`'s spec: the result's entry `o[j]` where `a` has the
    full batch extent, None where it is broadcast (size 1)."""
    return [o[j] if a.shape[j] == bshape[j] else None for j in range(len(bshape))]


def _nonunit(o, shape):
    return [None if n == 1 else e for n, e in zip(shape, o)]


def _gather_spmd_rule(avals_in, aval_out, *, dim, row_len, nbatch, **_):
    bshape = aval_out.shape[:nbatch]
    src = avals_in[0]
    sshape = src.shape[nbatch:]
    b = [f"b{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(sshape) - dim - 2)]
    shared = sshape[-1] == row_len  # no padding columns: the last dim shards too
    fixed = [f"s{i}" for i in range(dim + 1)]
    f_in = [_batch_factors(0, src, bshape, b) + fixed + mid + ["l" if shared else "sl"],
            _batch_factors(1, avals_in[1], bshape, b) + ["q"],
            _batch_factors(2, avals_in[2], bshape, b) + ["n"],
            _batch_factors(3, avals_in[3], bshape, b),
            _batch_factors(4, avals_in[4], bshape, b)]
    f_out = b + ["n"] + mid + ["l" if shared else "ol"]
    return f_in, f_out, tuple(fixed + ["q"] + ([] if shared else ["sl", "ol"]))


def _gather_spmd_partition(o, mesh_shape, avals_in, aval_out, *, dim, row_len, nbatch,
                           **params):
    """Each device gathers the rows of its index shard (and batch/column block) from a
    src replicated along dims 0..dim. num_indices counts global rows, so each shard
    gets it shifted by the shard's first row."""
    bshape = aval_out.shape[:nbatch]
    src, n = avals_in[0], avals_in[2].shape[-1]
    shared = src.shape[-1] == row_len
    o = _nonunit(o, aval_out.shape)
    if not shared:
        o[-1] = None
    in_specs = [_batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += [None] * (dim + 1) + o[nbatch + 1:]
    in_specs[1] += [None]
    in_specs[2] += [o[nbatch]]
    local_row_len = _lowering.local_size(row_len, o[-1], mesh_shape)
    n_axes, n_local = o[nbatch], _lowering.local_size(n, o[nbatch], mesh_shape)

    def local(bind, s, offsets, index, num, pad):
        if n_axes is not None:
            first = lax.convert_element_type(lax.axis_index(n_axes), num.dtype) * n_local
            num = lax.clamp(np.array(0, num.dtype), num - first, np.array(n_local, num.dtype))
        return bind(s, offsets, index, num, pad, dim=dim, row_len=local_row_len,
                    nbatch=nbatch, **params)
    return in_specs, o, local


def _scatter_spmd_rule(avals_in, aval_out, *, dim, src_shape, out_bshape, nbatch, **_):
    """Batch dims the result keeps shard; dims that accumulate (n, and batch dims the
    result has as 1) are replicated, so every element sums its contributions in index
    order as on one device (exact, deterministic) at the cost of gathering ct."""
    bshape = _batch_shape(avals_in, nbatch)
    full = [out_bshape[j] == bshape[j] for j in range(nbatch)]
    b = [f"b{j}" if full[j] else f"a{j}" for j in range(nbatch)]
    mid = [f"m{i}" for i in range(len(src_shape) - dim - 2)]
    shared = avals_in[0].shape[-1] == src_shape[-1]
    fixed = [f"s{i}" for i in range(dim + 1)]
    f_in = [_batch_factors(0, avals_in[0], bshape, b) + ["n"] + mid + ["l" if shared else "cl"],
            _batch_factors(1, avals_in[1], bshape, b) + ["q"],
            _batch_factors(2, avals_in[2], bshape, b) + ["n"],
            _batch_factors(3, avals_in[3], bshape, b)]
    f_out = [b[j] if full[j] else f"ob{j}" for j in range(nbatch)] + fixed + mid + \
        ["l" if shared else "sl"]
    rep = fixed + ["n", "q"] + [b[j] for j in range(nbatch) if not full[j]]
    return f_in, f_out, tuple(rep + ([] if shared else ["cl", "sl"]))


def _scatter_spmd_partition(o, mesh_shape, avals_in, aval_out, *, dim, src_shape, out_bshape,
                            nbatch, **params):
    bshape = _batch_shape(avals_in, nbatch)
    ct = avals_in[0]
    shared = ct.shape[-1] == src_shape[-1]
    o = _nonunit(o, aval_out.shape)
    for j in range(nbatch):
        if out_bshape[j] != bshape[j]:
            o[j] = None
    o[nbatch:nbatch + dim + 1] = [None] * (dim + 1)
    if not shared:
        o[-1] = None
    in_specs = [_batch_spec(o, a, bshape) for a in avals_in]
    in_specs[0] += [None] + o[nbatch + dim + 1:]
    in_specs[1] += [None]
    in_specs[2] += [None]
    loc = [_lowering.local_size(s, e, mesh_shape) for s, e in zip(aval_out.shape, o)]
    local_src, local_b = tuple(loc[nbatch:]), tuple(loc[:nbatch])

    def local(bind, *args):
        return bind(*args, dim=dim, src_shape=local_src, out_bshape=local_b, nbatch=nbatch,
                    **params)
    return in_specs, o, local


# implementation "auto": the cost model of _auto.py (constants in _cost_table.py).
def _gather_auto(ctx, *args, nbatch, **params):
    return _auto_mod.choose_gather(
        gather_p, ctx, ("src", "offsets", "index", "num_indices", "pad_value"), args, nbatch)


def _scatter_auto(ctx, *args, nbatch, **params):
    return _auto_mod.choose_scatter_add(scatter_add_p, ctx, nbatch)


# --- autodiff ---------------------------------------------------------------------------

def _gather_jvp(primals, tangents, *, dim, row_len, check_bounds, nbatch, impl):
    src, offsets, index, num, pad = primals
    ts, tp = (_compat.instantiate_tangent(tangents[k], primals[k]) for k in (0, 4))
    params = dict(dim=dim, row_len=row_len, check_bounds=check_bounds, nbatch=nbatch, impl=impl)
    out = gather_p.bind(src, offsets, index, num, pad, **params)
    if type(ts) is Zero and type(tp) is Zero:
        return out, Zero(jax.typeof(out).to_tangent_aval())
    if type(ts) is Zero:
        # Only pad_value moves: its tangent at every padded position, 0 elsewhere.
        sshape = src.shape[nbatch:]
        valid, _ = _rows(offsets, index, num, sshape=sshape, dim=dim, check_bounds=check_bounds)
        mid = tuple(sshape[dim + 1:-1])
        mask = _pad_mask(valid, sshape[-1], row_len, mid)
        tpb = tp.reshape(tp.shape + (1,) * (1 + len(mid) + 1))
        t = jnp.where(mask, tpb, jnp.zeros((), tp.dtype))
        return out, jnp.broadcast_to(t, out.shape).astype(out.dtype)
    if type(tp) is Zero:
        tp = jnp.zeros((1,) * nbatch, ts.dtype)
    return out, gather_p.bind(ts, offsets, index, num, tp, **params)


def _gather_transpose(ct, src, offsets, index, num, pad, *, dim, row_len, check_bounds, nbatch,
                      impl):
    for name, a in (("offsets", offsets), ("index", index), ("num_indices", num)):
        if _compat.is_undefined_primal(a):
            raise ValueError(f"jax_ext_gather is not linear in {name}")
    s_undef, p_undef = _compat.is_undefined_primal(src), _compat.is_undefined_primal(pad)
    src_aval = src.aval if s_undef else jax.typeof(src)
    sshape = src_aval.shape[nbatch:]
    outs = [None, None, None, None, None]
    if type(ct) is Zero:
        if s_undef:
            outs[0] = Zero(src.aval)
        if p_undef:
            outs[4] = Zero(pad.aval)
        return outs
    if s_undef:
        outs[0] = scatter_add_p.bind(ct, offsets, index, num, dim=dim, src_shape=tuple(sshape),
                                     out_bshape=tuple(src_aval.shape[:nbatch]),
                                     check_bounds=check_bounds, nbatch=nbatch, impl=impl)
    if p_undef:
        valid, _ = _rows(offsets, index, num, sshape=sshape, dim=dim, check_bounds=check_bounds)
        mask = _pad_mask(valid, sshape[-1], row_len, tuple(sshape[dim + 1:-1]))
        masked = jnp.where(mask, ct, jnp.zeros((), ct.dtype))
        t = jnp.sum(masked, axis=tuple(range(nbatch, ct.ndim)))
        outs[4] = sum_to_shape(t, pad.aval.shape).astype(pad.aval.dtype)
    return outs


def _scatter_jvp(primals, tangents, **params):
    ct, offsets, index, num = primals
    out = scatter_add_p.bind(ct, offsets, index, num, **params)
    t = _compat.instantiate_tangent(tangents[0], ct)
    if type(t) is Zero:
        return out, Zero(jax.typeof(out).to_tangent_aval())
    return out, scatter_add_p.bind(t, offsets, index, num, **params)


def _scatter_transpose(cts, ct, offsets, index, num, *, dim, src_shape, out_bshape,
                       check_bounds, nbatch, impl):
    for name, a in (("offsets", offsets), ("index", index), ("num_indices", num)):
        if _compat.is_undefined_primal(a):
            raise ValueError(f"jax_ext_scatter_add is not linear in {name}")
    if not _compat.is_undefined_primal(ct):
        return [None] * 4
    if type(cts) is Zero:
        return [Zero(ct.aval), None, None, None]
    row_len = ct.aval.shape[-1]
    pad = jnp.zeros((1,) * nbatch, cts.dtype)
    g = gather_p.bind(cts, offsets, index, num, pad, dim=dim, row_len=row_len,
                      check_bounds=check_bounds, nbatch=nbatch, impl=impl)
    if g.shape != ct.aval.shape:
        # ct alone carried a batch dim (a vmap over pad_value only, say) that the scatter
        # summed over: every batch element gets the same rows.
        g = jnp.broadcast_to(g, ct.aval.shape)
    return [g, None, None, None]


# --- batching ---------------------------------------------------------------------------

def _lead(x, bd):
    """Moves the new batch dim to the front, or adds a size-1 one (broadcast)."""
    if bd is None:
        return lax.expand_dims(x, (0,))
    return jnp.moveaxis(x, bd, 0)


def _gather_batch(axis_size, args, bdims, *, dim, row_len, check_bounds, nbatch, impl):
    args = [_lead(a, bd) for a, bd in zip(args, bdims)]
    # Some operand is batched (register_batcher binds directly otherwise), so the
    # result's new dim has its extent, axis_size.
    out = gather_p.bind(*args, dim=dim, row_len=row_len, check_bounds=check_bounds,
                        nbatch=nbatch + 1, impl=impl)
    return out, 0


def _scatter_batch(axis_size, args, bdims, *, dim, src_shape, out_bshape, check_bounds, nbatch,
                   impl):
    ct, offsets, index, num = [_lead(a, bd) for a, bd in zip(args, bdims)]
    if bdims[0] is None:
        # ct always carries the full batch shape (its transpose, gather, returns it).
        ct = jnp.broadcast_to(ct, (axis_size,) + ct.shape[1:])
    out = scatter_add_p.bind(ct, offsets, index, num, dim=dim, src_shape=src_shape,
                             out_bshape=(axis_size,) + tuple(out_bshape),
                             check_bounds=check_bounds, nbatch=nbatch + 1, impl=impl)
    return out, 0


# --- registration: every rule of each primitive -------------------------------------

gather_p.def_impl(lambda *args, **params: _compat.apply_primitive(gather_p, *args, **params))
gather_p.def_abstract_eval(_gather_abstract_eval)
_lowering.register(gather_p, "gather", _gather_lax, _gather_native, _gather_auto,
                   spmd=_lowering.Spmd(_gather_spmd_rule, _gather_spmd_partition))
_compat.ad.primitive_jvps[gather_p] = _gather_jvp
_compat.ad.primitive_transposes[gather_p] = _gather_transpose
_compat.register_batcher(gather_p, _gather_batch)

scatter_add_p.def_impl(
    lambda *args, **params: _compat.apply_primitive(scatter_add_p, *args, **params))
scatter_add_p.def_abstract_eval(_scatter_abstract_eval)
_lowering.register(scatter_add_p, "scatter_add", _scatter_lax, _scatter_native, _scatter_auto,
                   spmd=_lowering.Spmd(_scatter_spmd_rule, _scatter_spmd_partition))
_compat.ad.primitive_jvps[scatter_add_p] = _scatter_jvp
_compat.ad.primitive_transposes[scatter_add_p] = _scatter_transpose
_compat.register_batcher(scatter_add_p, _scatter_batch)
