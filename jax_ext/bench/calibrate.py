"""``jax-ext-bench --calibrate [--quick] [--table PATH]``: fits the constants of
implementation "auto"'s cost model (jax_ext/auto/costs.json) on this machine.

Each point of a grid of standalone calls (arguments in, result out) is timed under forced
"native" and forced "lax", alternating call by call, median of the rounds; each op's
terms are then fitted by least squares (no negative constant: a term that comes out
negative is dropped and the rest refitted). The table is written as JSON to ``--table
PATH`` (``--table jax_ext/auto/costs.json`` in a clone replaces the shipped one); without
``--table`` it is printed, with the path of the table it would replace.
``--report PATH`` also writes it as a Markdown table (the docs' fitted table:
``--report docs/_generated/cost_table.md``). ``--quick`` times a smaller grid (for CI:
under two minutes) and still fits every constant. Timings on a loaded machine give a
table of that machine's state.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

import jax_ext
from .._names import ImplementationName
from ..auto import costs
from .records import JaxFn
from .report import machine_info
from .timing import child_env, ready

_F32 = 4
Log = Callable[[str], object]
# Jitted functions by name, each with the implementation it runs under.
Fns = dict[str, tuple[JaxFn, ImplementationName]]
# A timed point: the model's terms (1 for the fixed cost, rows, bytes, ...) and seconds.
Point = tuple[Sequence[float], float]
# The same with the result's bytes, whose fresh mapping is taken off before fitting.
Timed = tuple[Sequence[float], float, int]
# Structural facts and policy are not fitted: kept from the shipped table.
_STRUCTURE = costs.shipped().structure


def _timer(fns: Fns, args: tuple[jax.Array, ...], reps: int, iters: int) -> dict[str, float]:
    """Median seconds per call of each jitted fn (name -> (fn, impl)), alternating."""
    ready(args)
    calls: list[Callable[[], float]] = []
    for fn, impl in fns.values():
        with jax_ext.implementation(impl):
            ready(fn(*args))  # compile under this implementation

        def call(fn: JaxFn = fn, impl: ImplementationName = impl) -> float:
            with jax_ext.implementation(impl):
                t0 = time.perf_counter()
                for _ in range(iters):
                    out = fn(*args)
                ready(out)
                return (time.perf_counter() - t0) / iters
        calls.append(call)
    times: list[list[float]] = [[] for _ in calls]
    for r in range(reps):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            times[k].append(calls[k]())
    return {name: statistics.median(t) for name, t in zip(fns, times)}


def _both(fn: JaxFn) -> Fns:
    f = jax.jit(fn)
    return {"native": (f, "native"), "lax": (f, "lax")}


def _reps(nbytes: int, quick: bool) -> tuple[int, int]:
    """Rounds and calls per timing of an op: one blocking call each, as a standalone
    call runs (several calls in flight hide what a lone one waits for, XLA's wait for its
    thread pool to wake: docs/performance.md, "Calibrating with calls in flight"); more
    rounds for small calls, whose single timings scatter more."""
    return (5 if quick else 11) * (3 if nbytes < (1 << 20) else 1), 1


def _reps_in_flight(nbytes: int, quick: bool) -> tuple[int, int]:
    """For the materializing loop, which runs inside a program between other ops (the
    pool awake): calls back to back, a few ms per timing."""
    return (5 if quick else 11), max(1, min(200, int(2e6 / max(nbytes, 1))))


def _fit(rows: Sequence[Point], names: Sequence[str], log: Log | None = None,
         what: str = "") -> dict[str, float]:
    """Least squares t = X @ c with c >= 0 (negative terms dropped, the rest refitted)."""
    fit = _fit1(rows, names)
    if log is not None:
        err = [abs(sum(fit[n] * x for n, x in zip(names, r[0])) / r[1] - 1) for r in rows]
        log(f"  fit {what}: median error {statistics.median(err):.0%}, worst {max(err):.0%}")
    return fit


def _fit1(rows: Sequence[Point], names: Sequence[str]) -> dict[str, float]:
    """Non-negative least squares on relative errors (small calls weigh as much as big
    ones): no constant of the model can be negative."""
    X = np.array([r[0] for r in rows], np.float64)
    t = np.array([r[1] for r in rows], np.float64)
    scale = X.max(axis=0)  # columns of seconds-per-row and per-byte differ by 1e6
    scale[scale == 0] = 1.0
    c = _nnls(X / scale / t[:, None], np.ones_like(t))
    return {n: float(v / s) for n, v, s in zip(names, c, scale)}


def _nnls(A: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """min |A x - b| subject to x >= 0 (Lawson and Hanson's active set), for the few
    columns of one op's model: numpy alone, no extra dependency."""
    # Unit columns: the optimality test then weighs every column alike, whatever its
    # units (seconds per call, per row, per byte differ by 1e9).
    norms: npt.NDArray[np.float64] = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    A = A / norms
    n = A.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    tol = 1e-12 * max(1.0, float(np.linalg.norm(b)))
    for _ in range(3 * n):
        w = A.T @ (b - A @ x)
        if passive.all() or np.max(w[~passive]) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 0
            x[~passive] = 0.0
        x = z
    return x / norms


def _fresh(table: dict[str, float], impl: str, nbytes: int) -> float:
    """The fresh-mapping cost already fitted (the same rule as the model's)."""
    if nbytes < _STRUCTURE.mmap_threshold_bytes:
        return 0.0
    return table[f"fresh.{impl}.s_per_byte"] * nbytes


@contextlib.contextmanager
def _no_fresh_mappings() -> Iterator[bool]:
    """glibc told to serve every block from its heap and keep it (M_MMAP_MAX 0, a high
    M_TRIM_THRESHOLD), then set back to its defaults; yields False where that is not
    possible (not glibc)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        yield False
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    ok = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))
    try:
        yield ok
    finally:
        mallopt(M_MMAP_MAX, 65536)  # glibc's defaults
        mallopt(M_TRIM_THRESHOLD, 128 * 1024)


def _less_fresh(t: float, table: dict[str, float], impl: str, nbytes: int) -> float:
    """A time less the fresh-mapping cost already fitted, kept at a fifth of the time at
    least (on a noisy machine that estimate can exceed a whole call)."""
    return max(t - _fresh(table, impl, nbytes), 0.2 * t)


def _row_ratios(rng: np.random.Generator, quick: bool, log: Log, s0_native: float,
                s0_lax: float) -> dict[int, float]:
    """XLA's gather loop over the kernel's, per row length: both run the same gather of
    about 4 MiB of f32 rows (random rows of a source 4x that), one blocking call each in
    turn; per pair of neighbouring calls (the machine's drift cancels within a pair) the
    ratio of their times less each side's fixed cost, and the median of those. XLA's loop
    runs over the result's last dim innermost and its code changes in steps with that
    length (docs/performance.md, "One cost per byte for XLA's gather loop"), so the ratio
    is measured at each length of ROW_LENGTHS, not fitted."""
    ratios = {}
    fn = jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))
    rounds = 11 if quick else 31
    for cols in costs.shipped().row_lengths:
        k = min(max((4 << 20) // (cols * _F32), 4096), 131072)
        src = jnp.asarray(rng.standard_normal((4 * k, cols)).astype(np.float32))
        idx = jnp.asarray(rng.integers(0, 4 * k, k).astype(np.int32))
        t = {}
        for impl in ("native", "lax"):
            with jax_ext.implementation(impl):
                c = fn.lower(src, idx).compile()
            ready(c(src, idx))

            def call(c: jax.stages.Compiled = c) -> float:
                t0 = time.perf_counter()
                ready(c(src, idx))
                return time.perf_counter() - t0
            t[impl] = call
        pairs = []
        for r in range(rounds):
            order = ("native", "lax") if r % 2 == 0 else ("lax", "native")
            got = {impl: t[impl]() for impl in order}
            pairs.append(max(got["lax"] - s0_lax, 1e-7) / max(got["native"] - s0_native, 1e-7))
        ratios[cols] = statistics.median(pairs)
        log(f"  gather rows of {cols} elements, n={k}: lax/native {ratios[cols]:.2f} "
            f"[{min(pairs):.2f}-{max(pairs):.2f}]")
    return ratios


def fresh_times(quick: bool) -> dict[str, Any]:
    """The select of a result just above glibc's mmap threshold, timed as is (a fresh
    mapping per call) and with glibc told to reuse its heap; run by _fresh_in_child."""
    rng = np.random.default_rng(1)
    n = (_STRUCTURE.mmap_threshold_bytes + (4 << 20)) // _F32
    c = jnp.asarray(rng.integers(0, 2, n).astype(bool))
    x, y = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    reps = 7 if quick else 15
    t = _timer(_both(jax_ext.where), (c, x, y), reps, 1)
    with _no_fresh_mappings() as ok:
        t_reused = _timer(_both(jax_ext.where), (c, x, y), reps, 1) if ok else None
    return {"n": n, "fresh": t, "reused": t_reused}


def _fresh_in_child(quick: bool) -> tuple[int, dict[str, float], dict[str, float] | None]:
    import json
    import subprocess
    import tempfile
    env = child_env()
    code = ("import json, sys; from jax_ext.bench.calibrate import fresh_times; "
            f"print(json.dumps(fresh_times({bool(quick)})))")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env,
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"calibration: timing the fresh mapping in a child process failed "
                           f"({r.returncode}):\n{r.stderr[-2000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return got["n"], got["fresh"], got["reused"]


class _Fit:
    """The constants fitted so far: dotted path -> value, and -> what it was fitted on."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.about: dict[str, str] = {}

    def set(self, path: str, value: float, about: str) -> None:
        self.values[path], self.about[path] = float(value), about


def _select_points(rng: np.random.Generator, quick: bool,
                   log: Log) -> dict[str, list[tuple[int, int, float]]]:
    """select f32 over a range of sizes: (result bytes, bytes moved, seconds) per side."""
    ks = [6, 8, 12, 16, 20] if quick else [6, 7, 8, 9, 12, 14, 16, 18, 20, 22]
    pts: dict[str, list[tuple[int, int, float]]] = {"native": [], "lax": []}
    for k in ks:
        n = 1 << k
        c = jnp.asarray(rng.integers(0, 2, n).astype(bool))
        x, y = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
        nbytes = n * (1 + 3 * _F32)
        t = _timer(_both(jax_ext.where), (c, x, y), *_reps(nbytes, quick))
        log(f"  select 2^{k}: native {t['native'] * 1e6:.1f} us, lax {t['lax'] * 1e6:.1f} us")
        for impl in pts:
            pts[impl].append((n * _F32, nbytes, t[impl]))
    return pts


def _fit_select(fit: _Fit, rng: np.random.Generator, quick: bool, log: Log) -> None:
    """One thread below pool_min_bytes of result (a fixed cost), the pool above (linear)."""
    pool = _STRUCTURE.pool_min_bytes
    pts = _select_points(rng, quick, log)
    top = max(o for o, _, _ in pts["native"])
    sizes = f"{pool} B - {top >> 10} KiB of result (thread pool)"
    for impl, p in pts.items():
        small = [(b, s) for o, b, s in p if o < pool]
        big = [([1.0, b], s) for o, b, s in p if o >= pool]
        f = _fit(big, ["s0", "s_per_byte"], log, f"select {impl}")
        fit.set(f"select.{impl}.s0", f["s0"], f"{impl} select f32 on arguments, {sizes}")
        fit.set(f"select.{impl}.s_per_byte", f["s_per_byte"],
                f"{impl} select f32 on arguments, {sizes}: per byte read + written")
        fit.set(f"select.{impl}.s0_single",
                max(0.0, statistics.median(s - f["s_per_byte"] * b for b, s in small)),
                f"{impl} select f32, results under {pool} B")


def _fit_materialize(fit: _Fit, rng: np.random.Generator, quick: bool) -> None:
    """One fused XLA loop writing a result (x * 2), as materializing an operand costs."""
    mp: list[Point] = []
    for k in ([12, 16, 20] if quick else [12, 14, 16, 18, 20, 22]):
        x = jnp.asarray(rng.standard_normal(1 << k).astype(np.float32))
        t = _timer({"lax": (jax.jit(lambda x: x * 2), "lax")}, (x,),
                   *_reps_in_flight(8 << k, quick))
        mp.append(([1.0, 2 * (4 << k)], t["lax"]))
    f = _fit(mp, ["s0", "s_per_byte"])
    fit.set("materialize.s0", f["s0"], "x * 2 f32 (one fused loop), 2^12-2^22 elements: "
            "intercept")
    fit.set("materialize.s_per_byte", f["s_per_byte"],
            "x * 2 f32, same sizes: per byte read or written")


# Row gathers (rows, cols, n) on arguments: the kernel's loop is fitted on these, XLA's
# measured against it per row length (_row_ratios); the two tiny shapes pin each side's
# fixed cost, for gathers and gradients alike.
_GATHER_QUICK = [(64, 16, 8), (1024, 64, 64), (16384, 8, 4096), (65536, 64, 16384),
                 (16384, 128, 2048), (4096, 16, 256)]
_GATHER_FULL = [(64, 16, 8), (1024, 64, 64), (16384, 8, 4096), (65536, 64, 16384),
                (65536, 64, 65536), (16384, 128, 2048), (262144, 128, 65536), (4096, 16, 256),
                (1048576, 16, 262144), (65536, 32, 8192), (4096, 8, 4096), (100000, 256, 4096)]
# The gradient also on big tables fed by small cotangents (an embedding table's gradient:
# the zero-filled result dominates), so result and cotangent bytes separate.
_TABLES_QUICK = [(262144, 32, 8192)]
_TABLES_FULL = [(262144, 32, 8192), (1048576, 16, 16384), (131072, 64, 4096)]


def _gather_points(rng: np.random.Generator, quick: bool, log: Log, fresh: bool = True,
                   ) -> tuple[dict[str, list[Timed]], dict[str, list[Timed]], int, int]:
    """Timed gathers (gp) and gradients (sp), per side: (terms, seconds, fresh bytes).
    `fresh`: whether big results were mapped anew (their mapping is then taken off before
    fitting); False when glibc was told to reuse its heap (_no_fresh_mappings)."""
    shapes = _GATHER_QUICK if quick else _GATHER_FULL
    tables = _TABLES_QUICK if quick else _TABLES_FULL
    gather = jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))
    grad = jax.grad(lambda s, i, c: jnp.sum(jax_ext.gather(s, [0], 0, i, align_bytes=None) * c))
    gp: dict[str, list[Timed]] = {"native": [], "lax": []}
    sp: dict[str, list[Timed]] = {"native": [], "lax": []}
    for rows, cols, k in shapes + tables:
        src = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
        idx = jnp.asarray(rng.integers(0, rows, k).astype(np.int32))
        out, tab = k * cols * _F32, rows * cols * _F32
        if (rows, cols, k) in shapes:
            t = _timer(_both(gather), (src, idx), *_reps(2 * out, quick))
            log(f"  gather {rows}x{cols} n={k}: native {t['native'] * 1e6:.1f} us, lax "
                f"{t['lax'] * 1e6:.1f} us")
            for impl in gp:
                gp[impl].append(([1.0, k, 2 * out + 4 * k], t[impl], out if fresh else 0))
        ct = jnp.asarray(rng.standard_normal((k, cols)).astype(np.float32))
        ts = _timer(_both(grad), (src, idx, ct), *_reps(tab + out, quick))
        log(f"  gather gradient {rows}x{cols} n={k}: native {ts['native'] * 1e6:.1f} us, "
            f"lax {ts['lax'] * 1e6:.1f} us")
        for impl in sp:
            sp[impl].append(([1.0, k, out, tab], ts[impl], tab if fresh else 0))
    return gp, sp, len(shapes), len(tables)


