"""``jax-ext-bench --calibrate [--quick] [--table PATH]``: fits the constants of
implementation "auto"'s cost model (jax_ext/_cost_table.py) on this machine.

Each point of a grid of standalone calls (arguments in, result out) is timed under forced
"native" and forced "lax", alternating call by call, median of the rounds; each op's
terms are then fitted by least squares (no negative constant: a term that comes out
negative is dropped and the rest refitted). The table is written as a Python module to
``--table PATH`` (``--table jax_ext/_cost_table.py`` in a clone replaces the shipped
one); without ``--table`` it is printed, with the path of the table it would replace.
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
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_ext
from .. import _cost_table
from .report import machine_info
from .timing import child_env

_F32 = 4


def _timer(fns, args, reps, iters):
    """Median seconds per call of each jitted fn (name -> (fn, impl)), alternating."""
    jax.block_until_ready(args)
    calls = []
    for fn, impl in fns.values():
        with jax_ext.implementation(impl):
            jax.block_until_ready(fn(*args))  # compile under this implementation

        def call(fn=fn, impl=impl):
            with jax_ext.implementation(impl):
                t0 = time.perf_counter()
                for _ in range(iters):
                    out = fn(*args)
                jax.block_until_ready(out)
                return (time.perf_counter() - t0) / iters
        calls.append(call)
    times: list[list[float]] = [[] for _ in calls]
    for r in range(reps):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            times[k].append(calls[k]())
    return {name: statistics.median(t) for name, t in zip(fns, times)}


def _both(fn):
    f = jax.jit(fn)
    return {"native": (f, "native"), "lax": (f, "lax")}


def _reps(nbytes, quick):
    """Rounds and calls per timing of an op: one blocking call each, as a standalone
    call runs (several calls in flight hide what a lone one waits for: a 4096-row
    gather took XLA 92 us called alone and 17 us seven at a time, the kernel 26 and 18,
    the difference being XLA's wait for its thread pool to wake); more rounds for small
    calls, whose single timings scatter more."""
    return (5 if quick else 11) * (3 if nbytes < (1 << 20) else 1), 1


def _reps_in_flight(nbytes, quick):
    """For the materializing loop, which runs inside a program between other ops (the
    pool awake): calls back to back, a few ms per timing."""
    return (5 if quick else 11), max(1, min(200, int(2e6 / max(nbytes, 1))))


def _fit(rows, names, log=None, what=""):
    """Least squares t = X @ c with c >= 0 (negative terms dropped, the rest refitted)."""
    fit = _fit1(rows, names)
    if log is not None:
        err = [abs(sum(fit[n] * x for n, x in zip(names, r[0])) / r[1] - 1) for r in rows]
        log(f"  fit {what}: median error {statistics.median(err):.0%}, worst {max(err):.0%}")
    return fit


def _fit1(rows, names):
    """Non-negative least squares on relative errors (small calls weigh as much as big
    ones): no constant of the model can be negative."""
    X = np.array([r[0] for r in rows], np.float64)
    t = np.array([r[1] for r in rows], np.float64)
    scale = X.max(axis=0)  # columns of seconds-per-row and per-byte differ by 1e6
    scale[scale == 0] = 1.0
    c = _nnls(X / scale / t[:, None], np.ones_like(t))
    return {n: float(v / s) for n, v, s in zip(names, c, scale)}


def _nnls(A, b):
    """min |A x - b| subject to x >= 0 (Lawson and Hanson's active set), for the few
    columns of one op's model: numpy alone, no extra dependency."""
    # Unit columns: the optimality test then weighs every column alike, whatever its
    # units (seconds per call, per row, per byte differ by 1e9).
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    A = A / norms
    n = A.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    tol = 1e-12 * max(1.0, float(np.linalg.norm(b)))
    for _ in range(3 * n):
        w = A.T @ (b - A @ x)
        if passive.all() or w[~passive].max() <= tol:
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


def _fresh(table, impl, nbytes):
    """The fresh-mapping cost already fitted (the same rule as _auto._fresh)."""
    if nbytes < _cost_table.MMAP_THRESHOLD_BYTES:
        return 0.0
    return table[f"fresh.{impl}.s_per_byte"] * nbytes


@contextlib.contextmanager
def _no_fresh_mappings():
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


def _less_fresh(t, table, impl, nbytes):
    """A time less the fresh-mapping cost already fitted, kept at a fifth of the time at
    least (on a noisy machine that estimate can exceed a whole call)."""
    return max(t - _fresh(table, impl, nbytes), 0.2 * t)


def _row_ratios(rng, quick, log, s0_native, s0_lax) -> dict[int, float]:
    """XLA's gather loop over the kernel's, per row length: both run the same gather of
    about 4 MiB of f32 rows (random rows of a source 4x that), one blocking call each in
    turn; per pair of neighbouring calls (the machine's drift cancels within a pair) the
    ratio of their times less each side's fixed cost, and the median of those. XLA's loop
    runs over the result's last dim innermost and its code changes in steps with that
    length (f32 rows of 74 elements and of 75 differ by 2.5x here), so the ratio is
    measured at each length of ROW_LENGTHS, not fitted."""
    ratios = {}
    fn = jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))
    rounds = 11 if quick else 31
    for cols in _cost_table.ROW_LENGTHS:
        k = min(max((4 << 20) // (cols * _F32), 4096), 131072)
        src = jnp.asarray(rng.standard_normal((4 * k, cols)).astype(np.float32))
        idx = jnp.asarray(rng.integers(0, 4 * k, k).astype(np.int32))
        t = {}
        for impl in ("native", "lax"):
            with jax_ext.implementation(impl):
                c = fn.lower(src, idx).compile()
            jax.block_until_ready(c(src, idx))

            def call(c=c):
                t0 = time.perf_counter()
                jax.block_until_ready(c(src, idx))
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


def fresh_times(quick: bool) -> dict:
    """The select of a result just above glibc's mmap threshold, timed as is (a fresh
    mapping per call) and with glibc told to reuse its heap; run by _fresh_in_child."""
    rng = np.random.default_rng(1)
    n = (_cost_table.MMAP_THRESHOLD_BYTES + (4 << 20)) // _F32
    c = jnp.asarray(rng.integers(0, 2, n).astype(bool))
    x, y = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    reps = 7 if quick else 15
    t = _timer(_both(jax_ext.where), (c, x, y), reps, 1)
    with _no_fresh_mappings() as ok:
        t_reused = _timer(_both(jax_ext.where), (c, x, y), reps, 1) if ok else None
    return {"n": n, "fresh": t, "reused": t_reused}


def _fresh_in_child(quick: bool):
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


def calibrate(quick: bool, log=print) -> tuple[dict[str, float], dict[str, str]]:
    rng = np.random.default_rng(0)
    table: dict[str, float] = {}
    notes: dict[str, str] = {}
    pool = _cost_table.POOL_MIN_BYTES

    # select f32: one thread below POOL_MIN_BYTES of result, the pool above
    ks = [6, 8, 12, 16, 20] if quick else [6, 7, 8, 9, 12, 14, 16, 18, 20, 22]
    pts: dict[str, list] = {"native": [], "lax": []}
    for k in ks:
        n = 1 << k
        c = jnp.asarray(rng.integers(0, 2, n).astype(bool))
        x, y = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
        nbytes = n * (1 + 3 * _F32)
        t = _timer(_both(jax_ext.where), (c, x, y), *_reps(nbytes, quick))
        log(f"  select 2^{k}: native {t['native'] * 1e6:.1f} us, lax {t['lax'] * 1e6:.1f} us")
        for impl in pts:
            pts[impl].append((n * _F32, nbytes, t[impl]))
    for impl, p in pts.items():
        small = [(b, s) for o, b, s in p if o < pool]
        big = [([1.0, b], s) for o, b, s in p if o >= pool]
        fit = _fit(big, ["s0", "s_per_byte"], log, f"select {impl}")
        table[f"select.{impl}.s0"] = fit["s0"]
        table[f"select.{impl}.s_per_byte"] = fit["s_per_byte"]
        table[f"select.{impl}.s0_single"] = max(0.0, statistics.median(
            s - fit["s_per_byte"] * b for b, s in small))
        notes[f"select.{impl}.s0_single"] = f"{impl} select f32, results under {pool} B"
        sizes = f"{pool} B - {(4 << ks[-1]) >> 10} KiB of result (thread pool)"
        notes[f"select.{impl}.s0"] = f"{impl} select f32 on arguments, {sizes}"
        notes[f"select.{impl}.s_per_byte"] = (f"{impl} select f32 on arguments, {sizes}: "
                                              "per byte read + written")

    # materializing: one fused XLA loop writing a result (x * 2)
    mp = []
    for k in ([12, 16, 20] if quick else [12, 14, 16, 18, 20, 22]):
        x = jnp.asarray(rng.standard_normal(1 << k).astype(np.float32))
        t = _timer({"lax": (jax.jit(lambda x: x * 2), "lax")}, (x,),
                   *_reps_in_flight(8 << k, quick))
        mp.append(([1.0, 2 * (4 << k)], t["lax"]))
    fit = _fit(mp, ["s0", "s_per_byte"])
    table["materialize.s0"], table["materialize.s_per_byte"] = fit["s0"], fit["s_per_byte"]
    notes["materialize.s0"] = "x * 2 f32 (one fused loop), 2^12-2^22 elements: intercept"
    notes["materialize.s_per_byte"] = "x * 2 f32, same sizes: per byte read or written"

    # row gather on arguments: the kernel's loop fitted on rows x row length, XLA's
    # measured against it per row length (last, below); the two tiny shapes pin each
    # side's fixed cost, for gathers and gradients alike
    shapes = ([(64, 16, 8), (1024, 64, 64), (16384, 8, 4096), (65536, 64, 16384),
               (16384, 128, 2048), (4096, 16, 256)]
              if quick else [(64, 16, 8), (1024, 64, 64)] +
              [(16384, 8, 4096), (65536, 64, 16384), (65536, 64, 65536), (16384, 128, 2048),
               (262144, 128, 65536), (4096, 16, 256), (1048576, 16, 262144),
               (65536, 32, 8192), (4096, 8, 4096), (100000, 256, 4096)])
    # the gradient also on big tables fed by small cotangents (an embedding table's
    # gradient: the zero-filled result dominates), so result and cotangent bytes separate
    tables = [(262144, 32, 8192)] if quick else [(262144, 32, 8192), (1048576, 16, 16384),
                                                 (131072, 64, 4096)]
    gp: dict[str, list] = {"native": [], "lax": []}
    sp: dict[str, list] = {"native": [], "lax": []}
    for rows, cols, k in shapes + tables:
        src = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
        idx = jnp.asarray(rng.integers(0, rows, k).astype(np.int32))
        out = k * cols * _F32
        t = None
        if (rows, cols, k) in shapes:
            t = _timer(_both(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None)),
                       (src, idx), *_reps(2 * out, quick))
            log(f"  gather {rows}x{cols} n={k}: native {t['native'] * 1e6:.1f} us, lax "
                f"{t['lax'] * 1e6:.1f} us")
        ct = jnp.asarray(rng.standard_normal((k, cols)).astype(np.float32))
        g = jax.grad(lambda s, i, c: jnp.sum(jax_ext.gather(s, [0], 0, i, align_bytes=None) * c))
        ts = _timer(_both(g), (src, idx, ct), *_reps(rows * cols * _F32 + out, quick))
        log(f"  gather gradient {rows}x{cols} n={k}: native {ts['native'] * 1e6:.1f} us, "
            f"lax {ts['lax'] * 1e6:.1f} us")
        for impl in gp:
            if t is not None:
                gp[impl].append(([1.0, k, 2 * out + 4 * k], t[impl], out))
            tab = rows * cols * _F32
            sp[impl].append(([1.0, k, out, tab], ts[impl], tab))
    # fresh mapping: a result above glibc's mmap threshold is mapped anew on every call;
    # the same select timed with glibc told not to map (so it reuses its heap) gives the
    # cost of the mapping itself, per result byte. Timed in a process of its own, as the
    # benchmark runs each program: in this one, after the grid above, the kernel's fresh
    # select read 10.0 ms against 8.6 in a new process (XLA's 10.2 and 9.9).
    n, t, t_reused = _fresh_in_child(quick)
    for impl in ("native", "lax"):
        if t_reused is not None:
            extra, how = t[impl] - t_reused[impl], "the same call on reused heap memory"
        else:  # not glibc: the residual over the linear fit
            extra = t[impl] - (table[f"select.{impl}.s0"]
                               + table[f"select.{impl}.s_per_byte"] * n * 13)
            how = "the linear fit's prediction"
        table[f"fresh.{impl}.s_per_byte"] = max(0.0, extra / (n * _F32))
        notes[f"fresh.{impl}.s_per_byte"] = (
            f"{impl} select of a {n * _F32 >> 20} MiB result (a fresh mapping per call), "
            f"over {how}, per result byte")
        log(f"  select {n * _F32 >> 20} MiB: {impl} {t[impl] * 1e3:.2f} ms fresh"
            + (f", {t_reused[impl] * 1e3:.2f} ms reused" if t_reused else ""))

    # fitted on what is left once the fresh mapping of a big result is paid
    gp = {impl: [(x, _less_fresh(t, table, impl, b)) for x, t, b in p]
          for impl, p in gp.items()}
    fit = _fit(gp["native"], ["s0", "s_per_row", "s_per_byte"], log,
               "gather native")
    for key, v in fit.items():
        table[f"gather.native.{key}"] = v
        notes[f"gather.native.{key}"] = (f"native row gather f32 on arguments, "
                                         f"{len(shapes)} shapes (rows x row bytes)")
    # XLA's launch: what its small calls take beyond the kernel's loop
    launch = [float(t_l - (t_n - fit["s0"]))
              for (x, t_l), (_, t_n) in zip(gp["lax"], gp["native"]) if x[2] <= 300_000]
    table["gather.lax.s0"] = max(0.0, statistics.median(launch))
    notes["gather.lax.s0"] = ("lax row gather f32 on arguments, the shapes of under 300 KB "
                              "moved: time beyond the kernel's loop")
    for impl in sp:
        sp[impl] = [(x, _less_fresh(t, table, impl, b)) for x, t, b in sp[impl]]
        fit = _fit(sp[impl], ["s0", "s_per_row", "s_per_ct_byte", "s_per_out_byte"], log,
                   f"scatter-add {impl}")
        for key, v in fit.items():
            table[f"scatter_add.{impl}.{key}"] = v
            notes[f"scatter_add.{impl}.{key}"] = (
                f"{impl}: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and "
                f"{len(tables)} big tables with small cotangents")

    # last: glibc's thresholds stay fixed once set (mallopt ends its dynamic threshold)
    with _no_fresh_mappings():  # the loops alone, without glibc trimming and refaulting
        ratios = _row_ratios(rng, quick, log, table["gather.native.s0"], table["gather.lax.s0"])
    for cols, r in ratios.items():
        table[f"gather.lax.row_ratio.{cols}"] = r
        notes[f"gather.lax.row_ratio.{cols}"] = (
            f"lax over native row gather, rows of {cols} f32 elements, about 4 MiB of result, "
            "fixed costs taken off")
    missing = set(_cost_table.TABLE) - set(table)
    if missing:
        raise RuntimeError(f"calibration left out {sorted(missing)}")
    return table, notes


def render(table, notes, machine: str) -> str:
    """The table as the Python module jax_ext/_cost_table.py (its docstring kept)."""
    head = _cost_table.__doc__ or ""
    lines = [f'"""{head}"""', "from __future__ import annotations", "",
             f"MACHINE = {machine!r}", "",
             "# Structural, not fitted: XLA:CPU splits a loop over its thread pool from about "
             "this",
             "# many result bytes (below, one thread: the \"single\" regime), and glibc maps "
             "a block of",
             "# at least its dynamic mmap threshold's ceiling (32 MiB on 64-bit) fresh on "
             "every call.",
             f"POOL_MIN_BYTES = {_cost_table.POOL_MIN_BYTES}",
             f"MMAP_THRESHOLD_BYTES = {_cost_table.MMAP_THRESHOLD_BYTES >> 20} << 20",
             "# The row lengths (elements of the result's last dim) at which XLA's gather loop",
             "# is timed against the kernel's (gather.lax.row_ratio.*).",
             f"ROW_LENGTHS = {tuple(_cost_table.ROW_LENGTHS)!r}",
             "# Policy, not fitted: the kernel runs only where estimated this much cheaper; "
             "within",
             "# the fit's noise the lax path (which fuses like the jnp code) is kept.",
             f"NATIVE_MARGIN = {_cost_table.NATIVE_MARGIN}", "",
             "TABLE: dict[str, float] = {"]
    for k in _cost_table.TABLE:  # each constant under a comment saying what it was fitted on
        lines += [f"    # {ln}" for ln in textwrap.wrap(notes[k], 92)]
        lines.append(f"    {k!r}: {table[k]:.3e},")
    lines += ["}", "", "# The same, for code and tests.", "FITTED_ON: dict[str, str] = {"]
    for k in _cost_table.TABLE:
        parts = textwrap.wrap(notes[k], 80, drop_whitespace=False)
        lines.append(f"    {k!r}:")
        lines += [f"        {p!r}" for p in parts[:-1]] + [f"        {parts[-1]!r},"]
    lines += ["}", ""]
    return "\n".join(lines)


def markdown(table, notes, machine: str) -> str:
    """The fitted table as Markdown, for the docs (no paths, no dates)."""
    lines = [f"Fitted on: {machine}.", "",
             f"Structural: XLA's thread pool from {_cost_table.POOL_MIN_BYTES} bytes of result; "
             f"glibc's mmap threshold {_cost_table.MMAP_THRESHOLD_BYTES >> 20} MiB. Policy: the "
             f"kernel runs where estimated below {_cost_table.NATIVE_MARGIN:g}x the lax path's "
             "time.", "",
             "| constant | value | fitted on |", "|---|---:|---|"]
    for k in _cost_table.TABLE:
        v = table[k]
        unit = ("x", v) if ".row_ratio." in k else (
            ("ns/byte", v * 1e9) if "per_byte" in k or "byte" in k.split(".")[-1] else (
                ("ns/row", v * 1e9) if "per_row" in k else ("us", v * 1e6)))
        lines.append(f"| `{k}` | {unit[1]:.4g} {unit[0]} | {notes[k]} |")
    return "\n".join(lines) + "\n"


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
          f"{' (--quick grid)' if quick else ''}, load {os.getloadavg()[0]:.1f}", flush=True)
    table, notes = calibrate(quick, log=lambda s: print(s, flush=True))
    text = render(table, notes, machine)
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out} ({len(table)} constants)")
    else:
        print(text)
        print(f"(not written: --table {_cost_table.__file__} would replace the package's "
              "table)")
    if report:
        d = os.path.dirname(report)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(report, "w") as f:
            f.write(markdown(table, notes, machine))
        print(f"wrote {report}")
    return 0
