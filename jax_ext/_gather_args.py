"""gather's arguments, each checked and made an operand of the gather primitive.

One function per argument, in the order gather reports their errors; each raises the
TypeError or ValueError that names the argument, its shape and its dtype. ``offsets`` and
``num_indices`` become arrays of jax's default integer type (int64 under
``jax_enable_x64``, else int32), ``pad_value`` a scalar of ``src``'s dtype, ``index``
keeps its own integer dtype.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike

from . import _eager, _names
from ._common import (as_array, describe, fmt_shape as _fmt, is_arraylike, is_py_scalar,
                      scalar_as)


def is_int_dtype(dt: DTypeLike) -> bool:
    return jnp.issubdtype(dt, jnp.integer)


def static_int(v: object) -> int | None:
    """A Python/numpy integer as int, None for anything else (bool is not an integer)."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    return None


def int_scalar(v: object, what: str, fn: str) -> int | jax.Array:
    """A static int, or an integer 0-d array."""
    s = static_int(v)
    if s is not None:
        return s
    if isinstance(v, (bool, np.bool_, float, complex)):
        raise TypeError(f"{fn}: {what} must be an integer, got {type(v).__name__} {v!r}")
    if not is_arraylike(v):
        raise TypeError(f"{fn}: {what} must be an integer or an integer scalar array, got "
                        f"{describe(v)}")
    try:
        a = jnp.asarray(v)
    except (TypeError, ValueError) as e:  # ValueError: None
        raise TypeError(f"{fn}: {what} must be an integer or an integer scalar array, got "
                        f"{type(v).__name__}: {e}") from None
    if not is_int_dtype(a.dtype):
        raise TypeError(f"{fn}: {what} must have an integer dtype, got {a.dtype} with shape "
                        f"{_fmt(a.shape)}")
    if a.ndim != 0:
        raise ValueError(f"{fn}: {what} must be a scalar, got shape {_fmt(a.shape)} "
                         f"({a.dtype})")
    return a


