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
numpy array of a dtype jax would narrow, an out-of-range static index argument).

A value that is concrete when the call is made and that jit would trace passes, here and
before the jitted call, every check the front-end makes on it; where one fails, the
front-end runs unjitted and raises its own error, with its class and message:

* A Python scalar operand (a select's value, gather's ``pad_value``) is traced, never
  static: a loop over many values compiles once per Python type. The dtype it gets depends
  on the other operand's dtype and weak type (jnp.where's rules), which the call already
  knows; so it is converted here, by numpy directly to that dtype (a float reaches
  ``float16`` in one rounding, ``-0.0`` and NaN payloads kept, an int that does not fit is
  refused), and passed as an array wrapped in a `Scalar` class naming its Python type,
  which the front-end types as it types the Python scalar (weakly where the pair is). A
  Python ``bool`` condition is passed as a numpy bool, which is what the front-end makes
  of it.
* gather's offsets and ``num_indices`` given as Python ints or numpy integer scalars are
  checked as the front-end checks static values (fit the default integer type;
  ``num_indices`` in ``[0, n]``), then traced: a loop over them compiles once.

Every module-level cache here is bounded and safe under threads, with or without the GIL:
reads take no lock (a dict or frozenset read is atomic), and each insertion and eviction
happens under one lock (`_LOCK`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat
from ._common import scalar_np

PY_SCALARS = (bool, int, float, complex)

# False while a converter that replaces jax.numpy's functions traces (jax_ext.onnx turns it
# off while jax2onnx does): a front-end jit traced then would keep the replacements in
# jit's cache, and a later eager call with the same shapes would run them.
ENABLED = True

_LOCK = threading.Lock()  # every insertion into (and eviction from) a cache below
_MISSING: Any = object()


def _remember(cache: dict[Any, Any], key: object, value: object, size: int) -> None:
    """cache[key] = value, keeping at most `size` entries (the oldest goes first), under
    the lock: no other thread changes the dict while this one walks it."""
    with _LOCK:
        if key not in cache and len(cache) >= size:
            del cache[next(iter(cache))]
        cache[key] = value


def _add_type(t: type, concrete: bool) -> None:
    """Remembers the jax array class `t` in _ARRAY_TYPES (and in CONCRETE where
    `concrete`): each set is swapped in whole, under the lock (readers see the old set or
    the new one, and no insertion is lost). The classes are few: past 64 a set stops
    growing (isinstance answers the others)."""
    global _ARRAY_TYPES, CONCRETE
    with _LOCK:
        if len(_ARRAY_TYPES) < 64:
            _ARRAY_TYPES = _ARRAY_TYPES | {t}
        if concrete and len(CONCRETE) < 64:
            CONCRETE = CONCRETE | {t}


# --- Python scalars, traced -------------------------------------------------------------

class BoolScalar(NamedTuple):
    """A Python bool operand, converted to the dtype the front-end gives it."""
    value: Any


class IntScalar(NamedTuple):
    """A Python int operand, converted to the dtype the front-end gives it."""
    value: Any


class FloatScalar(NamedTuple):
    """A Python float operand, converted to the dtype the front-end gives it."""
    value: Any


class ComplexScalar(NamedTuple):
    """A Python complex operand, converted to the dtype the front-end gives it."""
    value: Any


# A tuple subclass is a pytree jit flattens in C++: the class (the Python type) is static
# structure, the converted value a traced leaf.
Scalar = BoolScalar | IntScalar | FloatScalar | ComplexScalar
_WRAP: dict[type, type[Any]] = {bool: BoolScalar, int: IntScalar, float: FloatScalar,
                                complex: ComplexScalar}
PY_TYPE: dict[type, type] = {w: t for t, w in _WRAP.items()}


def is_scalar(v: object) -> bool:
    """A Python scalar operand as the eager layer passes it (see `Scalar`)."""
    return type(v) in PY_TYPE


def promotable(v: Any) -> Any:
    """What jax.dtypes.result_type is given for `v`: a Scalar's Python type stands for
    it (the promotion depends on the type, never the value), anything else as it is."""
    t = PY_TYPE.get(type(v))
    return v if t is None else t(0)


def converted(v: Any, dt: np.dtype[Any]) -> jax.Array:
    """A Scalar's value, inside the trace: the array of `dt` it was converted to when the
    call was made (the front-end computes `dt` again, from the same types)."""
    value: jax.Array = v.value
    if value.dtype != dt:
        raise AssertionError(f"jax_ext: a Python scalar converted to {value.dtype} where the "
                             f"front-end types it as {dt}")
    return value


def _type_of(v: Any) -> tuple[np.dtype[Any], bool]:
    """An array operand's (dtype, weak type), as jit will see it."""
    if isinstance(v, (np.ndarray, np.generic)):
        return v.dtype, False
    try:
        aval = v.aval
    except AttributeError:
        aval = jax.typeof(v)
    return aval.dtype, bool(aval.weak_type)


def _config() -> tuple[bool, str]:
    """What besides the dtypes decides a promotion."""
    c: Any = jax.config
    return bool(c.jax_enable_x64), str(c.jax_numpy_dtype_promotion)


# (the two operands' types, _config()) -> the pair's (dtype, weak), or None where the
# front-end raises (extended dtypes, strict promotion).
_PROMOTED: dict[Any, tuple[np.dtype[Any], bool] | None] = {}


def _promoted(x: Any, y: Any, tx: type, ty: type) -> tuple[np.dtype[Any], bool] | None:
    """The dtype and weak type the select front-ends give the pair (x, y), one of them a
    Python scalar: jax.dtypes.result_type, as they call it, remembered per types."""
    kx = tx if tx in PY_SCALARS else _type_of(x)
    ky = ty if ty in PY_SCALARS else _type_of(y)
    key = (kx, ky, _config())
    got = _PROMOTED.get(key, _MISSING)
    if got is _MISSING:
        got = None
        if not any(isinstance(k, tuple) and not _numpy_dtype(k[0]) for k in (kx, ky)):
            try:
                dt, weak = jax.dtypes.result_type(x, y, return_weak_type_flag=True)
                got = np.dtype(dt), bool(weak)
            except (TypeError, ValueError):  # the front-end raises it
                got = None
        _remember(_PROMOTED, key, got, 4096)
    return cast("tuple[np.dtype[Any], bool] | None", got)


def _numpy_dtype(dt: Any) -> bool:
    """A dtype numpy converts to (not a PRNG key's, not float0)."""
    try:
        return not (jnp.issubdtype(dt, jax.dtypes.extended) or dt == jax.dtypes.float0)
    except TypeError:
        return False


def _exact(v: bool | int | float | complex, dt: np.dtype[Any]) -> Any:
    """`v` converted to `dt` as the front-end converts it (_common.scalar_np: numpy's
    direct conversion), wrapped by its Python type; None where it does not fit (the
    front-end raises that ValueError)."""
    try:
        return _WRAP[type(v)](scalar_np(v, dt, "", ""))
    except (ValueError, OverflowError):
        return None


def values(x: Any, y: Any) -> tuple[Any, Any] | None:
    """A select's two value operands as its jitted front-end takes them: arrays as they
    are, a Python scalar converted exactly to the dtype the pair gets (see `Scalar`); None
    where the front-end must run unjitted (and raise)."""
    tx, ty = type(x), type(y)
    if tx not in PY_SCALARS and ty not in PY_SCALARS:
        return x, y
    got = _promoted(x, y, tx, ty)
    if got is None:
        return None
    if tx in PY_SCALARS:
        x = _exact(x, got[0])
    if ty in PY_SCALARS:
        y = _exact(y, got[0])
    return None if x is None or y is None else (x, y)


# gather's pad_value: (src's dtype, the Python type, _config()) -> does the pad keep src's
# dtype (else the front-end raises TypeError)?
_PAD_KIND: dict[Any, bool] = {}


def pad(v: bool | int | float | complex, src: Any) -> Any:
    """gather's Python-scalar pad_value converted exactly to src's dtype, as the front-end
    converts it; None where the front-end raises (a pad that would promote src, an int
    that does not fit, a key array src)."""
    sdt, _ = _type_of(src)
    key = (sdt, type(v), _config())
    ok = _PAD_KIND.get(key)
    if ok is None:
        try:
            ok = _numpy_dtype(sdt) and jax.dtypes.result_type(sdt, v) == sdt
        except (TypeError, ValueError):
            ok = False
        _remember(_PAD_KIND, key, ok, 4096)
    return _exact(v, np.dtype(sdt)) if ok else None


# --- which operands jit takes -----------------------------------------------------------

def _kept_dtype(dt: np.dtype[Any]) -> bool:
    """Does jit keep a numpy array of this dtype as it is (jnp.asarray would too)? Not a
    64-bit type without jax_enable_x64 (jit narrows it; gather checks a wide index's
    values first), nor strings and objects."""
    try:
        return bool(jax.dtypes.canonicalize_dtype(dt) == dt)
    except (TypeError, ValueError):
        return False


_ARRAY_TYPES: frozenset[type] = frozenset()  # the jax array and tracer classes seen so far


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
        _add_type(t, False)
        return True
    return False


# The concrete jax array classes seen so far (not tracers): a front-end's shortest path
# asks `type(x) in CONCRETE` (see gather).
CONCRETE: frozenset[type] = frozenset()


def concrete(v: object) -> bool:
    """A jax array holding values (not a tracer): the call is eager."""
    if isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer):
        if type(v) not in CONCRETE:
            _add_type(type(v), True)
        return True
    return False


