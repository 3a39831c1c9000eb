"""implementation("native" | "lax" | "auto") and the JAX_EXT_IMPL environment variable."""
from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Literal

from . import _compat

ImplementationName = Literal["auto", "native", "lax"]
_NAMES = ("auto", "native", "lax")


def _check_name(name: object, source: str = "") -> None:
    if name not in _NAMES:
        raise ValueError(f"implementation: name must be one of {_NAMES}, got {name!r}{source}")


# An unknown JAX_EXT_IMPL (a typo, "LAX", "") raises here, at import, with the message
# implementation() gives: silently running native when lax was asked for hides the typo.
if "JAX_EXT_IMPL" in os.environ:
    _check_name(os.environ["JAX_EXT_IMPL"], " (from the environment variable JAX_EXT_IMPL)")
_state = _compat.impl_state()


def implementation(name: ImplementationName) -> AbstractContextManager[None]:
    """Context manager choosing how jax_ext primitives bound inside it are lowered.

    "native": the C++ FFI handlers on CPU (other platforms always use lax);
    "lax": ``lax.select_n`` / ``lax.gather`` everywhere; "auto" (default): per call site,
    native only where the kernel wins in the program around it (operands already in
    memory, a result nothing would fuse, enough work), lax elsewhere; see
    ``jax_ext.explain``. The choice is recorded on each primitive when it is
    bound and is part of the jit cache key, so a function traced under one setting is
    retraced under another. The default comes from ``JAX_EXT_IMPL`` (one of the same
    names; any other value makes ``import jax_ext`` raise this function's ValueError).
    """
    _check_name(name)
    return _state(name)  # type: ignore[no-any-return]


def current() -> ImplementationName:
    """The implementation a primitive bound now records: "auto", "native" or "lax". What
    runs is settled when it is lowered (see _auto.py); without the native module, lax."""
    return _state.value  # type: ignore[no-any-return]
