"""select / where / where3: three front-ends over one select primitive.

The front-ends only validate and decide how each operand's dimensions map onto the
result; the primitive ``jax_ext_select`` (its rules: ``_select_rules.py``) takes

* ``out_shape``: the result shape;
* ``dims``: for each operand (cond, x, y), the result dimension each of its dimensions
  lies along (a size-1 dimension broadcasts). Dimensions of the result an operand does
  not name are broadcast too. The native kernel reads such operands with zero strides,
  so nothing is materialized, and vmap only has to extend the maps;
* ``impl``: the implementation requested, "auto", "native" or "lax", fixed when the
  primitive is bound; what runs is settled per call site when it is lowered;
* ``api``: the front-end that bound it ("select", "where" or "where3"), for messages.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard, cast

import numpy as np
import jax
import jax.numpy as jnp

from jax.typing import ArrayLike

from . import _compat, _config, _eager
# the primitive the front-ends bind, whose rules _select_rules registers
from . import _select_rules  # noqa: F401
from ._primitives import select_p
from ._common import (as_array, check_extended, describe, fmt_shape as _fmt, is_arraylike,
                      is_extended, is_key, is_py_scalar, result_dim, scalar_as)
from ._types import AutoBroadcast

# A value operand once checked: an array, or a Python scalar typed later against the other.
Value = jax.Array | bool | int | float | complex | _eager.Scalar


# --- front-end helpers --------------------------------------------------------------

def _as_array(v: ArrayLike, arg: str, fn: str) -> Value:
    if is_py_scalar(v) or _eager.is_scalar(v):
        return cast(Value, v)  # a weakly typed Python scalar: typed later against the other
    return as_array(v, f"{arg} must be an array or a scalar", fn)


def _condition(c: ArrayLike, arg: str, fn: str) -> jax.Array:
    if isinstance(c, bool):
        c = np.bool_(c)
    a = _as_array(c, arg, fn)
    if not isinstance(a, jax.Array):  # a Python int/float/complex
        raise TypeError(f"{fn}: {arg} must have dtype bool, got {type(a).__name__} {a!r}")
    if a.dtype != jnp.bool_:
        raise TypeError(f"{fn}: {arg} must have dtype bool, got {a.dtype} with shape "
                        f"{_fmt(a.shape)}")
    return a


def _key_values(x: ArrayLike, y: ArrayLike, names: tuple[str, str],
                fn: str) -> tuple[jax.Array, jax.Array]:
    """Two key arrays of one PRNG implementation, or TypeError naming them."""
    for n, v in zip(names, (x, y)):
        check_extended(v, n, fn)
    if not (is_key(x) and is_key(y)) or x.dtype != y.dtype:
        desc = " and ".join(f"{n}: {getattr(v, 'dtype', type(v).__name__)}"
                            f"{_fmt(np.shape(v)) if hasattr(v, 'shape') else ''}"
                            for n, v in zip(names, (x, y)))
        raise TypeError(f"{fn}: {names[0]} and {names[1]} must both be PRNG key arrays of one "
                        f"implementation when either is, got {desc}")
    return x, y


def _values(x: ArrayLike, y: ArrayLike, names: tuple[str, str],
            fn: str) -> tuple[jax.Array, jax.Array]:
    """Both value operands with one dtype, by jnp.where's rules for weak types: a
    weakly typed operand (a Python scalar, or a weakly typed array such as a Python
    scalar passed to jit) takes the other's dtype when it is of the same or a lower kind
    (bool < int < float < complex), else the pair promotes as jax.dtypes.result_type
    says, weakness included. Two strong dtypes must agree (TypeError). A Python int that
    does not fit the dtype it gets raises ValueError; a weakly typed array, like jnp,
    converts (an int wraps)."""
    for n, v in zip(names, (x, y)):
        if not (is_arraylike(v) or _eager.is_scalar(v)):
            raise TypeError(f"{fn}: {n} must be an array or a scalar, got {describe(v)}")
    if is_extended(x) or is_extended(y):
        return _key_values(x, y, names, fn)
    xv, yv = _as_array(x, names[0], fn), _as_array(y, names[1], fn)
    if _strong(xv) and _strong(yv) and xv.dtype != yv.dtype:
        hint = ""
        if any(v.ndim == 0 and v.dtype == np.bool_ for v in (xv, yv)):
            hint = ("; a Python bool passed as a jax.jit argument arrives as a typed bool[] "
                    "(JAX gives bools no weak type): make that argument static, or pass it "
                    "in the other operand's dtype")
        raise TypeError(f"{fn}: {names[0]} and {names[1]} must have the same dtype, got "
                        f"{names[0]}: {xv.dtype}{_fmt(xv.shape)} and {names[1]}: {yv.dtype}"
                        f"{_fmt(yv.shape)} (jax_ext never promotes two typed arrays; cast one "
                        f"explicitly){hint}")
    dt, weak = jax.dtypes.result_type(_eager.promotable(xv), _eager.promotable(yv),
                                      return_weak_type_flag=True)
    return _typed(xv, names[0], dt, weak, fn), _typed(yv, names[1], dt, weak, fn)


def _strong(v: Value) -> TypeGuard[jax.Array]:
    """A strongly typed array (not a Python scalar, nor weakly typed like one)."""
    return not (is_py_scalar(v) or _eager.is_scalar(v) or jax.typeof(v).weak_type)


def _typed(v: Value, name: str, dt: np.dtype[Any], weak: bool, fn: str) -> jax.Array:
    """One value operand as the promoted dtype `dt` (weakly typed when `weak`)."""
    if _eager.is_scalar(v):  # a Python scalar the eager layer converted to dt
        v = _eager.converted(v, dt)
        if not weak:
            return v
    elif not isinstance(v, jax.Array):  # a Python scalar
        v = scalar_as(v, dt, name, fn)  # strong: made weak below where the pair is
        if not weak:
            return v
    elif v.dtype == dt and jax.typeof(v).weak_type == weak:
        return v
    return _compat.convert_element_type(v, dt, weak_type=weak)


def _broadcast_shapes(shapes: Sequence[Sequence[int]], names: Sequence[str],
                      fn: str) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            desc = ", ".join(f"{n}: {_fmt(s)}" for n, s in zip(names, shapes))
            raise ValueError(f"{fn}: shapes do not broadcast ({desc})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _right_aligned(ndim: int, rank: int) -> tuple[int, ...]:
    return tuple(range(rank - ndim, rank))


def _bind(cond: jax.Array, x: jax.Array, y: jax.Array, out_shape: Sequence[int],
          dims: Sequence[Sequence[int]], api: str) -> jax.Array:
    if is_key(x):
        # Keys move as their key data, uint32[..., k]: the condition maps onto the
        # leading dims only, the words of one key travel together, exactly.
        impl = jax.random.key_impl(x)
        xd, yd = jax.random.key_data(x), jax.random.key_data(y)
        r = len(out_shape)
        out = _bind(cond, xd, yd, tuple(out_shape) + (xd.shape[-1],),
                    (dims[0], tuple(dims[1]) + (r,), tuple(dims[2]) + (r,)), api)
        keys: jax.Array = jax.random.wrap_key_data(out, impl=impl)  # untyped on jax 0.10.2
        return keys
    return _compat.bind(select_p, cond, x, y, out_shape=tuple(result_dim(d) for d in out_shape),
                         dims=tuple(tuple(d) for d in dims), impl=_config.current(),
                         api=api)


# --- public front-ends --------------------------------------------------------------

def select(cond: ArrayLike, then: ArrayLike, else_: ArrayLike, *,
           auto_broadcast: AutoBroadcast = "numpy") -> jax.Array:
    """Select elements of ``then`` or ``else_`` by ``cond``: OpenVINO Select-1, oneDNN Select.

    ``result = cond ? then : else_``, element by element. With ``auto_broadcast="numpy"``,
    ``then`` and ``else_`` broadcast to each other by numpy rules, giving the result shape
    ``S``; ``cond`` is then broadcast **one way** to ``S``: its rank may not exceed ``S``'s,
    and, aligned from the right, each of its dimensions equals ``S``'s or is 1, so the
    condition never enlarges the result. With ``auto_broadcast="none"`` all three shapes
    must be identical. Values are copied bit for bit (NaN payloads, ``-0.0``).

    In place (oneDNN): under ``jax.jit(..., donate_argnums=...)`` with ``then`` donated and
    ``then.shape == S``, the result reuses ``then``'s buffer on every path. Implementation
    ``"auto"`` runs XLA's fused loop there, which updates the buffer in place at least as
    fast as the kernel on the machines measured; under ``"native"`` the kernel writes only
    the blocks where ``cond`` holds a false element. A ``then`` that is not a donated
    argument of the outermost jitted function gets a fresh result, with no extra copy.

    Args:
        cond: a ``bool`` array (or a Python bool) whose shape broadcasts one way to
            ``S``. A list is not an array (``TypeError``, as in ``jnp.where``): wrap it in
            ``np.asarray``.
        then: the values where ``cond`` is true: an array or a scalar of any JAX dtype,
            or a typed PRNG key array.
        else_: the values where ``cond`` is false, of ``then``'s dtype; a Python scalar
            follows JAX's weak-type promotion, as in ``jnp.where``.
        auto_broadcast: ``"numpy"`` (the default) or ``"none"``.

    Returns:
        A ``jax.Array`` of shape ``S`` and the values' common dtype.

    Raises:
        TypeError: ``cond`` is not ``bool``; ``then`` and ``else_`` have different strong
            dtypes; an operand is not an array or a scalar.
        ValueError: ``auto_broadcast`` is a string other than ``"numpy"`` and ``"none"``
            (another type is a ``TypeError``); the shapes do not broadcast, or ``cond``
            would enlarge the result; a Python int does not fit the other operand's dtype.

    Example:
        >>> import numpy as np, jax_ext
        >>> cond = np.array([[False, False], [True, False], [True, True]])
        >>> then = np.array([[-1, 0], [1, 2], [3, 4]], np.int32)
        >>> else_ = np.array([[11, 10], [9, 8], [7, 6]], np.int32)
        >>> jax_ext.select(cond, then, else_).tolist()
        [[11, 10], [1, 8], [3, 4]]
        >>> jax_ext.select(np.array([True, False]), then, else_).tolist()  # cond (2,) -> (3, 2)
        [[-1, 10], [1, 8], [3, 6]]
    """
    ops = _eager.operands(cond, then, else_)
    if ops is None or type(auto_broadcast) is not str:
        return _select(cond, then, else_, auto_broadcast)
    return _select_jit(*ops, auto_broadcast)


def _select(cond: ArrayLike, then: ArrayLike, else_: ArrayLike,
            auto_broadcast: AutoBroadcast) -> jax.Array:
    fn = "select"
    if not isinstance(auto_broadcast, str):  # an array here would make `in` ambiguous
        raise TypeError(f"{fn}: auto_broadcast must be the string 'numpy' or 'none', got "
                        f"{type(auto_broadcast).__name__} {auto_broadcast!r}")
    if auto_broadcast not in ("numpy", "none"):
        raise ValueError(f"{fn}: auto_broadcast must be 'numpy' or 'none', got {auto_broadcast!r}")
    cond = _condition(cond, "cond", fn)
    then, else_ = _values(then, else_, ("then", "else_"), fn)
    names = ("cond", "then", "else_")
    shapes = (cond.shape, then.shape, else_.shape)
    if auto_broadcast == "none":
        if not (cond.shape == then.shape == else_.shape):
            desc = ", ".join(f"{n}: {_fmt(s)}" for n, s in zip(names, shapes))
            raise ValueError(f"{fn}: auto_broadcast='none' needs identical shapes, got {desc}")
        out = then.shape
    else:
        out = _broadcast_shapes(shapes[1:], names[1:], fn)
        ok = cond.ndim <= len(out) and all(
            c in (1, s) for c, s in zip(cond.shape[::-1], out[::-1]))
        if not ok:
            raise ValueError(f"{fn}: cond {_fmt(cond.shape)} cannot be broadcast one-way to the "
                             f"shape {_fmt(out)} of then {_fmt(then.shape)} and else_ "
                             f"{_fmt(else_.shape)}")
    r = len(out)
    return _bind(cond, then, else_, out,
                 [_right_aligned(a.ndim, r) for a in (cond, then, else_)], fn)


def where(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Select elements of ``x`` or ``y`` by ``condition``: ONNX Where-16, TF SelectV2, numpy.where.

    ``result = condition ? x : y``, element by element, with all three operands broadcast
    together by numpy rules: unlike :func:`select`, the condition may enlarge the result.
    Values are copied bit for bit (NaN payloads, ``-0.0``). Differentiable in ``x`` and
    ``y``; the condition gets no tangent.

    Args:
        condition: a ``bool`` array (or a Python bool). A list is not an array
            (``TypeError``, as in ``jnp.where``): wrap it in ``np.asarray``.
        x: the values where ``condition`` is true: an array or a scalar of any JAX dtype.
            ``x`` and ``y`` may also both be typed PRNG key arrays of one implementation
            (``jax.random.key``); they move as their key data and come back as keys.
        y: the values where ``condition`` is false, of ``x``'s dtype; a Python scalar
            follows JAX's weak-type promotion, as in ``jnp.where``.

    Returns:
        A ``jax.Array`` of the broadcast shape of the three operands and the values'
        common dtype.

    Raises:
        TypeError: ``condition`` is not ``bool``; ``x`` and ``y`` have different strong
            dtypes; an operand is not an array or a scalar.
        ValueError: the shapes do not broadcast; a Python int does not fit the other
            operand's dtype.

    Example:
        >>> import numpy as np, jax_ext
        >>> c = np.array([[True], [False]])
        >>> x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
        >>> y = np.array([[10, 20, 30]], np.int32)
        >>> jax_ext.where(c, x, y).tolist()
        [[1, 2, 3], [10, 20, 30]]
    """
    ops = _eager.operands(condition, x, y)
    return _where(condition, x, y) if ops is None else _where_jit(*ops)


