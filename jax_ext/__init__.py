"""jax_ext: exact, fast conditional selection and padded row gather for JAX.

* :func:`select`: OpenVINO Select-1 / oneDNN Graph Select (one-way broadcast condition,
  in place for a donated ``then``);
* :func:`where`: ONNX Where-16, TF SelectV2, ``numpy.where``;
* :func:`where3`: TensorFlow Where3 (scalar, element-wise or row condition);
* :func:`gather`: Ascend ``asctile.gather`` (padded rows of a tensor);
* :func:`update_rows`: an optimizer step on the rows a gather read (training an embedding
  table at the cost of the rows it touches).

Each is a JAX primitive that works under ``jit``, ``grad``, ``vmap``, ``checkpoint``,
``scan`` and ``cond``, and is bit-exact on every path. On CPU a call runs as a C++ XLA FFI
kernel where that pays (see :func:`implementation` and :func:`explain`); elsewhere, and
without the compiled module (:func:`native_available`), it lowers to lax.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import implementation
from ._gather import gather
from .auto.explain import Decision, explain
from .auto.tuning import Report as TuningReport, tune, tuning
from ._names import TARGETS as _TARGETS
from ._native import native_available, native_error
from ._select import select, where, where3
from ._update_rows import update_rows
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from jax.export import DisabledSafetyCheck

__all__ = ["select", "where", "where3", "gather", "update_rows", "native_available", "native_error",
           "implementation", "explain", "Decision", "tune", "tuning", "TuningReport",
           "export_checks"]


def export_checks() -> list[DisabledSafetyCheck]:
    """The safety checks ``jax.export.export`` must skip for functions that use jax_ext.

    jax refuses to export custom calls it does not know to be stable. jax_ext's native
    targets are versioned (``jax_ext_select_v2``, ...), and a released jax_ext keeps
    serving every version it has exported, so an export runs with the jax_ext that wrote
    it and every later one. A process that deserializes such an export must
    ``import jax_ext`` first, which registers the targets.

    Returns:
        One ``jax.export.DisabledSafetyCheck.custom_call`` per native target, to pass as
        ``disabled_checks``.

    Example:
        >>> import numpy as np, jax, jax_ext
        >>> f = jax.jit(lambda c, x: jax_ext.where(c, x, -x))
        >>> args = (np.array([True, False]), np.ones(2, np.float32))
        >>> exp = jax.export.export(f, disabled_checks=jax_ext.export_checks())(*args)
        >>> exp.call(*args).tolist()
        [1.0, -1.0]
    """
    import jax
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _TARGETS]
