"""jax_ext: exact, fast conditional selection and padded row gather for JAX.

Semantics follow OpenVINO/oneDNN Select, ONNX Where, TensorFlow Where3 and Ascend
asctile.gather to the letter; see README.md. On CPU each operation runs as a C++ XLA FFI
handler; elsewhere (or under ``implementation("lax")``) it lowers to lax.
"""
from ._config import implementation
from ._native import native_available
from ._select import select, where, where3
from ._gather import gather

__all__ = ["select", "where", "where3", "gather", "native_available", "implementation"]
__version__ = "0.1.0"
