"""jax_ext: exact, fast conditional selection and padded row gather for JAX.

Semantics follow OpenVINO/oneDNN Select, ONNX Where, TensorFlow Where3 and Ascend
asctile.gather to the letter; see README.md. On CPU each operation runs as a C++ XLA FFI
handler; elsewhere (or under ``implementation("lax")``) it lowers to lax.
"""
from ._config import implementation
from ._native import native_available, TARGETS as _TARGETS
from ._select import select, where, where3
from ._gather import gather
from ._auto import explain, Decision

__all__ = ["select", "where", "where3", "gather", "native_available", "implementation",
           "explain", "Decision", "export_checks"]


def export_checks():
    """The ``disabled_checks`` that ``jax.export.export`` needs for functions using
    jax_ext: one ``DisabledSafetyCheck.custom_call`` per versioned native target
    (``jax_ext_select_v1``, ...). A process that deserializes such an export must
    ``import jax_ext`` first, which registers those targets::

        exp = jax.export.export(jax.jit(f), disabled_checks=jax_ext.export_checks())(*args)
    """
    import jax
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _TARGETS]


__version__ = "0.1.0"
