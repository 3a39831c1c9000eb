"""implementation("native" | "lax" | "auto") and the JAX_EXT_IMPL environment variable."""
from __future__ import annotations

from . import _compat
from ._native import native_available

_NAMES = ("auto", "native", "lax")
_state = _compat.impl_state()


def implementation(name: str):
    """Context manager choosing how jax_ext primitives bound inside it are lowered.

    "native": the C++ FFI handlers on CPU (other platforms always use lax);
    "lax": ``lax.select_n`` / ``lax.gather`` everywhere; "auto" (default): native where
    the compiled module loaded. The choice is recorded on each primitive when it is
    bound and is part of the jit cache key, so a function traced under one setting is
    retraced under another. The default comes from ``JAX_EXT_IMPL``.
    """
    if name not in _NAMES:
        raise ValueError(f"implementation: name must be one of {_NAMES}, got {name!r}")
    return _state(name)


def current() -> str:
    """The implementation a primitive bound now gets: "native" or "lax"."""
    v = _state.value
    if v == "lax" or not native_available():
        return "lax"
    return "native"
