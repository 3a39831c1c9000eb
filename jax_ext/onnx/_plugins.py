"""The one module that touches jax2onnx's plugin interface (and onnx_ir, the graph library
its plugins build with). Its plugin API is young: everything jax_ext uses of it is named in
``INTERFACE`` and checked by :func:`interface_problems`, so a jax2onnx release that moves a
piece fails one test loudly instead of failing a user's export obscurely.

The graphs themselves are built in ``_graphs.py`` against :class:`Emitter`, which hides
jax2onnx's lowering context behind four calls (``op``, ``const``, ``inputs``, ``bind``).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import onnx_ir as ir
from jax2onnx.plugins import plugin_system

# The jax2onnx releases the tests cover (the `onnx` extra pins the same range).
TESTED = ((0, 17), (0, 18))  # >= 0.17, < 0.18

# (module, attribute, what of it jax_ext uses) for every piece it uses. The attribute may be
# dotted (a method). What is used: of a function, the parameters jax_ext passes (by name; a
# list starting with "self" is the leading positional parameters, in order); of a dataclass,
# its leading fields, in order (jax_ext passes them positionally); of another class, the
# attributes it has or its __init__ sets.
INTERFACE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("jax2onnx", "to_onnx", ("fn", "inputs", "opset", "enable_double_precision")),
    ("jax2onnx.plugins.plugin_system", "PrimitiveLeafPlugin", ("binding_specs", "lower")),
    ("jax2onnx.plugins.plugin_system", "PrimitiveLeafPlugin.lower", ("self", "ctx", "eqn")),
    ("jax2onnx.plugins.plugin_system", "AssignSpec", ("target", "attr", "value")),
    ("jax2onnx.plugins.plugin_system", "register_primitive", ()),
    ("jax2onnx.plugins.plugin_system", "PLUGIN_REGISTRY", ()),
    ("jax2onnx.converter.ir_context", "IRContext",
     ("get_value_for_var", "bind_value_for_var", "fresh_name", "builder")),
    ("jax2onnx.converter.ir_context", "IRContext.get_value_for_var", ("name_hint",)),
    ("jax2onnx.converter.ir_builder", "IRBuilder", ("opset",)),
    ("onnx_ir", "tensor", ()),
    ("onnx_ir", "DataType", ()),
    ("onnx_ir", "TensorType", ()),
    ("onnx_ir", "Shape", ()),
)

# An onnx_ir value (opaque to the graphs' code; typed Any, as the extra may be absent).
Value: TypeAlias = Any
Lowering = Callable[["Emitter", Mapping[str, Any], Sequence[Any], Any], Value]


def _resolve(module: str, attr: str) -> Any:
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _missing(obj: Any, names: tuple[str, ...]) -> list[str]:
    """What of `names` (see INTERFACE) `obj` lacks."""
    if dataclasses.is_dataclass(obj):
        fields = [f.name for f in dataclasses.fields(obj)][:len(names)]
        return [] if fields == list(names) else [f"fields {', '.join(names)} (in order)"]
    if inspect.isclass(obj):  # its attributes, and those its __init__ sets
        try:
            init = inspect.getsource(obj.__init__)
        except (OSError, TypeError):
            init = ""
        have = set(dir(obj)) | {n for n in names if re.search(rf"self\.{n}\s*[:=]", init)}
        return [n for n in names if n not in have]
    if callable(obj):
        params = list(inspect.signature(obj).parameters)
        if names[:1] == ("self",):
            return [] if params[:len(names)] == list(names) else [
                f"parameters ({', '.join(names)}) first"]
        return [n for n in names if n not in params]
    return []


def interface_problems() -> list[str]:
    """What of the jax2onnx interface jax_ext uses the installed jax2onnx lacks or changed,
    as readable lines naming the piece (empty: all there). Checks ``INTERFACE``, then uses
    the pieces as a lowering does: ``IRContext(opset=, enable_double_precision=)``,
    ``builder.opset``, ``fresh_name``, ``get_value_for_var(var, name_hint=)``, an operator
    called on ``builder`` with ``_outputs=[name]``, ``bind_value_for_var``."""
    problems = []
    for module, attr, names in INTERFACE:
        try:
            obj = _resolve(module, attr)
        except (ImportError, AttributeError) as e:
            problems.append(f"{module}.{attr}: {e}")
            continue
        problems += [f"{module}.{attr} has no {n}" for n in _missing(obj, names)]
    return problems + (_use_problems() if not problems else [])


def _use_problems() -> list[str]:
    """The pieces used as a lowering uses them, on a one-variable jaxpr."""
    import jax
    from jax2onnx.converter.ir_context import IRContext

    jaxpr = jax.make_jaxpr(lambda v: v * 2)(np.float32(1)).jaxpr
    what = "IRContext(opset=23, enable_double_precision=False)"
    try:
        ctx = IRContext(opset=23, enable_double_precision=False)
        what = "builder.opset"
        if ctx.builder.opset != 23:
            return [f"jax2onnx builder.opset is {ctx.builder.opset!r}, not the opset given"]
        what = "fresh_name"
        if ctx.fresh_name("jax_ext_probe") == ctx.fresh_name("jax_ext_probe"):
            return ["jax2onnx fresh_name gave one name twice"]
        what = "get_value_for_var(var, name_hint=)"
        value = ctx.get_value_for_var(jaxpr.invars[0], name_hint="jax_ext_probe_in")
        what = "builder.<Operator>(..., _outputs=[name])"
        out = ctx.builder.Identity(value, _outputs=["jax_ext_probe_out"])
        if out.name != "jax_ext_probe_out":
            return [f"jax2onnx {what} named its output {out.name!r}"]
        what = "bind_value_for_var"
        ctx.bind_value_for_var(jaxpr.outvars[0], out)
        if ctx.get_value_for_var(jaxpr.outvars[0]) is not out:
            return [f"jax2onnx {what} did not bind the value"]
    except Exception as e:  # a piece that moved: named, whatever it raises
        return [f"jax2onnx {what}: {type(e).__name__}: {e}"]
    return []


def version() -> tuple[int, ...]:
    """The installed jax2onnx's version as numbers."""
    v = importlib.metadata.version("jax2onnx")
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())


