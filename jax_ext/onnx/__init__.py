"""Export programs that use jax_ext to ONNX with jax2onnx.

``import jax_ext.onnx`` teaches jax2onnx (the ``onnx`` extra: ``pip install
"jax_ext[onnx]"``) jax_ext's primitives; ``jax2onnx.to_onnx`` then converts a
function that calls :func:`jax_ext.select`, :func:`jax_ext.where`, :func:`jax_ext.where3`
or :func:`jax_ext.gather`, under ``vmap`` and ``grad`` too, to standard ONNX operators
(``GatherElements``, ``Gather``, ``ScatterND``, ...) that onnxruntime and OpenVINO run::

    import jax, jax.numpy as jnp, jax_ext, jax_ext.onnx
    from jax2onnx import to_onnx
    model = to_onnx(lambda c, x, y: jax_ext.where(c, x, y),
                    [jax.ShapeDtypeStruct((4, 8), jnp.bool_),
                     jax.ShapeDtypeStruct((4, 8), jnp.float32),
                     jax.ShapeDtypeStruct((1, 8), jnp.float32)])

The exported graphs move values bit for bit in onnxruntime and OpenVINO (``-0.0`` and NaN
payloads included) at every opset jax2onnx writes; ``with jax_ext.onnx.plain_where():``
around ``to_onnx`` exports selects as the runtime's own ``Where`` instead, for users who
need values, not bits. ``import jax_ext`` alone never imports jax2onnx. The guide's
"Exporting back to ONNX" section lists what each primitive becomes and which bits a
runtime changes.
"""
from __future__ import annotations

import warnings

from .. import _primitives, _shard_like
from . import _graphs, _plugins
from ._graphs import Unsupported, plain_where
from ._plugins import interface_problems

__all__ = ["PRIMITIVES", "Unsupported", "interface_problems", "plain_where"]

# primitive name -> (its lowering, the ONNX operators it uses)
_LOWERINGS = {
    _primitives.select_p.name: (_graphs.select, ("GatherElements", "Concat", "Unsqueeze",
                                                  "Squeeze", "Expand", "Cast", "Transpose",
                                                  "Gather", "Shape", "Slice",
                                                  "ConstantOfShape", "Where")),
    _primitives.gather_p.name: (_graphs.gather, ("Gather", "ScatterND", "NonZero", "GatherND",
                                                  "Concat", "Expand", "Range", "Reshape")),
    _primitives.scatter_add_p.name: (_graphs.scatter_add, ("ScatterND", "ConstantOfShape",
                                                            "Expand", "Slice", "Cast")),
    _shard_like.shard_like_p.name: (_graphs.shard_like, ("Identity",)),
}
PRIMITIVES: tuple[str, ...] = tuple(_LOWERINGS)
"""The jax primitives this module teaches jax2onnx."""

if not _plugins.TESTED[0] <= _plugins.version()[:2] < _plugins.TESTED[1]:
    warnings.warn(f"jax_ext.onnx was tested with jax2onnx {_plugins.TESTED[0][0]}."
                  f"{_plugins.TESTED[0][1]}.x; the installed "
                  f"{'.'.join(map(str, _plugins.version()))} may have moved its plugin "
                  "interface", stacklevel=2)
for _name, (_lower, _ops) in _LOWERINGS.items():
    _plugins.register(_name, _ops, _lower)
