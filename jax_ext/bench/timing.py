"""Timing: each side called in alternation, page faults counted per call, one result row
per calling pattern (the cli module's docstring says why alternate)."""
from __future__ import annotations

import contextlib
import functools
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

import jax_ext

from .._names import ImplementationName
from ..auto.tuning import _faults, faults_differ
from .records import Case, Host, JaxFn, Row

Args = tuple[jax.Array, ...]
# One timed call of a side: (seconds, page faults).
Call = Callable[[], tuple[float, int]]
# A factory of the context a side runs in (a forced implementation, tuning on or off).
Ctx = Callable[[], AbstractContextManager[Any]]


class _Check(TypedDict):
    """What _check finds before timing (see there)."""
    agrees: bool
    picked: str
    ort: tuple[Callable[..., Any], Host] | None
    ort_agrees: bool | None
    copy: Callable[[], object] | None


def ready(tree: object) -> None:
    """Waits for every array of `tree` (jax.block_until_ready)."""
    jax.block_until_ready(tree)  # type: ignore[no-untyped-call]  # unannotated in jax


def _fresh(host: Host, like: Args) -> Args:
    """New device arrays made from host copies, placed (and sharded) like `like`, with
    their transfers finished."""
    out = tuple(jax.device_put(np.array(h, copy=True), a.sharding) for h, a in zip(host, like))
    ready(out)
    return out


def _jax_side(fn: JaxFn, args: Args, pattern: str, host: Host, like: Args, chain: bool,
              ctx: Ctx | None = None) -> Call:
    """One timed call of a jitted function per call of the returned closure, which
    returns (seconds, page faults). "fresh": arguments made right before it (untimed);
    otherwise `args`, with a donated operand fed back from the previous result. `ctx`: a
    factory of the context the call runs in (a forced implementation, the tuning cache on
    or off), entered before the clock starts."""
    state = {"args": args}

    def call() -> tuple[float, int]:
        a = _fresh(host, like) if pattern == "fresh" else state["args"]
        with ctx() if ctx else contextlib.nullcontext():
            f0 = _faults()
            t0 = time.perf_counter()
            out = fn(*a)
            ready(out)
            dt = time.perf_counter() - t0
            df = _faults() - f0
        if pattern != "fresh" and chain:  # donated: the outputs are the next operands
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            state["args"] = (a[0], *outs) + tuple(a[1 + len(outs):])
        return dt, df
    return call


def _host_side(fn: Callable[..., object], host: Host, pattern: str) -> Call:
    """The same for a host function (onnxruntime, numpy) on numpy arrays."""
    def call() -> tuple[float, int]:
        a = tuple(np.array(h, copy=True) for h in host) if pattern == "fresh" else host
        f0 = _faults()
        t0 = time.perf_counter()
        fn(*a)
        dt = time.perf_counter() - t0
        return dt, _faults() - f0
    return call


# The memory states every row is timed under, each set up alike for both sides by glibc's
# environment variables in a process of its own (docs/performance.md, "Where a result's
# memory comes from"). One arena, so that which thread frees a block does not decide where
# the next one comes from. "warm": every block comes from the heap and freed memory is
# kept, so results land on memory the process has touched before; "fresh": the mmap
# threshold fixed at glibc's starting value (never raised by a free), so every block of
# 128 KiB or more is mapped anew and unmapped when freed.
MEMORY_STATES: dict[str, dict[str, str]] = {
    "warm": {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
             "MALLOC_TRIM_THRESHOLD_": str(1 << 33)},
    "fresh": {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
              "MALLOC_TRIM_THRESHOLD_": str(128 << 10)},
}


