"""What the two ops' modules (_select.py, _gather.py) share: argument formatting and
conversion for their front-ends, extended dtypes (PRNG keys), and the sum that
transposes a broadcast."""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np


def fmt_shape(shape: Sequence[Any]) -> str:
    """A shape as error messages print it: (2, 3), symbolic dims as they are."""
    return str(tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in shape))


def result_dim(d: Any) -> Any:
    """A result extent as a Python int, or a symbolic dim (jax.export) as it is."""
    return int(d) if isinstance(d, (int, np.integer)) else d


PY_SCALARS = (bool, int, float, complex)


def is_py_scalar(v: Any) -> TypeGuard[bool | int | float | complex]:
    """A weakly typed Python scalar (numpy scalars such as np.float64 are strongly typed,
    though np.float64 subclasses float)."""
    return isinstance(v, PY_SCALARS) and not isinstance(v, np.generic)


def is_arraylike(v: Any) -> bool:
    """What jax_ext takes as an operand, as jnp's functions do: jax arrays (tracers
    included), numpy arrays and scalars, Python scalars, and objects with
    ``__jax_array__``. Strings, lists, dicts, ShapeDtypeStructs and other objects with a
    ``dtype`` attribute are not arrays."""
    if isinstance(v, (str, bytes)):
        return False
    return isinstance(v, (jax.Array, np.ndarray, np.generic) + PY_SCALARS) or hasattr(
        v, "__jax_array__")


def describe(v: Any) -> str:
    """A non-array as an error message names it: its type, and why it is refused where a
    user could mistake it for an array."""
    name = type(v).__name__
    if isinstance(v, (jax.Array, np.ndarray)):
        return f"{v.dtype}{fmt_shape(v.shape)}"
    if isinstance(v, (list, tuple)):
        return f"{name} (wrap it in np.asarray or jnp.asarray first)"
    if isinstance(v, jax.ShapeDtypeStruct):
        return f"ShapeDtypeStruct{fmt_shape(v.shape)} {v.dtype} (a description, not an array)"
    if hasattr(v, "dtype"):
        return f"{name} with a dtype attribute but not an array"
    return name


def as_array(v: Any, what: str, fn: str) -> jax.Array:
    """jnp.asarray(v), or a TypeError "{fn}: {what}, got <type>" for anything that is not
    an array or a scalar (see is_arraylike). Strings are never arrays here
    (jnp.asarray(b"\\x00") would be an array of True); an array jnp cannot hold (numpy
    strings, objects) is told as this TypeError too."""
    if not is_arraylike(v):
        raise TypeError(f"{fn}: {what}, got {describe(v)}")
    try:
        return jnp.asarray(v)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{fn}: {what}, got {type(v).__name__}: {e}") from None


def scalar_as(v: Any, dtype: Any, what: str, fn: str) -> jax.Array:
    """A Python scalar as a 0-d array of `dtype` (the dtype jnp's weak-type rules give
    it), or ValueError when it is an int that does not fit (see scalar_np)."""
    return jnp.asarray(scalar_np(v, dtype, what, fn))


def scalar_np(v: Any, dtype: Any, what: str, fn: str) -> np.ndarray[Any, Any]:
    """A Python scalar as a 0-d numpy array of `dtype`, converted by numpy directly (a
    float reaches float16 in one rounding; -0.0 and NaN payloads kept), or ValueError when
    it is an int that does not fit: out of an integer dtype's range (jnp would wrap it,
    int4 included), or beyond a float dtype's largest value."""
    dt = np.dtype(dtype)
    if isinstance(v, int) and not isinstance(v, bool):
        lo, hi = int_bounds(dt)
        if not lo <= v <= hi:
            if jnp.issubdtype(dt, jnp.integer):
                raise ValueError(f"{fn}: {what}={v} does not fit in {dt.name} (range "
                                 f"[{lo}, {hi}])")
            raise ValueError(f"{fn}: {what}={v} does not fit in {dt.name} (largest "
                             f"finite value {hi:g})")
    return np.asarray(v, dt)


@functools.lru_cache(maxsize=256)  # every eager call with a Python int asks; thread-safe
def int_bounds(dt: np.dtype[Any]) -> tuple[int | float, int | float]:
    """The Python ints that `dt` takes (scalar_np): an integer dtype's range, an inexact
    dtype's finite values (+-its largest, as a float), anything for another dtype."""
    if jnp.issubdtype(dt, jnp.integer):
        info = jnp.iinfo(dt)  # type: ignore[no-untyped-call]
        return int(info.min), int(info.max)
    if jnp.issubdtype(dt, jnp.inexact):
        big = float(jnp.finfo(dt).max)  # type: ignore[no-untyped-call]
        return -big, big
    return -float("inf"), float("inf")


def is_extended(v: Any) -> bool:
    """A value with an extended dtype (PRNG key arrays) or float0: no numpy dtype."""
    dt = getattr(v, "dtype", None)
    if dt is None:
        return False
    try:
        return (jnp.issubdtype(dt, jax.dtypes.extended)
                or dt == jax.dtypes.float0)
    except TypeError:
        return False


def is_key(v: Any) -> TypeGuard[jax.Array]:
    """A typed PRNG key array: of the operands jax_ext takes (ArrayLike), only a jax
    array can hold a key dtype."""
    return is_extended(v) and jnp.issubdtype(v.dtype, jax.dtypes.prng_key)


def check_extended(v: Any, arg: str, fn: str) -> None:
    """Typed PRNG key arrays move as their key data; any other extended dtype (and
    float0) has no data jax_ext could move: TypeError."""
    if is_extended(v) and not is_key(v):
        raise TypeError(f"{fn}: {arg} has dtype {v.dtype}, which jax_ext does not support: of "
                        "the extended dtypes only typed PRNG key arrays (jax.random.key) can "
                        "be selected or gathered")


def sum_to_shape(t: jax.Array, shape: Sequence[int]) -> jax.Array:
    """Sums `t` (keeping the dims) over every dim where `shape` has 1 and `t` does not:
    the transpose of broadcasting an operand of `shape` (same rank) along them."""
    ones = tuple(j for j in range(len(shape)) if shape[j] == 1 and t.shape[j] != 1)
    if ones:
        t = jnp.sum(t, axis=ones, keepdims=True)
    return t