def _fit_fresh(fit: _Fit, quick: bool, log: Log) -> None:
    """A result above glibc's mmap threshold is mapped anew on every call; the same
    select timed with glibc told not to map (so it reuses its heap) gives the cost of the
    mapping itself, per result byte. Timed in a process of its own, as the benchmark runs
    each program (in the calibrating process, after the grid, the fresh select read
    slower than in a new one)."""
    n, t, t_reused = _fresh_in_child(quick)
    for impl in ("native", "lax"):
        if t_reused is not None:
            extra, how = t[impl] - t_reused[impl], "the same call on reused heap memory"
        else:  # not glibc: the residual over the linear fit
            extra = t[impl] - (fit.values[f"select.{impl}.s0"]
                               + fit.values[f"select.{impl}.s_per_byte"] * n * 13)
            how = "the linear fit's prediction"
        fit.set(f"fresh.{impl}.s_per_byte", max(0.0, extra / (n * _F32)),
                f"{impl} select of a {n * _F32 >> 20} MiB result (a fresh mapping per call), "
                f"over {how}, per result byte")
        log(f"  select {n * _F32 >> 20} MiB: {impl} {t[impl] * 1e3:.2f} ms fresh"
            + (f", {t_reused[impl] * 1e3:.2f} ms reused" if t_reused else ""))


