"""Row and batch geometry shared by the gather and its transpose, the scatter-add.

Both ops see one src as rows (its dims 0..dim flattened, the rest a row), carry leading
batch dims in every operand (of the full extent, or 1 where broadcast), and compute
which rows are real (in range, before num_indices) with the same exact arithmetic as the
kernels. Nothing here binds a primitive.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from . import _compat, _compat_sharding
from ._common import fmt_shape as _fmt
from ._compat import Aval, Primal, SpecEntry


def batch_shape(avals: Sequence[Aval], nbatch: int) -> tuple[int, ...]:
    """The full batch shape: per dim, the extent of the operands that are not broadcast
    along it (those have 1). Not the largest extent: a vmap over 0 examples has batch 0,
    and a symbolic extent (jax.export) cannot be compared with another."""
    out = []
    for j in range(nbatch):
        sizes = [a.shape[j] for a in avals if not is_one(a.shape[j])]
        out.append(sizes[0] if sizes else 1)
    return tuple(out)


def is_one(d: object) -> bool:
    """d == 1 for an int; for a symbolic dim, only when it is the constant 1."""
    return isinstance(d, (int, np.integer)) and int(d) == 1


def check_batch(op: str, name: str, a: Aval, bshape: Sequence[int], nbatch: int,
                rest_rank: int) -> None:
    if a.ndim != nbatch + rest_rank or any(
            a.shape[j] not in (1, bshape[j]) for j in range(nbatch)):
        raise ValueError(f"{op}: {name} {_fmt(a.shape)} does not fit batch "
                         f"{_fmt(bshape)}")


def batch_spec_candidates(avals: Sequence[Aval],
                          bshape: Sequence[int]) -> list[list[SpecEntry]]:
    """Per batch dim, the spec entries of the operands that carry it at full size."""
    return [[_compat_sharding.spec_entries(a)[j] for a in avals if a.shape[j] == b and b != 1]
            for j, b in enumerate(bshape)]


# --- which rows are real: the lax paths, the JVP and the pad gradient -------------

def rows(offsets: jax.Array, index: jax.Array, num: jax.Array, *, sshape: Sequence[int],
         dim: int, check_bounds: bool) -> tuple[jax.Array, jax.Array]:
    """For operands with leading (broadcastable) batch dims: (valid, row), both of the
    broadcast batch shape + (n,). `row` is the flat row of one src viewed as
    (prod(sshape[:dim+1]), ...), clamped into range (0 where invalid); `valid` is False
    for pad rows. Exact 64-bit arithmetic, like the kernel's 128-bit one; `row` is then
    narrowed to the index dtype of row_dtype."""
    n = index.shape[-1]
    wide = offsets.dtype  # the default integer type: int64, or int32 without jax_enable_x64
    # Few ops: this runs at every call site of a lax path, and XLA compiles each (it does
    # not fold a constant offset's overflow checks away). Row dims before `dim`, if any:
    ok: jax.Array | bool = True
    p: jax.Array | None = None
    for k in range(dim):
        o, s = offsets[..., k], sshape[k]
        ok = ok & (((o >= 0) & (o < s)) if check_bounds else (s > 0))
        c = jnp.clip(o, 0, max(s - 1, 0))
        p = c if p is None else p * s + c
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
    r = x + y  # wraps on overflow: x and y of one sign, r of the other
    live = jnp.arange(n, dtype=wide) < num[..., None].astype(wide)
    if check_bounds:
        # 0 <= x + y < R: a positive overflow wraps r negative; a negative one (x and y
        # both negative, so out of range) can wrap it into range, hence the sign of x & y.
        inr = ((r | (x & y)) >= 0) & (r < R)
        if huge is not None:
            inr = inr & ~huge
        valid = inr & live
        rc = r  # in range wherever valid
    else:
        ovf = ((x ^ r) & (y ^ r)) < 0
        neg = (r < 0) != ovf  # an overflow flips r's sign
        over = jnp.where(ovf, r < 0, r >= R)
        if huge is not None:
            neg, over = neg & ~huge, over | huge
        rc = jnp.where(neg, 0, jnp.where(over, max(R - 1, 0), r))
        valid = live & (R > 0)
    if ok is not True:
        valid = (ok[..., None] if isinstance(ok, jax.Array) else ok) & valid
    flat = rc if p is None else p[..., None] * R + rc
    row = jnp.where(valid, flat, 0)
    return valid, row.astype(row_dtype(sshape[:dim + 1], wide))


def acc_dtype(dt: Any) -> np.dtype[Any]:
    """The dtype row sums are formed in, by gather's transpose and update_rows (as the
    kernels' DispatchAccumulate in accumulate.h; tests/test_tables.py ties the two):
    float16, bfloat16, the 8-bit and 4-bit floats in float32, rounded once; others as they
    are."""
    d: np.dtype[Any] = np.dtype(dt)
    if jnp.issubdtype(d, jnp.floating) and d.itemsize < 4:
        return np.dtype(np.float32)
    return d


def row_dtype(dims: Sequence[int], carrier: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype the lax paths hand XLA their row ids in: int32 when the flat row count
    (one past the largest id, which the scatter-add uses for pad rows) fits it, as jnp
    narrows its gather and scatter indices; else the carrier (int64 under x64; a symbolic
    count, as in jax.export, cannot be shown to fit). Not only smaller: XLA's SPMD
    partitioner aborts the process on a scatter whose int64 indices are sharded unevenly
    (it pads them with an int32 constant)."""
    total = 1
    for d in dims:
        if not isinstance(d, (int, np.integer)):
            return carrier
        total *= int(d)
    return np.dtype(np.int32) if total <= np.iinfo(np.int32).max else carrier