def child_env() -> dict[str, str]:
    """The environment for measuring in a process of its own: this very jax_ext first on
    PYTHONPATH (the child runs from a temporary directory, not a clone's root, whose
    source folder holds no compiled module)."""
    import os
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(jax_ext.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [pkg_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


@functools.lru_cache(maxsize=None)
def _orders(n: int) -> list[list[int]]:
    """Orders of n sides for the calls of a round: n - 1 rows, each holding every side
    once, such that in the sequence they make (row after row, then round after round,
    cyclically) each side follows each other side exactly once. Calls run back to back
    across rows, so predecessors are what must balance: a Latin square balanced within
    its rows only left, at its row boundaries, one side after another twice, which
    favoured whoever followed whom (docs/performance.md). Found by a small search."""
    perms = list(itertools.permutations(range(n)))

    def extend(rows: list[tuple[int, ...]],
               used: set[tuple[int, int]]) -> list[tuple[int, ...]] | None:
        if len(rows) == max(1, n - 1):
            closing = (rows[-1][-1], rows[0][0])
            return rows if n == 1 or (closing not in used and closing[0] != closing[1]) else None
        for p in perms:
            pairs = [(rows[-1][-1], p[0])] + list(zip(p, p[1:]))
            if len(set(pairs)) == len(pairs) and not used.intersection(pairs) \
                    and pairs[0][0] != pairs[0][1]:
                found = extend(rows + [p], used | set(pairs))
                if found:
                    return found
        return None
    first = tuple(range(n))
    found = extend([first], set(zip(first, first[1:])))
    assert found is not None, f"no balanced orders of {n} sides"
    return [list(r) for r in found]


def _time_sides(calls: Sequence[Call], pattern: str, iters: int,
                start: int = 0) -> tuple[list[float], list[float]]:
    """Mean time and page faults per call of each side over `iters` calls each.
    "reused" and "fresh": call by call, the order of the sides cycling through the rows
    of _orders (ours theirs, theirs ours, ...), so each side runs right after each other
    side equally often, and none inherits a
    machine state (awake threads, warm caches, a freed buffer of the right size) that only
    its own previous call leaves.
    "loop": each side's calls back to back, as a loop that calls one op and nothing
    else."""
    totals = [0.0] * len(calls)
    faults = [0] * len(calls)
    if pattern == "loop":
        order = [s for s in range(len(calls)) for _ in range(iters)]
    else:
        perms = _orders(len(calls))
        # `start`: where in the cycle of orders this call begins, so that rounds of fewer
        # calls than there are orders still go through all of them, round after round
        order = [s for k in range(start, start + iters) for s in perms[k % len(perms)]]
    for s in order:
        dt, df = calls[s]()
        totals[s] += dt
        faults[s] += df
    return [t / iters for t in totals], [f / iters for f in faults]


def _copy_args(args: Args) -> Args:
    # Donated operands are consumed: each side needs its own copies.
    return tuple(jnp.array(a, copy=True) for a in args)


def _same_bits(a: npt.ArrayLike, b: npt.ArrayLike) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _agree(got: Any, want: Any, exact: bool) -> bool:
    """Standalone cases must agree bit for bit; whole programs within rounding (XLA may
    round the ops around the select/gather differently once their fusions differ)."""
    a, b = jax.tree.leaves(got), jax.tree.leaves(want)
    if exact:
        return len(a) == len(b) and all(_same_bits(x, y) for x, y in zip(a, b))
    return len(a) == len(b) and all(
        np.asarray(x).shape == np.asarray(y).shape and np.allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=2e-2, atol=1e-4,
            equal_nan=True) for x, y in zip(a, b))


# The contexts the jax_ext sides run in. The `ours` side (the row's ratio) is auto by its
# cost model alone, so that measured choices (the user's tuning cache, or --tune's) show
# in the tuned column only. The tuning state is part of jit's cache key: each side runs a
# program compiled for it.
def _model() -> AbstractContextManager[None]:
    return jax_ext.tuning(False)


def _tuned() -> AbstractContextManager[None]:
    return jax_ext.tuning(True)


def _forced(impl: ImplementationName) -> Ctx:
    return lambda: jax_ext.implementation(impl)


def _picked(fn: JaxFn, args: Args, ctx: Ctx = _model) -> str:
    """What ran at each jax_ext call site of `fn` (native or lax), in call order, in the
    context `ctx` makes."""
    try:
        with ctx():
            return " ".join(f"{d.op}:{d.impl}" for d in jax_ext.explain(fn, *args))
    except Exception as e:  # a report, never a reason to stop the benchmark
        return f"? ({type(e).__name__})"


def _stats(xs: Sequence[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), q1=q[0], q3=q[2])


def _ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Statistics of the per-round ratios num / den (two sides' times)."""
    return _stats([n / d for n, d in zip(num, den)])


def measure(case: Case, rounds: int, min_sample_s: float,
            patterns: Sequence[str] = ("reused", "fresh"),
            tune_budget_s: float | None = None, memory: str = "process") -> list[Row]:
    """Times one case in each calling pattern; returns one result dict per pattern.
    `tune_budget_s`: first tune a program's call sites (``jax_ext.tune`` with this
    budget), so that its tuned column times measured choices. `memory`: the memory state
    this process was started in (MEMORY_STATES, or "process": whatever it is), recorded in
    the rows; "warm" also warms up until the heap serves every side's results. A case
    with its own ``patterns`` is timed in those; one with a ``measure`` (the overhead
    group's lowering rows) times itself."""
    if "measure" in case:
        return [r | {"memory": memory} for r in case["measure"]()]
    patterns = case.get("patterns", patterns)
    # A case of 64-bit dtypes is made, traced and timed with x64 on (see _select_case).
    with jax.enable_x64(True) if case.get("x64") else contextlib.nullcontext():
        rows = _measure(case, rounds, min_sample_s, patterns, tune_budget_s, memory == "warm")
    return [r | {"memory": memory} for r in rows]


def _measure(case: Case, rounds: int, min_sample_s: float, patterns: Sequence[str],
             tune_budget_s: float | None, settle: bool) -> list[Row]:
    ours, theirs, args = case["make"]()
    if case["op"] == "select" and args[1].dtype.name != case["dtype"]:
        raise RuntimeError(f"{case['name']}: made {args[1].dtype} arrays, not {case['dtype']}")
    host = tuple(np.asarray(a) for a in args)
    tuned: dict[str, object] = {}
    if case.get("impls"):  # programs: tuned (when asked) before anything is compiled
        tuned = dict(tune_s=None, tune_changes=None)
        if tune_budget_s is not None and case["op"] == "program":  # not eager calls
            tuned = _tune(ours, args, tune_budget_s, patterns)
        tuned["tuned_picked"] = _picked(ours, args, _tuned)
    check = _check(case, ours, theirs, args, host)
    if case.get("device_memory"):
        tuned.update(temp_mib=_temp_mib(ours, args), ref_temp_mib=_temp_mib(theirs, args))
    rows = []
    for pattern in patterns:
        sides = _sides(case, ours, theirs, args, host, pattern, check["ort"])
        times, faults, copies, iters = _sample(sides, pattern, rounds, min_sample_s,
                                               check["copy"], settle)
        del sides  # their last results, before the next pattern's calls
        rows.append(_row(case, pattern, times, faults, copies, iters, check) | tuned)
    return rows


def _tune(ours: JaxFn, args: Args, budget_s: float, patterns: Sequence[str]) -> Row:
    """--tune: measured choices for the program's call sites, stored in the tuning cache;
    how long that took and which sites moved from the model's choice."""
    both = {"reused", "fresh"} <= set(patterns)
    pattern = "both" if both else "fresh" if "fresh" in patterns else "reused"
    t0 = time.perf_counter()
    report = jax_ext.tune(ours, *args, budget_s=budget_s, pattern=pattern)
    changes = [f"{r.op}{'' if r.where == '?' else ' at ' + r.where}: {r.model_impl} -> "
               f"{r.impl}" for r in report.sites if r.impl != r.model_impl]
    return dict(tune_s=time.perf_counter() - t0, tune_changes=changes)


def _check(case: Case, ours: JaxFn, theirs: JaxFn, args: Args, host: Host) -> _Check:
    """Before timing: whether the two sides agree (standalone calls bit for bit, programs
    within rounding), what ran at each call site, onnxruntime's Gather and its agreement
    where the case has one, and numpy's copy of the result's bytes where it has that."""
    with _model():  # donated inputs are consumed, so copies
        got = ours(*_copy_args(args))
    out = _Check(agrees=bool(_agree(got, theirs(*_copy_args(args)), case.get("exact", True))),
                 picked=_picked(ours, args), ort=None, ort_agrees=None, copy=None)
    ort = case["onnx"](host) if case.get("onnx") else None
    if ort is not None:
        fn, ort_host, same = ort
        out.update({"ort": (fn, ort_host),
                    "ort_agrees": bool(same(np.asarray(got), fn(*ort_host)))})
    if case.get("copy_bytes"):
        src = np.ones(case["copy_bytes"], np.uint8)
        dst = np.zeros_like(src)
        out["copy"] = lambda: np.copyto(dst, src)
    return out


def _sides(case: Case, ours: JaxFn, theirs: JaxFn, args: Args, host: Host, pattern: str,
           ort: tuple[Callable[..., Any], Host] | None) -> dict[str, Call]:
    """The calls timed in alternation, by name: ours (auto by its cost model), the jnp
    reference, onnxruntime where the case has it, and for programs the same program under
    forced native, forced lax and auto with the tuning cache, so that auto can be judged
    against the better of the two and against measured choices."""
    chain = case["chain"]

    def jax_side(fn: JaxFn, ctx: Ctx | None) -> Call:
        # Every side reads the very same argument buffers, unless one is donated (then
        # each side needs copies of its own): copies differ in where they live (huge or
        # 4 KiB pages), and that alone moves a side's time (docs/performance.md).
        own = _copy_args(args) if chain else args
        return _jax_side(fn, own, pattern, host, args, chain, ctx)
    sides = {"ours": jax_side(ours, _model), "ref": jax_side(theirs, None)}
    if ort is not None:  # its threads told not to spin after a run (see gather.py)
        sides["ort"] = _host_side(ort[0], ort[1], pattern)
    if case.get("impls"):
        sides.update(native=jax_side(ours, _forced("native")),
                     lax=jax_side(ours, _forced("lax")), tuned=jax_side(ours, _tuned))
    return sides


def _sample(sides: dict[str, Call], pattern: str, rounds: int, min_sample_s: float,
            copy: Callable[[], object] | None, settle: bool = False,
            ) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float], int]:
    """Per side, its mean seconds and page faults per call in each round, numpy's copy
    time per round (timed apart: a bandwidth yardstick, not a side), and the calls per
    round. `settle`: after the warm-up, more calls until no side faults in three rounds
    in a row (at most 32 each): a heap that keeps its freed memory still grows for a few
    calls before it holds every side's results (docs/performance.md)."""
    calls = list(sides.values())
    _time_sides(calls, pattern, 2)  # warm-up (compiles)
    quiet = 0
    for _ in range(32 if settle else 0):
        quiet = quiet + 1 if max(_time_sides(calls, pattern, 1)[1]) < 16 else 0
        if quiet == 3:
            break
    # the sample size: enough calls for min_sample_s
    iters = max(1, int(min_sample_s / max(1e-7, sum(_time_sides(calls, pattern, 2)[0]))))
    times: dict[str, list[float]] = {k: [] for k in sides}
    faults: dict[str, list[float]] = {k: [] for k in sides}
    copies: list[float] = []
    for r in range(rounds):
        ts, fs = _time_sides(calls, pattern, iters, start=r * iters)
        for k, t, f in zip(sides, ts, fs):
            times[k].append(t)
            faults[k].append(f)
        if copy is not None:
            copies.append(_time_sides([_host_side(copy, (), "reused")], "loop", iters)[0][0])
    return times, faults, copies, iters


