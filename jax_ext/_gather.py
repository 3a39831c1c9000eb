"""gather (Ascend asctile.gather): the front-end over the gather primitive, whose
rules are in ``_gather_rules.py``.

The front-end checks every argument (its conversions are in ``_gather_args.py``, one
function per argument) and binds ``jax_ext_gather(src, offsets, index, num_indices,
pad_value)``, whose operands and static params ``_gather_rules.py`` describes. PRNG key
arrays move as their key data.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _compat, _config, _eager, _gather_args as _args
# the primitive the front-end binds, whose rules _gather_rules registers
from . import _gather_rules  # noqa: F401
from ._primitives import gather_p
from ._common import (as_array, check_extended, fmt_shape as _fmt, is_extended, is_key,
                      result_dim)


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
    floats narrower than float32 accumulate in float32 and round once). ``pad_value`` gets
    the sum of the cotangent over every padded position (summed so too); ``offsets``,
    ``index`` and ``num_indices`` get none. ``vmap`` over any operand is one call with a
    batch dimension. The
    documentation's "Sharp bits" page lists the decisions taken where the contract is
    silent.

    Args:
        src: the array to gather from, of rank >= 2 and any JAX dtype but the 6-bit
            floats (``TypeError``: XLA cannot gather them on CPU), or a typed PRNG key
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
            needed (``index`` of a float or bool dtype, ``dim`` not an int, a 6-bit float
            ``src``, a ``pad_value`` that would promote ``src.dtype``, a traced
            ``check_bounds``, an operand that is not an array or a scalar).
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
    _args.check_src_dtype(src, fn)
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


# One dispatch per eager call, traced once per shapes and static values (see _eager).
_gather_jit = _eager.jitted(_gather, "gather", (2, 4, 7))  # dim, check_bounds, align_bytes