def held_rows(valid: jax.Array, row: jax.Array, dims: Sequence[int], local: Sequence[int],
              specs: Sequence[SpecEntry]) -> tuple[jax.Array, jax.Array]:
    """Which of the global flat rows `row` (of src's row dims `dims`, from `rows`) this
    device's shard holds, and where in the shard (its flat row), for a shard of `local`
    rows per dim, sharded per dim by `specs` (a mesh axis or axes; None: whole)."""
    wide = row.dtype  # holds every flat row (row_dtype)
    rem = row
    coords = []
    for d in reversed(dims[1:]):
        coords.append(rem % d)
        rem = rem // d
    coords.append(rem)
    held = valid
    flat: jax.Array | None = None
    for c, d, e in zip(reversed(coords), local, specs):
        if e is not None:
            c = c - lax.convert_element_type(lax.axis_index(e), wide) * d
            held = held & (c >= 0) & (c < d)
        flat = c if flat is None else flat * d + c
    assert flat is not None
    return held, flat


def pad_mask(valid: jax.Array, last: int, row_len: int, mid: Sequence[int]) -> jax.Array:
    """True at every padded position of a result: bshape + (n, *mid, row_len)."""
    col = jnp.arange(row_len) >= last
    v = valid.reshape(valid.shape + (1,) * len(mid) + (1,))
    return ~v | col


def batch_factors(k: int, a: Aval, bshape: Sequence[int], names: Sequence[str]) -> list[str]:
    return [names[j] if a.shape[j] == bshape[j] else f"z{k}_{j}" for j in range(len(bshape))]


def batch_spec(o: Sequence[SpecEntry], a: Aval, bshape: Sequence[int]) -> list[SpecEntry]:
    """The batch part of operand `a`'s spec: the result's entry `o[j]` where `a` has the
    full batch extent, None where it is broadcast (size 1)."""
    return [o[j] if a.shape[j] == bshape[j] else None for j in range(len(bshape))]


def nonunit(o: Sequence[SpecEntry], shape: Sequence[int]) -> list[SpecEntry]:
    return [None if n == 1 else e for n, e in zip(shape, o)]


def not_linear(prim: str, operands: Sequence[tuple[str, Primal]]) -> list[jax.Array]:
    """The operands (name, value) of a transpose that the primitive is not linear in, as
    arrays: ValueError naming the first one jax asks it to transpose."""
    out = []
    for name, a in operands:
        if _compat.is_undefined_primal(a):
            raise ValueError(f"{prim} is not linear in {name}")
        out.append(a)
    return out


def lead(x: jax.Array, bd: int | None) -> jax.Array:
    """Moves the new batch dim to the front, or adds a size-1 one (broadcast)."""
    if bd is None:
        return lax.expand_dims(x, (0,))
    return jnp.moveaxis(x, bd, 0)