def _checked(condition: ArrayLike, x: ArrayLike, y: ArrayLike,
             fn: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """where's and where3's operands checked and typed: the condition, then the values."""
    return (_condition(condition, "condition", fn),) + _values(x, y, ("x", "y"), fn)


def _where(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> jax.Array:
    fn = "where"
    condition, x, y = _checked(condition, x, y, fn)
    out = _broadcast_shapes((condition.shape, x.shape, y.shape), ("condition", "x", "y"), fn)
    r = len(out)
    return _bind(condition, x, y, out, [_right_aligned(a.ndim, r) for a in (condition, x, y)],
                 fn)


def where3(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Select elements or whole rows of ``x`` or ``y`` by ``condition``: TensorFlow Where3.

    ``x`` and ``y`` have one shape, which is the result's. ``condition`` is a scalar (it
    picks all of ``x`` or all of ``y``), or has ``x``'s shape (element-wise), or, when ``x``
    has rank >= 2, is a vector of length ``x.shape[0]`` that picks whole rows (TF's legacy
    ``Select``). With a rank-1 ``x``, a rank-1 condition is element-wise.

    Args:
        condition: a ``bool`` scalar, an array of ``x``'s shape, or (``x`` of rank >= 2)
            a vector of length ``x.shape[0]``.
        x: the values where ``condition`` is true: an array of any JAX dtype, or a typed
            PRNG key array.
        y: the values where ``condition`` is false, of ``x``'s shape and dtype.

    Returns:
        A ``jax.Array`` of ``x``'s shape and the values' common dtype.

    Raises:
        TypeError: ``condition`` is not ``bool``; ``x`` and ``y`` have different strong
            dtypes; an operand is not an array or a scalar.
        ValueError: ``x`` and ``y`` differ in shape; ``condition`` has any other shape.

    Example:
        >>> import numpy as np, jax_ext
        >>> t = np.array([[1, 2], [3, 4]], np.int32)
        >>> e = np.array([[5, 6], [7, 8]], np.int32)
        >>> jax_ext.where3(np.array([True, False]), t, e).tolist()  # row mode
        [[1, 2], [7, 8]]
    """
    ops = _eager.operands(condition, x, y)
    return _where3(condition, x, y) if ops is None else _where3_jit(*ops)


def _where3(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> jax.Array:
    fn = "where3"
    condition, x, y = _checked(condition, x, y, fn)
    if x.shape != y.shape:
        raise ValueError(f"{fn}: x and y must have the same shape, got x: {_fmt(x.shape)} and "
                         f"y: {_fmt(y.shape)}")
    r = x.ndim
    if condition.shape == x.shape:
        cdims = tuple(range(r))
    elif condition.ndim == 0:
        cdims = ()
    elif r >= 2 and condition.ndim == 1 and condition.shape[0] == x.shape[0]:
        cdims = (0,)  # row mode: the condition lies along the first dimension
    else:
        raise ValueError(f"{fn}: condition {_fmt(condition.shape)} must be a scalar, have the "
                         f"shape of x {_fmt(x.shape)}, or (x of rank >= 2) be a vector of "
                         f"length x.shape[0] = {x.shape[0] if r else '-'}")
    return _bind(condition, x, y, x.shape, [cdims, tuple(range(r)), tuple(range(r))], fn)


# One dispatch per eager call, traced once per shapes and static values (see _eager).
_select_jit = _eager.jitted(_select, "select", (3,))  # auto_broadcast
_where_jit = _eager.jitted(_where, "where")
_where3_jit = _eager.jitted(_where3, "where3")
