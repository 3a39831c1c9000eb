"""implementation "auto": native or lax, chosen per call site while lowering.

A native call is opaque to XLA: what produces its operands and what consumes its result can
no longer be fused with it into one loop. ``choose`` reads the call site (analysis.py),
estimates each side's time (model.py, with the constants of costs.json) and takes the
cheaper; explain.py records each decision for :func:`jax_ext.explain`. Every path gives the
same bits, so a choice can only change the time.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _compat, _names
from . import analysis, costs, model, tuning
from .model import Choice

__all__ = ["Choice", "choose"]

def choose(op: _names.OpSpec, prim: Any, ctx: Any, args: Sequence[Any],
           params: dict[str, Any]) -> Choice:
    """auto's choice at the call site being lowered (`ctx`, with MLIR values `args`)."""
    site = analysis.site(op.op, prim, ctx, args, params, op.operands, op.fused_operands)
    if site is None:
        return _symbolic(op, prim, ctx, args)
    # The choice is a function of the site's fingerprint (its types, static params and
    # surroundings), the bytes its producers re-read and the tuning state: sites alike (a
    # layer repeated, a loop unrolled) share it, made once per module being lowered.
    key = (_CHOICE, site.key, tuple(sorted(site.rereads.items())), tuning.state())
    memo = ctx.module_context.cached_primitive_lowerings
    choice: Choice | None = memo.get(key)
    if choice is None:
        choice = memo[key] = _decide(op, site, ctx, params)
    return choice


_CHOICE = object()  # marks auto's entries in a module's lowering cache


def _decide(op: _names.OpSpec, site: analysis.Site, ctx: Any,
            params: dict[str, Any]) -> Choice:
    estimate = model.decide(op, site, costs.shipped(), ctx, params)
    measured = tuning.lookup(site.key)  # a stored measurement wins over the estimate
    if measured is None:
        return estimate
    return dataclasses.replace(estimate, native=measured.native, reason=measured.reason)


def _symbolic(op: _names.OpSpec, prim: Any, ctx: Any, args: Sequence[Any]) -> Choice:
    """Symbolic shapes (jax.export): no estimate; the kernel where nothing fuses."""
    if not op.lax_fuses:
        return Choice(True, "a size known only at run time; XLA's scatter does not fuse "
                      "either")
    stack = _compat.enclosing_equations()
    for name, aval, v in zip(op.operands, ctx.avals_in, args):
        if aval.ndim == 0 or name not in op.fused_operands:
            continue
        mem, what = analysis.producer(v, stack)
        if not mem:
            return Choice(False, f"a size known only at run time; {name} comes from {what}")
    kept, why = analysis.consumers(prim)
    return Choice(kept, f"a size known only at run time; {why}")