def operands(cond: object, x: object, y: object) -> list[object] | None:
    """A select's operands as its jitted front-end takes them: arrays as they are, a
    Python bool condition as a numpy bool (what the front-end makes of it), Python scalar
    values as `values` converts them; None where the front-end runs unjitted."""
    if not ENABLED:
        return None
    out: list[object] = []
    tc = type(cond)
    if tc is bool:
        out.append(np.bool_(cond))
    elif tc in _ARRAY_TYPES or array(cond):
        out.append(cond)
    else:
        return None  # (a Python int condition too: the front-end names its value)
    for v in (x, y):  # (written out: every eager call of a select runs it)
        t = type(v)
        if not (t in _ARRAY_TYPES or t in PY_SCALARS or array(v)):
            return None
    xy = values(x, y)
    if xy is None:
        return None
    out += xy
    return out


# --- gather's integers ------------------------------------------------------------------

_INTS: dict[tuple[int | tuple[int, ...], bool], jax.Array | None] = {}


def ints(values: int | tuple[int, ...]) -> jax.Array | None:
    """Python ints as an array of the default integer type (int64 with jax_enable_x64,
    else int32), made once (jit would put a Python int on the device at every call, as
    much as the rest of a small call, and these -- gather's offsets and num_indices --
    repeat from call to call); None where one does not fit (the front-end raises that
    error). Keyed by the values and the x64 flag: computing the dtype costs more than the
    rest of the lookup. The newest 256 are kept."""
    key = (values, bool(jax.config.jax_enable_x64))  # type: ignore[attr-defined]
    out = _INTS.get(key, _MISSING)
    if out is not _MISSING:
        return cast("jax.Array | None", out)
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.int64))
    info = np.iinfo(dtype)
    flat = values if isinstance(values, tuple) else (values,)
    out = None
    if all(info.min <= v <= info.max for v in flat):
        with jax.ensure_compile_time_eval():  # a concrete array, even where a trace runs
            out = jax.device_put(np.asarray(values, dtype))
    _remember(_INTS, key, out, 256)
    return cast("jax.Array | None", out)


def static_int(v: object) -> int | None:
    """A Python int or a numpy integer scalar (a concrete value, which the front-end
    checks as a static one) as an int; None for anything else (a bool is not one)."""
    if type(v) is int:
        return v
    if isinstance(v, np.integer):
        return int(v)
    return None


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


def jitted(fn: Callable[..., Any], name: str, static_argnums: tuple[int, ...] = ()
           ) -> Callable[..., Any]:
    """`fn` as a jitted front-end named `name`, its arguments at `static_argnums` static,
    inlined into an enclosing trace. Call it with every argument positional."""
    def front_end(*args: Any) -> Any:
        return fn(*args)
    front_end.__name__ = front_end.__qualname__ = name
    out: Callable[..., Any] = jax.jit(front_end, static_argnums=static_argnums,
                                      inline=_compat.TRACE_INLINE)
    return out