def _temp_mib(f: Callable[..., Any], args: Sequence[Any]) -> float:
    """The per-device temp memory of jitted `f`'s compiled program, MiB."""
    stats = f.lower(*args).compile().memory_analysis()  # type: ignore[attr-defined]
    return float(stats.temp_size_in_bytes) / 2 ** 20


def _row(case: Case, pattern: str, times: dict[str, list[float]],
         faults: dict[str, list[float]], copies: list[float], iters: int,
         check: _Check) -> Row:
    """One pattern's result row: medians and ratios over the rounds (the package
    docstring defines each field)."""
    t_ours, t_ref = times["ours"], times["ref"]
    ratio = _ratio(t_ref, t_ours)
    mo = statistics.median(t_ours)
    row: Row = dict(pattern=pattern, ours_s=mo, ref_s=statistics.median(t_ref),
                    ratio=ratio["median"], ratio_min=ratio["min"], ratio_max=ratio["max"],
                    ratio_q1=ratio["q1"], ratio_q3=ratio["q3"],
                    spread=(max(t_ours) - min(t_ours)) / mo,
                    gbps=case["bytes"] / mo / 1e9, agrees=check["agrees"], picked=check["picked"],
                    iters=iters, rounds=len(t_ours), faults=statistics.median(faults["ours"]),
                    ref_faults=statistics.median(faults["ref"]),
                    faults_differ=faults_differ(statistics.median(faults["ours"]),
                                                statistics.median(faults["ref"])),
                    ort_s=None, ort_ratio=None,
                    ort_ratio_min=None, ort_ratio_max=None, ort_agrees=check["ort_agrees"],
                    copy_s=None, copy_frac=None)
    if "ort" in times:
        r = _ratio(times["ort"], t_ours)
        row.update(ort_s=statistics.median(times["ort"]), ort_ratio=r["median"],
                   ort_ratio_min=r["min"], ort_ratio_max=r["max"])
    if copies:
        # our bandwidth over numpy's copy bandwidth, per round: 1.0 = as fast as a copy
        row.update(copy_s=statistics.median(copies), copy_frac=_ratio(copies, t_ours)["median"])
    for side in ("native", "lax", "tuned"):
        if side in times:
            row[f"{side}_ratio"] = _ratio(t_ref, times[side])["median"]
            row[f"{side}_s"] = statistics.median(times[side])
    return row
