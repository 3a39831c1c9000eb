"""implementation("native" | "lax" | "auto") and the JAX_EXT_IMPL environment variable."""
from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import cast

from . import _compat
from ._names import IMPL_ENV, IMPLEMENTATIONS as _NAMES, ImplementationName


def _check_name(name: object, source: str = "") -> None:
    if name not in _NAMES:
        raise ValueError(f"implementation: name must be one of {_NAMES}, got {name!r}{source}")


# An unknown JAX_EXT_IMPL (a typo, "LAX", "") raises here, at import, with the message
# implementation() gives: silently running native when lax was asked for hides the typo.
if IMPL_ENV in os.environ:
    _check_name(os.environ[IMPL_ENV], f" (from the environment variable {IMPL_ENV})")
_state = _compat.impl_state(_NAMES)


def implementation(name: ImplementationName) -> AbstractContextManager[None]:
    """Choose how the jax_ext calls bound inside the block are lowered.

    * ``"auto"`` (the default): per call site, while the program is lowered for CPU, the
      path whose estimated time in the program around it is lower (a measured cost
      model: bytes moved, what would fuse with each side, fresh page mappings); see
      :func:`explain`, which prints both estimates.
    * ``"native"``: the C++ FFI kernels on CPU (lax when the native module is not loaded,
      and on every other platform).
    * ``"lax"``: ``lax.select_n`` / ``lax.gather`` everywhere, with the same bits.

    The choice is recorded on each primitive when it is bound and is part of jit's cache
    key, so a function traced under one setting is retraced under another. The process
    default comes from the environment variable ``JAX_EXT_IMPL`` (one of the same names;
    any other value makes ``import jax_ext`` raise this function's ``ValueError``).

    Args:
        name: ``"auto"``, ``"native"`` or ``"lax"``.

    Returns:
        A context manager; the previous setting is restored when the block exits.

    Raises:
        ValueError: ``name`` is not one of the three names (``"LAX"`` included).

    Example:
        >>> import numpy as np, jax, jax_ext
        >>> c, x = np.array([True, False]), np.ones(2, np.float32)
        >>> with jax_ext.implementation("lax"):
        ...     hlo = jax.jit(jax_ext.where).lower(c, x, -x).as_text()
        >>> "custom_call" in hlo
        False
    """
    _check_name(name)
    return _state(name)


def current() -> ImplementationName:
    """The implementation a primitive bound now records: "auto", "native" or "lax". What
    runs is settled when it is lowered (see jax_ext/auto); without the native module, lax."""
    # A str to jax; enum_state admits only the names (and _check_name the environment's).
    return cast(ImplementationName, _state.value)