def _fit_gather(fit: _Fit, gp: dict[str, list[Timed]], nshapes: int, log: Log) -> None:
    """The kernel's loop by least squares; XLA's launch as what its small calls take beyond
    the kernel's loop. Fitted on what is left once the fresh mapping of a big result is
    paid."""
    pts = {impl: [(x, _less_fresh(t, fit.values, impl, b)) for x, t, b in p]
           for impl, p in gp.items()}
    f = _fit(pts["native"], ["s0", "s_per_row", "s_per_byte"], log, "gather native")
    for key, v in f.items():
        fit.set(f"gather.native.{key}", v,
                f"native row gather f32 on arguments, {nshapes} shapes (rows x row bytes)")
    launch = [float(t_l - (t_n - f["s0"]))
              for (x, t_l), (_, t_n) in zip(pts["lax"], pts["native"]) if x[2] <= 300_000]
    fit.set("gather.lax.s0", max(0.0, statistics.median(launch)),
            "lax row gather f32 on arguments, the shapes of under 300 KB moved: time beyond "
            "the kernel's loop")


def _fit_scatter(fit: _Fit, sp: dict[str, list[Timed]], ntables: int, log: Log) -> None:
    for impl, p in sp.items():
        pts = [(x, _less_fresh(t, fit.values, impl, b)) for x, t, b in p]
        f = _fit(pts, ["s0", "s_per_row", "s_per_ct_byte", "s_per_out_byte"], log,
                 f"scatter-add {impl}")
        for key, v in f.items():
            fit.set(f"scatter_add.{impl}.{key}", v,
                    f"{impl}: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and "
                    f"{ntables} big tables with small cotangents")


