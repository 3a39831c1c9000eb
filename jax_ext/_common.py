"""What the two ops' modules (_select.py, _gather.py) share: argument formatting and
conversion for their front-ends, extended dtypes (PRNG keys), and the sum that
transposes a broadcast."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def fmt_shape(shape: Sequence[Any]) -> str:
    """A shape as error messages print it: (2, 3), symbolic dims as they are."""
    return str(tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in shape))


def result_dim(d: Any) -> Any:
    """A result extent as a Python int, or a symbolic dim (jax.export) as it is."""
    return int(d) if isinstance(d, (int, np.integer)) else d


def as_array(v: Any, what: str, fn: str) -> jax.Array:
    """jnp.asarray(v), or a TypeError "{fn}: {what}, got <type>". Strings are never
    arrays here (jnp.asarray(b"\\x00") would be an array of True); None and ragged
    nested lists raise ValueError in jnp, told as this TypeError too."""
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{fn}: {what}, got {type(v).__name__}")
    try:
        return jnp.asarray(v)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{fn}: {what}, got {type(v).__name__}: {e}") from None


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


def is_key(v: Any) -> bool:
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
