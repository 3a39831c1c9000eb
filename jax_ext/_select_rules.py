"""The rules of the select primitive ``jax_ext_select`` (front-ends: ``_select.py``).

Its parameters (the front-ends set them):

* ``out_shape``: the result shape;
* ``dims``: for each operand (cond, x, y), the result dimension each of its dimensions
  lies along (a size-1 dimension broadcasts). Dimensions of the result an operand does
  not name are broadcast too. The native kernel reads such operands with zero strides,
  so nothing is materialized, and vmap only has to extend the maps;
* ``impl``: the implementation requested, "auto", "native" or "lax", fixed when the
  primitive is bound; what runs is settled per call site when it is lowered;
* ``api``: the front-end that bound it ("select", "where" or "where3"), for messages.

Abstract evaluation, the lax implementation (select_n, as jnp.where, bit-exact through
_lowering's views), the native lowering, SPMD partitioning, JVP, transpose and batching,
registered together at the end.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from jax.typing import DTypeLike

from . import _compat, _compat_sharding, _lowering, _names, _partition
from ._compat import Aval, Primal, SpecEntry, Tangent, ir
from ._primitives import select_p
from ._common import fmt_shape as _fmt, sum_to_shape

Zero = _compat.Zero


def _abstract_eval(cond: Aval, x: Aval, y: Aval, *, out_shape: Sequence[int],
                   dims: Sequence[Sequence[int]], impl: str, api: str) -> Aval:
    prim = _names.SELECT.primitive
    for name, a, d in zip(("cond", "x", "y"), (cond, x, y), dims):
        if len(d) != a.ndim or len(set(d)) != len(d) or any(
                not 0 <= o < len(out_shape) or a.shape[j] not in (1, out_shape[o])
                for j, o in enumerate(d)):
            raise ValueError(f"{prim}: {name} {_fmt(a.shape)} does not map onto "
                             f"{_fmt(out_shape)} with dims {d}")
    if cond.dtype != np.bool_ or x.dtype != y.dtype:
        raise TypeError(f"{prim}: bad dtypes cond {cond.dtype}, x {x.dtype}, y {y.dtype}")
    avals = (cond, x, y)
    spec = _partition.merge_specs(prim, [
        [_compat_sharding.spec_entries(a)[j] for a, d in zip(avals, dims)
         for j, o2 in enumerate(d) if o2 == o and a.shape[j] == n]
        for o, n in enumerate(out_shape)])
    return _compat_sharding.typed_result(prim, avals, x, spec, shape=tuple(out_shape),
                                         dtype=x.dtype,
                                         weak_type=bool(x.weak_type and y.weak_type))


def _native_lowering(ctx: _lowering.Ctx, cond: ir.Value[Any], x: ir.Value[Any],
                     y: ir.Value[Any], *, out_shape: Sequence[int],
                     dims: Sequence[Sequence[int]], impl: str, api: str,
                     donated: Sequence[bool] = (False,) * 3) -> _compat.IrValues | None:
    avals: Sequence[Aval] = ctx.avals_in
    if not _lowering.native_dtype_ok(avals[1].dtype, _names.SELECT):
        return None
    # In place: alias x to the result when it is laid out like the result and the caller
    # donated it. Aliasing a buffer that is not donated would make XLA copy it first,
    # which costs more than it saves. Partitioned, this is one shard of x and the result.
    alias = (avals[1].shape == tuple(out_shape) and dims[1] == tuple(range(len(out_shape)))
             and donated[1])
    # The kernel reads the shapes from the buffers (static or symbolic alike) and only needs
    # to know which result dim each operand dim lies along.
    return _lowering.ffi_call(ctx, _names.SELECT.target, (cond, x, y),
                              aliases={1: 0} if alias else None, cond_dims=dims[0],
                              x_dims=dims[1], y_dims=dims[2])


def _expand(a: jax.Array, d: Sequence[int], out_shape: Sequence[int],
            sharding: jax.sharding.NamedSharding | None = None) -> jax.Array:
    """broadcast_in_dim of `a` (its dims mapped by `d`) onto out_shape, as jnp.where does;
    broadcast_in_dim wants its dimensions sorted. `sharding`: the result's, under
    explicit mesh axes (jax wants it spelled out there)."""
    order = sorted(range(len(d)), key=lambda j: d[j])
    if order != list(range(len(d))):
        a = lax.transpose(a, order)
    if a.shape == tuple(out_shape):
        return a
    return lax.broadcast_in_dim(a, tuple(out_shape), tuple(d[j] for j in order),
                                out_sharding=sharding)


def _lax_impl(cond: jax.Array, x: jax.Array, y: jax.Array, *, out_shape: Sequence[int],
              dims: Sequence[Sequence[int]], impl: str, api: str) -> jax.Array:
    """broadcast_in_dim + select_n, as jnp.where, so XLA fuses it with the ops around it
    (and updates a donated operand in place); bit-exact through _lowering.exact_view, the
    same-width one (see there)."""
    ex = _lowering.view_dims(x.dtype)
    r = len(out_shape)
    shape, vd = tuple(out_shape) + ex, tuple(range(r, r + len(ex)))
    aval = _abstract_eval(*map(jax.typeof, (cond, x, y)), out_shape=out_shape, dims=dims,
                          impl=impl, api=api)
    sharding = _lowering.explicit_sharding(aval, ex)
    xv, yv = _lowering.exact_view(x), _lowering.exact_view(y)
    out = lax.select_n(_expand(cond, dims[0], shape, sharding),
                       _expand(yv, tuple(dims[2]) + vd, shape, sharding),
                       _expand(xv, tuple(dims[1]) + vd, shape, sharding))
    return _lowering.from_view(out, x.dtype)


def _spmd_rule(avals_in: Sequence[Aval], aval_out: Aval, *, out_shape: Sequence[int],
               dims: Sequence[Sequence[int]], **_: Any) -> _partition.Factors:
    """Element-wise: an operand dim of full size shares the result dim's factor; a
    broadcast (size-1) dim gets a factor of its own, so it never limits the sharding."""
    f_out = [f"o{o}" for o in range(len(out_shape))]
    f_in = [[f"o{o}" if a.shape[j] == out_shape[o] else f"b{k}_{j}" for j, o in enumerate(d)]
            for k, (a, d) in enumerate(zip(avals_in, dims))]
    return f_in, f_out, (), ()


def _spmd_partition(o: Sequence[SpecEntry], mesh_shape: Mapping[str, int],
                    avals_in: Sequence[Aval], aval_out: Aval, given: Sequence[Sequence[SpecEntry]],
                    *, out_shape: Sequence[int], dims: Sequence[Sequence[int]],
                    **params: Any) -> _partition.Partition:
    """Each device selects its own block: operands sharded like the result (broadcast
    dims replicated), the kernel bound on the block's shape. Nothing is communicated."""
    o = tuple(None if n == 1 else e for n, e in zip(out_shape, o))
    in_specs = [[o[d] if a.shape[j] == out_shape[d] else None
                 for j, d in enumerate(dd)] for a, dd in zip(avals_in, dims)]
    local_shape = tuple(_partition.local_size(n, e, mesh_shape) for n, e in zip(out_shape, o))

    def local(bind: Callable[..., jax.Array], cond: jax.Array, x: jax.Array,
              y: jax.Array) -> jax.Array:
        return bind(cond, x, y, out_shape=local_shape, dims=dims, **params)
    return in_specs, o, local, None


