"""Eager calls through jit's C++ dispatch, as jnp's functions make them.

Each public front-end (select, where, where3, gather) is a jitted function of its operands,
with its configuration arguments static: the front-end's checks and conversions run while
jit traces it, once per combination of shapes, dtypes and static values, and an eager call
on arrays is then one dispatch of the compiled call from jit's C++ cache (where running
the front-end op by op dispatched every conversion and bind on its own). Inside a trace
(jit, grad, vmap, scan) the jitted front-end is inlined, and jit's trace cache serves
repeated call sites. Errors are raised where they were, with the same classes and
messages: they come from the same checks, run while tracing.

Only operands whose meaning jit keeps go through it; for anything else the front-end runs
as a plain Python function, as before (lists, strings, objects with ``__jax_array__``, a
numpy array of a dtype jax would narrow, an out-of-range static index argument). A Python
scalar operand is a static argument, keyed by its type and exact bits (``0.0`` and
``-0.0``, or two NaN payloads, never share a compiled call): passed to jit as a traced
value it would be typed and rounded differently (a Python ``bool`` arrives as a typed
``bool[]``; a Python float reaches ``float16`` through ``float32``, rounded twice). So an
eager loop over many distinct Python scalars compiles one call per value: pass an array
there (``np.float32(v)``). gather's offsets and ``num_indices``, positions that loops vary,
are traced as jit traces Python ints, once checked here.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, cast

import jax
import numpy as np

from . import _compat

PY_SCALARS = (bool, int, float, complex)

# False while a converter that replaces jax.numpy's functions traces (jax_ext.onnx turns it
# off while jax2onnx does): a front-end jit traced then would keep the replacements in
# jit's cache, and a later eager call with the same shapes would run them.
ENABLED = True


class Scalar:
    """A Python scalar passed to a jitted front-end as static structure (a pytree node
    without leaves): equal to another only with the same type and bits."""
    __slots__ = ("value", "_key")

    def __init__(self, value: bool | int | float | complex) -> None:
        self.value = value
        t = type(value)
        bits: object = value
        if t is float:
            bits = struct.pack("<d", value)
        elif t is complex:
            bits = struct.pack("<dd", value.real, value.imag)
        self._key = (t, bits)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scalar) and self._key == other._key

    def __repr__(self) -> str:
        return f"Scalar({self.value!r})"


jax.tree_util.register_pytree_node(Scalar, lambda s: ((), s), lambda s, _: s)


def _kept_dtype(dt: np.dtype[Any]) -> bool:
    """Does jit keep a numpy array of this dtype as it is (jnp.asarray would too)? Not a
    64-bit type without jax_enable_x64 (jit narrows it; gather checks a wide index's
    values first), nor strings and objects."""
    try:
        return bool(jax.dtypes.canonicalize_dtype(dt) == dt)
    except (TypeError, ValueError):
        return False


_ARRAY_TYPES: set[type] = set()  # the jax array and tracer classes seen so far


def array(v: object) -> bool:
    """An operand jit takes as jax_ext would: a jax array (a tracer included), or a numpy
    array or scalar of a dtype jit keeps. (Every eager call asks: the classes seen are
    remembered, which spares isinstance's walk of jax.Array's registered subclasses.)"""
    t = type(v)
    if t in _ARRAY_TYPES:
        return True
    if t is np.ndarray or isinstance(v, np.generic):
        return _kept_dtype(cast("np.ndarray[Any, Any]", v).dtype)
    if isinstance(v, jax.Array):
        _ARRAY_TYPES.add(t)
        return True
    return False


# The concrete jax array classes seen so far (not tracers): a front-end's shortest path
# asks `type(x) in CONCRETE` (see gather).
CONCRETE: set[type] = set()


def concrete(v: object) -> bool:
    """A jax array holding values (not a tracer): the call is eager."""
    if isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer):
        CONCRETE.add(type(v))
        return True
    return False


def operand(v: object) -> object:
    """`v` as a jitted front-end takes it: an array as is, a Python scalar as a Scalar;
    NotImplemented for anything else (the front-end runs unjitted)."""
    if type(v) in PY_SCALARS:
        return Scalar(v)  # type: ignore[arg-type]
    return v if array(v) else NotImplemented


def operands(*vs: object) -> list[object] | None:
    """Every operand as `operand` gives it, or None where one is not for jit."""
    if not ENABLED:
        return None
    out = []
    for v in vs:  # (written out: every eager call of a select runs it)
        t = type(v)
        if t in _ARRAY_TYPES:
            out.append(v)
        elif t in PY_SCALARS:
            out.append(Scalar(v))  # type: ignore[arg-type]
        elif array(v):
            out.append(v)
        else:
            return None
    return out


_INTS: dict[tuple[int | tuple[int, ...], bool], jax.Array | None] = {}


def ints(values: int | tuple[int, ...]) -> jax.Array | None:
    """Python ints as an array of the default integer type (int64 with jax_enable_x64,
    else int32), made once (jit would put a Python int on the device at every call, as
    much as the rest of a small call, and these -- gather's offsets and num_indices --
    repeat from call to call); None where one does not fit (the front-end raises that
    error). Keyed by the values and the x64 flag: computing the dtype costs more than the
    rest of the lookup."""
    key = (values, bool(jax.config.jax_enable_x64))  # type: ignore[attr-defined]
    try:
        return _INTS[key]
    except KeyError:
        pass
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.int64))
    info = np.iinfo(dtype)
    flat = values if isinstance(values, tuple) else (values,)
    out = None
    if all(info.min <= v <= info.max for v in flat):
        with jax.ensure_compile_time_eval():  # a concrete array, even where a trace runs
            out = jax.device_put(np.asarray(values, dtype))
    if len(_INTS) >= 256:  # loops over many offsets: keep the newest
        _INTS.pop(next(iter(_INTS)))
    _INTS[key] = out
    return out


def int_offsets(offsets: list[Any] | tuple[Any, ...]) -> jax.Array | None:
    """`ints` of a list or tuple of Python ints; None where one is not a Python int (a
    bool is not) or does not fit."""
    for o in offsets:
        if type(o) is not int:
            return None
    values = tuple(offsets)
    # (the lookup of `ints` written out: every eager gather asks)
    out = _INTS.get((values, bool(jax.config.jax_enable_x64)), _MISSING)  # type: ignore[attr-defined]
    return ints(values) if out is _MISSING else out


_MISSING: Any = object()


def unwrap(v: Any) -> Any:
    """What the front-end was passed: a Scalar's Python value, anything else as is."""
    return v.value if type(v) is Scalar else v


def jitted(fn: Callable[..., Any], name: str, static_argnums: tuple[int, ...] = ()
           ) -> Callable[..., Any]:
    """`fn` as a jitted front-end named `name`, its arguments at `static_argnums` static:
    inlined into an enclosing trace, its Scalar operands unwrapped. Call it with every
    argument positional."""
    def front_end(*args: Any) -> Any:
        return fn(*map(unwrap, args))
    front_end.__name__ = front_end.__qualname__ = name
    out: Callable[..., Any] = jax.jit(front_end, static_argnums=static_argnums,
                                      inline=_compat.TRACE_INLINE)
    return out