def default_int() -> np.dtype[Any]:
    """The integer type offsets and num_indices travel in: int64 with jax_enable_x64,
    int32 without (jax has no 64-bit arrays then)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def to_default_int(a: jax.Array, *, saturate_to: int | None = None) -> jax.Array:
    """Integer scalar array -> the default integer type; unsigned values above its maximum
    saturate (to `saturate_to` when given)."""
    c = default_int()
    if saturate_to is not None and not isinstance(saturate_to, (int, np.integer)):
        saturate_to = None  # a symbolic n (jax.export): the kernel clamps to [0, n] anyway
    top = np.iinfo(c).max if saturate_to is None else min(saturate_to, np.iinfo(c).max)
    if a.dtype.kind == "u" and a.dtype.itemsize >= c.itemsize:
        a = jnp.minimum(a, np.array(top, a.dtype))
    # Any other integer array converts exactly: jax makes none wider than that type.
    return a.astype(c)


def maybe_le(a: int, b: int) -> bool:
    """a <= b, or True when b is a symbolic dim the comparison cannot decide (the kernel
    clamps num_indices into [0, n] at run time)."""
    try:
        return bool(a <= b)
    except jax.errors.InconclusiveDimensionOperation:
        return True


def checked_align_bytes(align_bytes: object, unit: int, what: str, fn: str) -> int | None:
    """align_bytes as an int (or None), checked: a positive multiple of `unit` bytes (an
    element, or one key), at most 2**31."""
    if align_bytes is None:
        return None
    ab = static_int(align_bytes)
    if ab is None or ab <= 0 or ab % unit or ab > 2 ** 31:
        raise ValueError(f"{fn}: align_bytes must be None or a positive multiple of {what} "
                         f"up to 2**31, got {align_bytes!r}")
    return ab


def padded_row_len(last: int, itemsize: int, align_bytes: int | None) -> int:
    if align_bytes is None:
        return last
    nbytes = last * itemsize
    return -(-nbytes // align_bytes) * align_bytes // itemsize


def check_src_dtype(src: jax.Array, fn: str) -> None:
    """A src of a dtype XLA:CPU cannot gather (_names.NOT_GATHERED) is a TypeError, where
    the program would abort the process or fail to compile."""
    name = np.dtype(src.dtype).name
    if name in _names.NOT_GATHERED:
        raise TypeError(f"{fn}: src {_fmt(src.shape)} has dtype {name}, which XLA cannot "
                        "gather on CPU (jnp.take of it aborts the process); convert it to "
                        "float32, which holds each of its values exactly, and back")


def checked_dim(src: jax.Array, dim: object, fn: str) -> int:
    """dim as an int: a Python int with 0 <= dim < src.ndim - 1."""
    d = static_int(dim)
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


def offsets_operand(offsets: object, dim: int, fn: str) -> jax.Array:
    """offsets (a sequence of dim + 1 integers, static or traced, or a rank-1 integer
    array) as one vector of the default integer type."""
    if is_arraylike(offsets) and not is_py_scalar(offsets):
        offsets = as_array(offsets, "offsets must be a sequence of integers or an integer array",
                           fn)
    if isinstance(offsets, jax.Array) and offsets.ndim == 1:
        if not is_int_dtype(offsets.dtype):
            raise TypeError(f"{fn}: offsets must have an integer dtype, got {offsets.dtype} "
                            f"with shape {_fmt(offsets.shape)}")
        offsets = [offsets[k] for k in range(offsets.shape[0])]
    elif isinstance(offsets, (jax.Array, str, bytes)) or not isinstance(offsets, Sequence):
        # an array of another rank, a dict, a ShapeDtypeStruct ...
        raise TypeError(f"{fn}: offsets must be a sequence of dim + 1 = {dim + 1} integers or a "
                        f"rank-1 integer array, got {describe(offsets)}")
    offsets = list(offsets)
    if len(offsets) != dim + 1:
        raise ValueError(f"{fn}: offsets must hold dim + 1 = {dim + 1} values for dim={dim}, "
                         f"got {len(offsets)}")
    offs = []
    cdt = default_int()
    for k, o in enumerate(offsets):
        s = int_scalar(o, f"offsets[{k}]", fn)
        if isinstance(s, int):
            if not np.iinfo(cdt).min <= s <= np.iinfo(cdt).max:
                raise ValueError(f"{fn}: offsets[{k}]={s} does not fit in {cdt.name}"
                                 + ("" if cdt == np.int64 else " (enable jax_enable_x64 for "
                                    "64-bit offsets)"))
            offs.append(jnp.asarray(s, cdt))
        else:
            offs.append(to_default_int(s))
    return jnp.stack(offs)


def index_operand(index: ArrayLike, fn: str) -> jax.Array:
    """index as a rank-1 integer array, in its own dtype. A numpy index wider than the
    dtype jax will hold it in (int64 or uint64 with jax_enable_x64 off: 32 bits) must fit
    it: jnp.asarray would wrap 2**32 + 1 to 1, a real row."""
    if isinstance(index, np.ndarray) and index.dtype.kind in "iu" and index.size:
        held = np.dtype(jax.dtypes.canonicalize_dtype(index.dtype))
        if held.itemsize < index.dtype.itemsize:
            lo, hi = index.min(), index.max()
            info = np.iinfo(held)
            if lo < info.min or hi > info.max:
                bad = int(lo) if lo < info.min else int(hi)
                raise ValueError(
                    f"{fn}: index {_fmt(index.shape)} ({index.dtype}) holds {bad}, which does "
                    f"not fit in {held.name}, the dtype jax holds it in with jax_enable_x64 off; "
                    f"enable jax_enable_x64, or pass an index whose values fit in {held.name}")
    index = as_array(index, "index must be an integer array", fn)
    if index.ndim != 1:
        raise ValueError(f"{fn}: index must have rank 1, got shape {_fmt(index.shape)} "
                         f"({index.dtype})")
    if not is_int_dtype(index.dtype):
        raise TypeError(f"{fn}: index must have an integer dtype, got {index.dtype} with shape "
                        f"{_fmt(index.shape)}")
    return index


def num_indices_operand(num_indices: object, index: jax.Array, fn: str) -> jax.Array:
    """num_indices (None: all n rows) as a scalar of the default integer type; a static
    one must lie in [0, n], a traced one saturates."""
    n = index.shape[0]
    cdt = default_int()
    if num_indices is None:
        return jnp.asarray(n, cdt)
    s = int_scalar(concrete_num_indices(num_indices), "num_indices", fn)
    if not isinstance(s, int):
        return to_default_int(s, saturate_to=n)
    if not (0 <= s and maybe_le(s, n)):
        raise ValueError(f"{fn}: num_indices={s} must lie in [0, n] = [0, {n}] for index "
                         f"{_fmt(index.shape)}")
    return jnp.asarray(s, cdt)


def concrete_num_indices(num_indices: object) -> object:
    """A 0-d numpy integer array as its numpy scalar: a concrete value, checked as a static
    one (a jax array, concrete or traced, is clamped instead: see gather's docstring)."""
    if (type(num_indices) is np.ndarray and num_indices.ndim == 0
            and num_indices.dtype.kind in "iu"):
        return num_indices[()]
    return num_indices


def pad_operand(pad_value: object, src: jax.Array, fn: str) -> jax.Array:
    """pad_value (None: 0) as a scalar of src's dtype. A weakly typed pad (a Python
    scalar, or one passed to jit) follows the selects' rule against src: of src's kind
    or a lower one it takes src's dtype (a Python int must fit it); one that would promote
    src (0.5 beside int32) is a TypeError, since the result keeps src's dtype and the
    value would be cut. A typed pad array is cast to src's dtype (as astype)."""
    if pad_value is None:
        return jnp.zeros((), src.dtype)
    if _eager.is_scalar(pad_value):  # a Python scalar, checked and converted to src's dtype
        return _eager.converted(pad_value, np.dtype(src.dtype))
    if not is_arraylike(pad_value):
        raise TypeError(f"{fn}: pad_value must be a scalar or a scalar array, got "
                        f"{describe(pad_value)}")
    sdt = np.dtype(src.dtype)
    if is_py_scalar(pad_value):
        _pad_kind(pad_value, sdt, f"pad_value={pad_value!r} (a Python "
                  f"{type(pad_value).__name__})", fn)
        return scalar_as(pad_value, sdt, "pad_value", fn)
    p = as_array(pad_value, "pad_value must be a scalar or a scalar array", fn)
    if p.ndim != 0:
        raise ValueError(f"{fn}: pad_value must be a scalar, got shape {_fmt(p.shape)} "
                         f"({p.dtype})")
    if jax.typeof(p).weak_type:
        _pad_kind(p, sdt, f"pad_value (a weakly typed {p.dtype} scalar, as jit makes of a "
                  "Python scalar)", fn)
    return p.astype(sdt)


def _pad_kind(pad: object, sdt: np.dtype[Any], what: str, fn: str) -> None:
    to = jax.dtypes.result_type(sdt, pad)
    if to != sdt:
        raise TypeError(f"{fn}: {what} would promote src's dtype {sdt.name} to {to.name}, as "
                        "jnp.result_type does, and the result keeps src's dtype; pass a pad of "
                        "src's kind, or cast src")


def static_check_bounds(check_bounds: object, fn: str) -> bool:
    """check_bounds as a bool: it picks the kernel's mode while tracing, so it must be
    static, a Python bool (numpy's bool is taken too)."""
    if isinstance(check_bounds, (bool, np.bool_)):
        return bool(check_bounds)
    if isinstance(check_bounds, jax.Array):
        what = "a traced value" if isinstance(check_bounds, jax.core.Tracer) else "a jax array"
        raise TypeError(f"{fn}: check_bounds must be a static Python bool, got {what} "
                        f"{describe(check_bounds)}; it picks the mode while tracing, so it "
                        "cannot come from an array (pass a Python bool, e.g. through "
                        "jax.jit's static_argnames)")
    raise TypeError(f"{fn}: check_bounds must be a static Python bool, got "
                    f"{describe(check_bounds)} {check_bounds!r}")