def _zero_scalar(dtype: DTypeLike) -> jax.Array:
    """A scalar 0 of `dtype`: a numpy constant where numpy has the dtype (jnp.zeros traces
    a jitted call, about 60 us at every JVP and transpose of every call site)."""
    if jnp.issubdtype(dtype, np.number) or jnp.issubdtype(dtype, np.bool_):
        return np.zeros((), dtype)  # type: ignore[return-value]
    return jnp.zeros((), dtype)  # float0, extended dtypes


def _jvp(primals: Sequence[jax.Array], tangents: Sequence[Tangent], *,
         out_shape: Sequence[int], dims: Sequence[Sequence[int]], impl: str,
         api: str) -> tuple[jax.Array, Tangent]:
    cond, x, y = primals
    tx, ty = (_compat.instantiate_tangent(t, p) for t, p in zip(tangents[1:], (x, y)))
    out = _compat.bind(select_p, cond, x, y, out_shape=out_shape, dims=dims, impl=impl, api=api)
    if type(tx) is Zero and type(ty) is Zero:
        return out, Zero(jax.typeof(out).to_tangent_aval())
    # A zero tangent is a scalar read with zero strides: nothing is materialized.
    tdt = (ty if type(tx) is Zero else tx).dtype
    tdims = list(dims)
    if type(tx) is Zero:
        tx, tdims[1] = _zero_scalar(tdt), ()
    if type(ty) is Zero:
        ty, tdims[2] = _zero_scalar(tdt), ()
    return out, _compat.bind(select_p, cond, tx, ty, out_shape=out_shape, dims=tuple(tdims),
                             impl=impl, api=api)


