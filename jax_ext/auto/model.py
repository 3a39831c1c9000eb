"""The cost model: each side's time at one call site, estimated from what sets it.

Constants come from costs.json (costs.py; fitted by ``jax-ext-bench --calibrate``). A side
pays:

* its own loop: ``s0`` (+ ``s_per_row`` per row for gather and scatter-add) + ``s_per_byte``
  per byte it reads and writes (select: one thread below ``pool_min_bytes`` of result, the
  thread pool above);
* a result above glibc's mmap threshold is a fresh mapping on each call: XLA's loops fault
  its 4 KiB pages in one by one, the kernels map huge pages (``fresh``);
* lax: an operand whose producer would fuse is not read from memory (the fused loop
  computes it), and a result that a consumer would fuse is never written;
* native: such an operand is materialized first (a loop writing it, re-reading what its
  producer reads) and such a result is read back by its consumer (``materialize``).

The kernel runs where its estimate is below ``native_margin`` times the lax path's.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _names
from .analysis import Site
from .costs import CostTable


@dataclass(frozen=True)
class Choice:
    """What auto decided at one call site, and why."""
    native: bool
    reason: str
    est_native_s: float | None = None
    est_lax_s: float | None = None
    site: str | None = None  # the call site's fingerprint, when its sizes are known


def fmt_s(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fresh(t: CostTable, impl: str, nbytes: int) -> float:
    # glibc maps a request of at least the threshold (XLA adds alignment on top)
    if nbytes < t.structure.mmap_threshold_bytes:
        return 0.0
    side = t.fresh.native if impl == "native" else t.fresh.lax
    return side.s_per_byte * nbytes


def _materialize(t: CostTable, nbytes: int) -> float:
    return t.materialize.s0 + t.materialize.s_per_byte * nbytes


def _lax_s0(site: Site, s0: float) -> float:
    """The lax side's fixed cost: fitted on standalone calls, so it holds a program's
    launch, which a lax op fused with a neighbour does not add (the fused loop is
    launched anyway). The kernel keeps its own: a custom call is a launch of its own."""
    return 0.0 if site.fused() else s0


def _materialized_inputs(t: CostTable, site: Site, names: Sequence[str]) -> float:
    return sum(_materialize(t, o.nbytes + site.rereads.get(o.name, 0))
               for o in site.operands if o.name in names and not o.in_memory)


def _in_place(site: Site, ctx: Any) -> bool:
    """A select whose `then` (the second operand) is donated and shaped like the result:
    both paths then update that buffer in place (the kernel through an alias, XLA's fused
    loop by reusing the donated buffer)."""
    x = site.operands[1]
    return x.donated and tuple(ctx.avals_in[1].shape) == tuple(ctx.avals_out[0].shape)


def select(site: Site, t: CostTable, ctx: Any, nbatch: int) -> tuple[float, float]:
    """(native, lax) seconds for a select."""
    single = site.out_bytes < t.structure.pool_min_bytes
    nat, lax = t.select.native, t.select.lax
    read_all = sum(o.nbytes for o in site.operands)
    read_lax = sum(o.nbytes for o in site.operands if o.in_memory)
    # (a correction learned from tuning: costs.Corrections)
    one_full = sum(o.producer != "small" for o in site.operands) == 1
    factor = t.corrections.select_lax_one_full_operand if one_full else 1.0
    lax_s = _lax_s0(site, lax.s0_single if single else lax.s0) + factor * lax.s_per_byte * (
        read_lax + (site.out_bytes if site.result_kept else 0))
    if site.result_kept:
        lax_s += _fresh(t, "lax", site.out_bytes)
    if _in_place(site, ctx):
        # In place neither side maps a result, and XLA's fused loop, compiled for this
        # processor, reads and writes the same bytes as the kernel: the kernel has
        # nothing to gain there and XLA's loop is at least as fast (see
        # docs/performance.md, "The in-place select"). Both sides are estimated as XLA's
        # loop, so the lax path is kept (native_margin).
        return lax_s, lax_s
    native_s = ((nat.s0_single if single else nat.s0)
                + nat.s_per_byte * (read_all + site.out_bytes)
                + _fresh(t, "native", site.out_bytes)
                + _materialized_inputs(t, site, [o.name for o in site.operands])
                + (0.0 if site.result_kept else _materialize(t, site.out_bytes)))
    return native_s, lax_s


def row_ratio(t: CostTable, out_shape: Sequence[int]) -> float:
    """XLA's gather loop over the kernel's, for a result whose last dim (which XLA's
    loop runs over innermost) is that long: the ratio measured at the longest of the
    table's row lengths not above it. A step, not an interpolation: XLA's code changes in
    steps with the length."""
    last = int(out_shape[-1]) if len(out_shape) else 1
    lengths = t.row_lengths
    at = max((n for n in lengths if n <= last), default=lengths[0])
    return t.gather.lax.row_ratio[at]


def gather(site: Site, t: CostTable, ctx: Any, nbatch: int) -> tuple[float, float]:
    """(native, lax) seconds for a row gather. Rows: the batch times the index length;
    XLA's gather reads only those rows of src, even of a fused src."""
    out_shape = ctx.avals_out[0].shape
    rows = math.prod(int(d) for d in out_shape[:nbatch + 1])
    out, g = site.out_bytes, t.gather.native
    small = sum(o.nbytes for o in site.operands if o.name != "src")
    ratio = row_ratio(t, out_shape)
    c = t.corrections  # (a correction learned from tuning: costs.Corrections)
    if not site.result_kept and int(out_shape[-1]) < c.gather_fused_short_rows_below:
        ratio *= c.gather_lax_fused_short_rows
    lax_s = (_lax_s0(site, t.gather.lax.s0) + ratio * (
             g.s_per_row * rows + g.s_per_byte * (small + out * (2 if site.result_kept else 1)))
             + (_fresh(t, "lax", out) if site.result_kept else 0.0))
    native_s = (g.s0 + g.s_per_row * rows + g.s_per_byte * (small + 2 * out)
                + _fresh(t, "native", out) + _materialized_inputs(t, site, ["src"])
                + (0.0 if site.result_kept else _materialize(t, out)))
    return native_s, lax_s


