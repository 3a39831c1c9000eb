"""Loads the compiled FFI module and registers its targets for the CPU platform."""
from __future__ import annotations

import warnings

import jax

_AVAILABLE = False
_ERROR: str | None = None
TARGETS: tuple[str, ...] = ()

try:
    from . import _jax_ext  # the nanobind module built from xla_ffi/

    _regs = _jax_ext.registrations()
    for _name, _capsule in _regs.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
    TARGETS = tuple(sorted(_regs))
    _AVAILABLE = True
except Exception as e:  # a missing or broken build must not break `import jax_ext`
    _ERROR = f"{type(e).__name__}: {e}"
    warnings.warn(f"jax_ext: the native module could not be loaded ({_ERROR}); "
                  "every operation runs through lax instead", RuntimeWarning, stacklevel=2)


def native_available() -> bool:
    """True when the compiled FFI module loaded and its CPU targets are registered."""
    return _AVAILABLE