def _unbroadcast(t: jax.Array, shape: Sequence[int], d: Sequence[int],
                 out_shape: Sequence[int]) -> jax.Array:
    """Transpose of reading an operand of `shape` through map `d`: sum the cotangent
    over every result dimension the operand was broadcast along."""
    summed = tuple(o for o in range(len(out_shape)) if o not in d)
    if summed:
        t = jnp.sum(t, axis=summed)
    kept = sorted(d)
    if list(d) != kept:
        t = lax.transpose(t, [kept.index(o) for o in d])  # into the operand's dim order
    return sum_to_shape(t, shape)


def _transpose(ct: Tangent, cond: Primal, x: Primal, y: Primal, *, out_shape: Sequence[int],
               dims: Sequence[Sequence[int]], impl: str, api: str) -> list[Tangent | None]:
    if _compat.is_undefined_primal(cond):
        raise ValueError(f"{_names.SELECT.primitive} is not linear in its condition")
    outs: list[Tangent | None] = [None]
    for k, arg in ((1, x), (2, y)):
        if not _compat.is_undefined_primal(arg):
            outs.append(None)
        elif type(ct) is Zero:
            outs.append(Zero(arg.aval))
        else:
            z = _zero_scalar(ct.dtype)
            # ct where this operand was picked, 0 elsewhere: one more select.
            pair = (ct, z) if k == 1 else (z, ct)
            pdims = (dims[0], tuple(range(len(out_shape))), ()) if k == 1 else \
                    (dims[0], (), tuple(range(len(out_shape))))
            picked = _compat.bind(select_p, cond, *pair, out_shape=out_shape, dims=pdims, impl=impl,
                                   api=api)
            outs.append(_unbroadcast(picked, arg.aval.shape, dims[k], out_shape))
    return outs


def _batch(axis_size: int, args: Sequence[jax.Array], bdims: Sequence[int | None], *,
           out_shape: Sequence[int], dims: Sequence[Sequence[int]], impl: str,
           api: str) -> tuple[jax.Array, int]:
    """One call with a new leading result dimension: a batched operand maps its batch
    dimension onto it, an unbatched one is broadcast along it (zero stride)."""
    new_dims = []
    for d, bd in zip(dims, bdims):
        nd = [o + 1 for o in d]
        if bd is not None:
            nd.insert(bd, 0)
        new_dims.append(tuple(nd))
    out = _compat.bind(select_p, *args, out_shape=(axis_size,) + tuple(out_shape),
                        dims=tuple(new_dims), impl=impl, api=api)
    return out, 0


# --- registration: every rule of jax_ext_select -------------------------------------

select_p.def_impl(lambda *args, **params: _compat.apply_primitive(select_p, *args, **params))
select_p.def_abstract_eval(_abstract_eval)
_lowering.register(select_p, _names.SELECT, _lax_impl, _native_lowering,
                   inspects_operands=True, spmd=_partition.Spmd(_spmd_rule, _spmd_partition))
_compat.ad.primitive_jvps[select_p] = _jvp
_compat.ad.primitive_transposes[select_p] = _transpose
_compat.register_batcher(select_p, _batch)