def _fit_row_ratios(fit: _Fit, rng: np.random.Generator, quick: bool, log: Log) -> None:
    """Last: glibc's thresholds stay fixed once set (mallopt ends its dynamic threshold).
    The loops alone, without glibc trimming and refaulting."""
    with _no_fresh_mappings():
        ratios = _row_ratios(rng, quick, log, fit.values["gather.native.s0"],
                             fit.values["gather.lax.s0"])
    for cols, r in ratios.items():
        fit.set(f"gather.lax.row_ratio.{cols}", r,
                f"lax over native row gather, rows of {cols} f32 elements, about 4 MiB of "
                "result, fixed costs taken off")


class _Sgd:
    """A plain SGD step for update_rows (optax's sgd, which the benchmark does not need)."""

    def init(self, params: jax.Array) -> tuple[()]:
        return ()

    def update(self, g: jax.Array, state: tuple[()], params: jax.Array | None = None
               ) -> tuple[jax.Array, tuple[()]]:
        return -0.01 * g, state


# update_rows: (rows, row length, indices) on one 4 MiB table, in place in a loop of steps.
_UPDATE_QUICK = [(16384, 64, 256), (16384, 64, 4096), (16384, 16, 16384)]
_UPDATE_FULL = _UPDATE_QUICK + [(16384, 64, 1024), (16384, 64, 16384), (16384, 16, 1024),
                                (65536, 16, 65536)]