class Emitter:
    """Builds the ONNX nodes of one jaxpr equation through jax2onnx's lowering context."""

    def __init__(self, ctx: Any, eqn: Any) -> None:
        self._ctx, self._eqn = ctx, eqn
        self.opset: int = int(ctx.builder.opset)

    def op(self, op_type: str, *inputs: Value, **attrs: Any) -> Value:
        """One standard ONNX node with one output."""
        name = self._ctx.fresh_name(f"jax_ext_{op_type.lower()}")
        out: Value = getattr(self._ctx.builder, op_type)(*inputs, _outputs=[name], **attrs)
        dtype = _out_dtype(op_type, inputs, attrs)
        if dtype is not None:
            out.type = ir.TensorType(dtype)
        return out

    def const(self, array: np.ndarray[Any, Any]) -> Value:
        """A constant tensor (a Constant node, so it also works inside ONNX functions)."""
        a = np.asarray(array)
        out = self.op("Constant", value=tensor(a))
        out.type = ir.TensorType(ir.DataType.from_numpy(a.dtype))
        out.shape = ir.Shape(a.shape)
        return out

    def inputs(self) -> list[Value]:
        return [self._ctx.get_value_for_var(v, name_hint=self._ctx.fresh_name("jax_ext_in"))
                for v in self._eqn.invars]

    @staticmethod
    def dtype(value: Value) -> np.dtype[Any]:
        """The numpy dtype of a value. Not always the aval's: under jax2onnx's
        ``enable_double_precision`` every float tensor is float64."""
        dt: np.dtype[Any] = np.dtype(value.dtype.numpy())
        return dt

    def bind(self, value: Value, aval: Any) -> None:
        """Make `value` the equation's result, shaped as its aval (symbolic dims by name)."""
        if value.type is None:
            value.type = ir.TensorType(ir.DataType.from_numpy(np.dtype(aval.dtype)))
        value.shape = ir.Shape([d if isinstance(d, (int, np.integer)) else str(d)
                                for d in aval.shape])
        self._ctx.bind_value_for_var(self._eqn.outvars[0], value)


_BOOL_OPS = {"Less", "Greater", "GreaterOrEqual", "LessOrEqual", "Equal", "And", "Or", "Not"}


def _out_dtype(op_type: str, inputs: Sequence[Value], attrs: Mapping[str, Any]) -> Any:
    """The element type of an op's output (the graph's values carry their types, as
    jax2onnx's own nodes do), where it follows from the op and its inputs."""
    if op_type in ("Cast", "BitCast"):
        return ir.DataType(attrs["to"])
    if op_type in _BOOL_OPS:
        return ir.DataType.BOOL
    if op_type in ("Shape", "Size", "NonZero"):
        return ir.DataType.INT64
    if op_type == "ConstantOfShape":
        return attrs["value"].dtype
    source = inputs[1] if op_type == "Where" else inputs[0] if inputs else None
    return getattr(source, "dtype", None)


def tensor(array: Any) -> Any:
    """An ONNX tensor (for a node attribute) holding `array`."""
    return ir.tensor(np.asarray(array))


def onnx_type(dtype: Any) -> int:
    """The ONNX TensorProto type number of a numpy/ml_dtypes dtype."""
    return int(ir.DataType.from_numpy(np.dtype(dtype)).value)


def register(primitive: str, onnx_ops: Sequence[str], lower: Lowering) -> None:
    """Teach jax2onnx to convert `primitive` with `lower`."""
    def lower_eqn(self: Any, ctx: Any, eqn: Any) -> None:
        g = Emitter(ctx, eqn)
        aval = eqn.outvars[0].aval
        g.bind(lower(g, eqn.params, [v.aval for v in eqn.invars], aval), aval)

    def binding_specs(cls: Any) -> list[Any]:
        # While jax2onnx traces (with jax.numpy's functions replaced by its own), the
        # front-ends run unjitted: traced through jit, the replacements would stay in
        # jit's cache and run on a later eager call.
        return [plugin_system.AssignSpec("jax_ext._eager", "ENABLED", False)]

    plugin = type(f"JaxExt_{primitive}_Plugin", (plugin_system.PrimitiveLeafPlugin,),
                  {"lower": lower_eqn, "binding_specs": classmethod(binding_specs)})
    plugin_system.register_primitive(
        jaxpr_primitive=primitive, context="primitives.jax_ext", component=primitive,
        onnx=[{"component": o, "doc": f"https://onnx.ai/onnx/operators/onnx__{o}.html"}
              for o in onnx_ops], since="jax_ext", testcases=[])(plugin)


def registered(primitive: str) -> bool:
    """Whether jax2onnx has a plugin for `primitive`."""
    return primitive in plugin_system.PLUGIN_REGISTRY
