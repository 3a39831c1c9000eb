"""jax_ext: exact, fast conditional selection and padded row gather for JAX.

Semantics follow OpenVINO/oneDNN Select, ONNX Where, TensorFlow Where3 and Ascend
asctile.gather to the letter; see README.md. On CPU each operation runs as a C++ XLA FFI
handler; elsewhere (or under ``implementation("lax")``) it lowers to lax.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import implementation
from ._gather import gather
from . import _scatter_add  # noqa: F401  (registers gather's transpose)
from ._auto import Decision, explain
from ._native import TARGETS as _TARGETS
from ._native import native_available, native_error
from ._select import select, where, where3

if TYPE_CHECKING:
    from jax.export import DisabledSafetyCheck

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = ["select", "where", "where3", "gather", "native_available", "native_error",
           "implementation", "explain", "Decision", "export_checks"]


def export_checks() -> list[DisabledSafetyCheck]:
    """The ``disabled_checks`` that ``jax.export.export`` needs for functions using
    jax_ext: one ``DisabledSafetyCheck.custom_call`` per versioned native target
    (``jax_ext_select_v1``, ...). A process that deserializes such an export must
    ``import jax_ext`` first, which registers those targets::

        exp = jax.export.export(jax.jit(f), disabled_checks=jax_ext.export_checks())(*args)
    """
    import jax
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _TARGETS]