_STEPS = 64  # steps per timed call: the table's copy into the loop is spread over them


def _fit_update_rows(fit: _Fit, rng: np.random.Generator, quick: bool, log: Log) -> None:
    """update_rows' read and write by least squares, from a loop of SGD steps on one table
    (the step's arithmetic is the same on both sides): per call, per index (times log2 n
    on the lax side, which sorts), per byte of gradient rows (each touched row is read and
    written once)."""
    opt = _Sgd()

    def steps(t: jax.Array, i: jax.Array, g: jax.Array) -> jax.Array:
        body = lambda _, t: jax_ext.update_rows(opt, t, (), [0], 0, i, g)[0]  # noqa: E731
        out: jax.Array = jax.lax.fori_loop(0, _STEPS, body, t)
        return out
    pts: dict[str, list[Point]] = {"native": [], "lax": []}
    for rows, cols, k in (_UPDATE_QUICK if quick else _UPDATE_FULL):
        t = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
        i = jnp.asarray(rng.integers(0, rows, k).astype(np.int32))
        g = jnp.asarray(rng.standard_normal((k, cols)).astype(np.float32))
        tm = _timer(_both(steps), (t, i, g), *_reps(k * cols * _F32 * _STEPS, quick))
        log(f"  update_rows {rows}x{cols} n={k}: native {tm['native'] / _STEPS * 1e6:.1f} "
            f"us, lax {tm['lax'] / _STEPS * 1e6:.1f} us per step")
        grads = k * cols * _F32 * 3  # the gradient rows, the table's rows read and written
        pts["native"].append(([1.0, k, grads], tm["native"] / _STEPS))
        pts["lax"].append(([1.0, k * np.log2(max(k, 2)), grads], tm["lax"] / _STEPS))
    for impl, p in pts.items():
        for key, v in _fit(p, ["s0", "s_per_row", "s_per_byte"], log,
                           f"update_rows {impl}").items():
            fit.set(f"update_rows.{impl}.{key}", v,
                    f"{impl}: a loop of SGD steps of update_rows on a 4 MiB f32 table, "
                    f"{len(p)} shapes (row length x indices)")


