"""shard_like: a value sharded as another of its shape, for gradients on auto mesh axes.

``jax_ext_shard_like(x, like)`` is ``x``, linear in ``x``; ``like`` is read for its
sharding only. Where the program runs on several devices (a jit or an export on a mesh), it
lowers to a Shardy sharding group of the two: XLA gives ``x`` the sharding ``like`` has.
Its transpose is the same tie of the cotangent to ``like``.

Why: the scatter-add that forms a table's gradient has the table's rows only in its
result, so on auto mesh axes Shardy has nothing to take their sharding from, and a bare
``jax.grad`` of a row-sharded table would come back replicated (as ``jnp.take``'s does).
gather's JVP ties the table's tangent to the table, so the transpose ties the gradient to
it: the gradient comes back sharded like the table, as a gradient is typed like its
primal under explicit axes. It changes no value, only where values live.

On one device, inside a shard_map body and under the GSPMD partitioner it lowers to
``x``. Under ``vmap``, an unbatched ``like`` is broadcast to ``x``'s shape: only its
sharding is read, and XLA removes the unread broadcast; an unbatched ``x`` with a batched
``like`` stays as it is.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from . import _compat, _compat_sharding, _names
from ._compat import Aval, Primal, Tangent, ir, mlir

Zero = _compat.Zero

shard_like_p = _compat.Primitive(_names.SHARD_LIKE)


def shard_like(x: jax.Array, like: jax.Array) -> jax.Array:
    """`x`, sharded as `like` (of x's shape and dtype) where XLA partitions the program;
    `x` itself where nothing is traced (an eager array keeps its own sharding)."""
    if not isinstance(like, jax.core.Tracer) and not isinstance(x, jax.core.Tracer):
        return x
    return _compat.bind(shard_like_p, x, like)


def _abstract_eval(x: Aval, like: Aval) -> Aval:
    if x.shape != like.shape:
        raise ValueError(f"{_names.SHARD_LIKE}: x {x.shape} and like {like.shape} differ in "
                         "shape")
    return x


def _lowering(ctx: mlir.LoweringRuleContext, x: ir.Value[Any],
              like: ir.Value[Any]) -> _compat.IrValues:
    if _compat_sharding.several_devices(ctx):
        _compat_sharding.sharding_group(x, like)
    return [x]


def _jvp(primals: Sequence[jax.Array], tangents: Sequence[Tangent]
         ) -> tuple[jax.Array, Tangent]:
    x, like = primals
    out = _compat.bind(shard_like_p, x, like)
    t = tangents[0]
    if type(t) is Zero:
        return out, t
    return out, _compat.bind(shard_like_p, t, like)


def _transpose(ct: Tangent, x: Primal, like: Primal) -> list[Tangent | None]:
    if _compat.is_undefined_primal(like):
        raise ValueError(f"{_names.SHARD_LIKE}: like is read for its sharding only and "
                         "cannot be linear")
    if type(ct) is Zero:
        return [ct, None]
    return [_compat.bind(shard_like_p, ct, like), None]


def _batch(axis_size: int, args: Sequence[jax.Array], bdims: Sequence[int | None]
           ) -> tuple[jax.Array, int | None]:
    x, like = args
    bx, bl = bdims
    if bx is None:
        return x, None  # one x for a batch of likes: no one sharding to tie it to
    if bl is None:
        if not isinstance(like, jax.core.Tracer):
            return x, bx  # run eagerly: nothing partitions it, and a broadcast would be made
        # like broadcast along x's batch dim: only its sharding is read, and once XLA has
        # propagated it nothing reads the broadcast, which XLA then removes.
        like = lax.broadcast_in_dim(like, x.shape,
                                    tuple(d for d in range(x.ndim) if d != bx))
        return _compat.bind(shard_like_p, x, like), bx
    return _compat.bind(shard_like_p, x, jnp.moveaxis(like, bl, bx)), bx


shard_like_p.def_impl(lambda x, like: x)
shard_like_p.def_abstract_eval(_abstract_eval)
_compat.register_lowering(shard_like_p, _lowering)
_compat.ad.primitive_jvps[shard_like_p] = _jvp
_compat.ad.primitive_transposes[shard_like_p] = _transpose
_compat.register_batcher(shard_like_p, _batch)
