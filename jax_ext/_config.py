"""implementation("native" | "lax" | "auto") and the JAX_EXT_IMPL environment variable."""
from __future__ import annotations

from . import _compat
from ._native import native_available

_NAMES = ("auto", "native", "lax")
_state = _compat.impl_state()


def implementation(name: str):
    """Context manager choosing how jax_ext primitives bound inside it are lowered.

    "native": the C++ FFI handlers on CPU (other platforms always use lax);
    "lax": ``lax.select_n`` / ``lax.gather`` everywhere; "auto" (default): per call site,
    native only where the kernel wins in the program around it (operands already in
    memory, a result nothing would fuse, enough work), lax elsewhere; see
    ``jax_ext.explain``. The choice is recorded on each primitive when it is
    bound and is part of the jit cache key, so a function traced under one setting is
    retraced under another. The default comes from ``JAX_EXT_IMPL``.
    """
    if name not in _NAMES:
        raise ValueError(f"implementation: name must be one of {_NAMES}, got {name!r}")
    return _state(name)


def current() -> str:
    """The implementation a primitive bound now records: "auto", "native" or "lax". What
    runs is settled when it is lowered (see _auto.py); without the native module, lax."""
    return _state.value