def calibrate(quick: bool, machine: str, log: Log = print) -> costs.CostTable:
    """Times this machine and fits every constant of the cost table."""
    rng = np.random.default_rng(0)
    fit = _Fit()
    shipped = costs.shipped()
    for path, v in costs.leaves(shipped):  # not fitted: kept as shipped
        if path.startswith(("structure.", "corrections.")):
            fit.set(path, v, shipped.about[path])
    # The grids run under one memory state for both sides, every result on heap memory the
    # process reuses: which side happened to get a fresh mapping must not end up in a
    # constant. What a fresh mapping costs is fitted apart, in a process of its own.
    with _no_fresh_mappings() as warm:
        _fit_select(fit, rng, quick, log)
        _fit_materialize(fit, rng, quick)
        gp, sp, nshapes, ntables = _gather_points(rng, quick, log, fresh=not warm)
    _fit_fresh(fit, quick, log)
    _fit_gather(fit, gp, nshapes, log)
    _fit_scatter(fit, sp, ntables, log)
    with _no_fresh_mappings():
        _fit_update_rows(fit, rng, quick, log)
    with _no_fresh_mappings():
        _fit_row_ratios(fit, rng, quick, log)
    return costs.from_flat(machine, fit.values, fit.about)  # checks every constant is there


def _unit(path: str, v: float) -> tuple[str, float]:
    if path.endswith("_below"):
        return "elements", v
    if ".row_ratio." in path or path.startswith("corrections."):
        return "x", v
    if "byte" in path.split(".")[-1]:
        return "ns/byte", v * 1e9
    if "per_row" in path:
        return "ns/row", v * 1e9
    return "us", v * 1e6


def markdown(table: costs.CostTable) -> str:
    """The fitted table as Markdown, for the docs (no paths, no dates)."""
    st = table.structure
    lines = [f"Fitted on: {table.machine}.", "",
             f"Structural: XLA's thread pool from {st.pool_min_bytes} bytes of result; "
             f"glibc's mmap threshold {st.mmap_threshold_bytes >> 20} MiB. Policy: the "
             f"kernel runs where estimated below {st.native_margin:g}x the lax path's "
             "time.", "",
             "| constant | value | fitted on |", "|---|---:|---|"]
    for path, v in costs.leaves(table):
        if path.startswith("structure."):
            continue
        unit, shown = _unit(path, v)
        lines.append(f"| `{path}` | {shown:.4g} {unit} | {table.about[path]} |")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")


def main(quick: bool, out: str | None, report: str | None = None) -> int:
    if not jax_ext.native_available():
        print(f"jax-ext-bench --calibrate: the native module is not loaded "
              f"({jax_ext.native_error()}); the kernels cannot be timed.", file=sys.stderr)
        return 2
    meta = machine_info("calibrate")
    # the load average says how far to trust the table (a busy machine fits its own state)
    machine = (f"{meta['cpu']} x{meta['cores']}, jax {meta['jax']}, load average "
               f"{os.getloadavg()[0]:.1f} when fitted")
    print(f"calibrating auto's cost model on {machine}"
          f"{' (--quick grid)' if quick else ''}", flush=True)
    table = calibrate(quick, machine, log=lambda s: print(s, flush=True))
    if out:
        _write(out, costs.dumps(table))
    else:
        print(costs.dumps(table))
        print(f"(not written: --table {costs.PATH} would replace the package's table)")
    if report:
        _write(report, markdown(table))
    return 0