def scatter_add(site: Site, t: CostTable, ctx: Any, nbatch: int) -> tuple[float, float]:
    """(native, lax) seconds for a scatter-add (a gather's gradient): judged by the
    zero-filled result as well as the cotangent. XLA's scatter neither fuses nor is fused
    away, so producers and consumers cost both sides alike."""
    ct_shape = ctx.avals_in[0].shape
    rows = math.prod(int(d) for d in ct_shape[:nbatch + 1])
    ct, out = site.operands[0].nbytes, site.out_bytes
    est = []
    for impl, c in (("native", t.scatter_add.native), ("lax", t.scatter_add.lax)):
        est.append(c.s0 + c.s_per_row * rows + c.s_per_ct_byte * ct + c.s_per_out_byte * out
                   + _fresh(t, impl, out))
    return est[0], est[1]


def update_rows(site: Site, t: CostTable, ctx: Any, nbatch: int) -> tuple[float, float]:
    """(native, lax) seconds for update_rows' read and write: per index (the lax side sorts
    the ids), and the gradient rows plus the rows of the table and of each table-shaped
    state leaf, each read and written once (about the gradient's bytes per leaf)."""
    avals = ctx.avals_in
    n = max(2, math.prod(int(d) for d in avals[2].shape))  # the index, with its batch
    grads = site.operands[4].nbytes
    leaves = 1 + sum(1 for a in avals[5:] if tuple(a.shape) == tuple(avals[0].shape))
    moved = grads * (1 + 2 * leaves)
    nat, lax = t.update_rows.native, t.update_rows.lax
    return (nat.s0 + nat.s_per_row * n + nat.s_per_byte * moved,
            lax.s0 + lax.s_per_row * n * math.log2(n) + lax.s_per_byte * moved)


# An estimator: (native, lax) seconds at a call site, from its Site, the table, the
# lowering context (the shapes) and the number of leading batch dims.
Estimator = Callable[[Site, CostTable, Any, int], tuple[float, float]]
# One per op, under its OpSpec.op (tests/test_names.py checks that every op has one).
ESTIMATORS: dict[str, Estimator] = {
    _names.SELECT.op: select, _names.GATHER.op: gather, _names.SCATTER_ADD.op: scatter_add,
    _names.UPDATE_ROWS.op: update_rows}


def estimate(spec: _names.OpSpec, site: Site, t: CostTable, ctx: Any,
             params: dict[str, Any]) -> tuple[float, float]:
    """(native, lax) seconds at `site` of the op `spec`."""
    return ESTIMATORS[spec.op](site, t, ctx, int(params.get("nbatch", 0)))


def decide(spec: _names.OpSpec, site: Site, t: CostTable, ctx: Any,
           params: dict[str, Any]) -> Choice:
    """The cheaper side by the estimates, within the table's margin."""
    native, lax = estimate(spec, site, t, ctx, params)
    notes = site.notes()
    if spec is _names.UPDATE_ROWS:  # the step's rows, in a table left where it is
        notes = (f"{site.operands[4].nbytes} bytes of gradient rows into a "
                 f"{site.out_bytes}-byte table")
    elif not spec.lax_fuses:  # what surrounds the call costs both sides alike: the sizes say it
        notes = (f"{site.operands[0].nbytes} {spec.operands[0]} bytes into a "
                 f"{site.out_bytes}-byte zero-filled result")
    return Choice(native < lax * t.structure.native_margin,
                  f"est. native {fmt_s(native)} vs lax {fmt_s(lax)}; {notes}", native, lax,
                  site.key)
