"""The main job: jax_ext against the jnp built-ins, side by side, in one process.

    jax-ext-bench [--quick] [--only SUBSTRING] [--pattern both|reused|fresh]
                  [--impl auto|native|lax] [--json bench.json] [--plot bench.png]

Each case jits both functions, checks they agree bit for bit, then times them call by
call, alternating (ours theirs, theirs ours, ...): machine noise hits both alike, and
neither side runs only after itself (back-to-back calls of one function leave the
machine in a state of their own: threads awake, caches and a freed buffer of the right
size). A round is enough such pairs for 30 ms (10 ms with --quick). Two calling
patterns are timed:

* reused: the same argument arrays every call (a donated operand is fed back from the
  previous result);
* fresh: every call gets arguments made right before it from numpy
  (``jax.device_put`` of a host copy, the way ``jnp.asarray(x_numpy)`` makes them), as
  most user code does. The transfer is waited for before the clock starts, so the
  time is the call's own, including what a fresh buffer costs it (page faults, a copy
  XLA inserts when a donated buffer cannot be reused);
* loop (``--pattern loop``, not in the default run): the same arguments, but each
  side's calls back to back, then the other's, as a loop that calls one op and nothing
  else. Read it as a bound, not as a program: XLA's loops keep its thread pool awake
  from one call to the next there, which no program with other work in between sees.

Per round the ratio theirs/ours of the summed call times is taken (> 1: jax_ext is
faster); a row reports the median ratio and its spread (min-max of the per-round
ratios), the median times, and ``spread``: (max - min) / median of our per-round
times. Gather rows also carry onnxruntime's CPU ``Gather`` (when installed: ``pip
install '.[bench]'``), timed in turn with the two jitted functions, and a
``numpy.copyto`` of the result's bytes into a reused buffer, the copy bandwidth the
machine gives in the same rounds. ``faults`` is the process's page faults per call,
ours/theirs (median over rounds): a result that glibc maps fresh shows up there, on
whichever side it happens. Writes a JSON file and, when matplotlib is installed, a plot.

Besides standalone calls, whole jitted programs (``prog ...`` rows, _bench_programs.py)
are timed, each written twice, identical but for the jax_ext call vs jnp.where /
jnp.take: what a user's program feels. By default jax_ext runs as users get it,
``implementation("auto")``; the ``ran`` column says what ran at each call site (native
or lax; ``jax_ext.explain``). ``--impl native`` / ``--impl lax`` force one everywhere.

Without the compiled module this refuses to run (exit status 2) unless ``--impl lax``
asks for the lax fallback explicitly: lax timings must not pass for the native ones.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import time

try:
    import resource  # page faults per call; Unix only
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

import jax
import jax.numpy as jnp
import numpy as np

import jax_ext


def _select_case(name, n_cond, n_x, n_y, dtype, *, donate=False, rng_seed=0, fn=None):
    """A select case over the broadcast of the three shapes."""
    def make():
        rng = np.random.default_rng(rng_seed)
        c = jnp.asarray(rng.integers(0, 2, n_cond).astype(bool))
        x = jnp.asarray(rng.standard_normal(n_x).astype(np.float32).astype(dtype))
        y = jnp.asarray(rng.standard_normal(n_y).astype(np.float32).astype(dtype))
        ours_f = fn or jax_ext.select
        kw = dict(donate_argnums=1) if donate else {}
        return jax.jit(ours_f, **kw), jax.jit(jnp.where, **kw), (c, x, y)

    out = np.broadcast_shapes(n_cond, n_x, n_y)
    item = np.dtype(dtype).itemsize
    size = int(np.prod(out))
    nbytes = int(np.prod(n_cond)) + item * (int(np.prod(n_x)) + int(np.prod(n_y)) + size)
    # 64-bit dtypes exist in jax only with x64 on; without it jnp.asarray would quietly
    # make float32 arrays, and the row would time (and count the bytes of) the wrong dtype.
    return dict(name=name, op="select", dtype=np.dtype(dtype).name, elements=size,
                bytes=nbytes, make=make, chain=donate, x64=item == 8)


def _donated_sparse_case(n, p_true):
    """In-place select the way a masked update is written: x donated, mostly kept."""
    def make():
        rng = np.random.default_rng(7)
        c = jnp.asarray(rng.random(n) < p_true)
        x = jnp.asarray(rng.standard_normal(n).astype(np.float32))
        y = jnp.asarray(rng.standard_normal(n).astype(np.float32))
        return (jax.jit(jax_ext.select, donate_argnums=1),
                jax.jit(jnp.where, donate_argnums=1), (c, x, y))

    k = n.bit_length() - 1
    return dict(name=f"select donated {int(p_true * 100)}% true f32 2^{k}", op="select",
                dtype="float32", elements=n, bytes=n + 4 * 3 * n, make=make, chain=True)


def select_cases(quick: bool):
    import ml_dtypes
    sizes = [10, 14, 18, 22] if quick else [10, 14, 18, 22, 24]
    cases = [_select_case(f"select f32 2^{k}", (1 << k,), (1 << k,), (1 << k,), np.float32)
             for k in sizes]
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"
    for dt in (ml_dtypes.bfloat16, np.float64, np.int8):
        cases.append(_select_case(f"select {np.dtype(dt).name} {tag}", (big,), (big,), (big,), dt))
    m, k = (1024, 1024) if quick else (4096, 1024)
    cases.append(_select_case(f"select bcast cond({m},1) x({m},{k}) y(1,{k}) f32",
                              (m, 1), (m, k), (1, k), np.float32))
    cases.append(_select_case(f"select donated in place f32 {tag}", (big,), (big,), (big,),
                              np.float32, donate=True))
    cases.append(_donated_sparse_case(big, 0.9))
    cases.append(_select_case("select 8 elements f32", (8,), (8,), (8,), np.float32))
    return cases


def all_cases(quick: bool, devices: int = 0):
    from . import _bench_gather, _bench_programs
    cases = select_cases(quick)
    if devices > 1:
        from . import _bench_sharded
        cases += _bench_sharded.cases(quick, devices)
    return cases + _bench_gather.cases(quick) + _bench_programs.cases(quick)


# ---------------------------------------------------------------------------------------
# timing

def _faults() -> int:
    """Page faults of the whole process so far (every thread: XLA's pool included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def _fresh(host, like):
    """New device arrays made from host copies, placed (and sharded) like `like`, with
    their transfers finished."""
    out = tuple(jax.device_put(np.array(h, copy=True), a.sharding) for h, a in zip(host, like))
    jax.block_until_ready(out)
    return out


def _jax_side(fn, args, pattern, host, like, chain):
    """One timed call of a jitted function per call of the returned closure, which
    returns (seconds, page faults). "fresh": arguments made right before it (untimed);
    otherwise `args`, with a donated operand fed back from the previous result."""
    state = {"args": args}

    def call():
        a = _fresh(host, like) if pattern == "fresh" else state["args"]
        f0 = _faults()
        t0 = time.perf_counter()
        out = fn(*a)
        jax.block_until_ready(out)
        dt = time.perf_counter() - t0
        df = _faults() - f0
        if pattern != "fresh" and chain:  # donated: the output is the next operand
            state["args"] = (a[0], out) + tuple(a[2:])
        return dt, df
    return call


def _host_side(fn, host, pattern):
    """The same for a host function (onnxruntime, numpy) on numpy arrays."""
    def call():
        a = tuple(np.array(h, copy=True) for h in host) if pattern == "fresh" else host
        f0 = _faults()
        t0 = time.perf_counter()
        fn(*a)
        dt = time.perf_counter() - t0
        return dt, _faults() - f0
    return call


def _time_sides(calls, pattern, iters):
    """Mean time and page faults per call of each side over `iters` calls each.
    "reused" and "fresh": call by call, the order of the sides cycling through every
    permutation (ours theirs, theirs ours, ...), so each call follows every other side's
    call as often as its own and none inherits a machine state (awake threads, warm
    caches, a freed buffer of the right size) that only its own previous call leaves.
    "loop": each side's calls back to back, as a loop that calls one op and nothing
    else."""
    totals = [0.0] * len(calls)
    faults = [0] * len(calls)
    if pattern == "loop":
        order = [s for s in range(len(calls)) for _ in range(iters)]
    else:
        perms = list(itertools.permutations(range(len(calls))))
        order = [s for k in range(iters) for s in perms[k % len(perms)]]
    for s in order:
        dt, df = calls[s]()
        totals[s] += dt
        faults[s] += df
    return [t / iters for t in totals], [f / iters for f in faults]


def _copy_args(args):
    # Donated operands are consumed: each side needs its own copies.
    return tuple(jnp.array(a, copy=True) for a in args)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _agree(got, want, exact: bool) -> bool:
    """Standalone cases must agree bit for bit; whole programs within rounding (XLA may
    round the ops around the select/gather differently once their fusions differ)."""
    a, b = jax.tree.leaves(got), jax.tree.leaves(want)
    if exact:
        return len(a) == len(b) and all(_same_bits(x, y) for x, y in zip(a, b))
    return len(a) == len(b) and all(
        np.asarray(x).shape == np.asarray(y).shape and np.allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=2e-2, atol=1e-4,
            equal_nan=True) for x, y in zip(a, b))


def _picked(fn, args) -> str:
    """What ran at each jax_ext call site of `fn` (native or lax), in call order."""
    try:
        return " ".join(f"{d.op}:{d.impl}" for d in jax_ext.explain(fn, *args))
    except Exception as e:  # a report, never a reason to stop the benchmark
        return f"? ({type(e).__name__})"


def _stats(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), q1=q[0], q3=q[2])


def measure(case, rounds: int, min_sample_s: float, patterns=("reused", "fresh")):
    """Times one case in each calling pattern; returns one result dict per pattern."""
    # A case of 64-bit dtypes is made, traced and timed with x64 on (see _select_case).
    with jax.enable_x64(True) if case.get("x64") else contextlib.nullcontext():
        return _measure(case, rounds, min_sample_s, patterns)


def _measure(case, rounds, min_sample_s, patterns):
    ours, theirs, args = case["make"]()
    if case["op"] == "select" and args[1].dtype.name != case["dtype"]:
        raise RuntimeError(f"{case['name']}: made {args[1].dtype} arrays, not {case['dtype']}")
    chain = case["chain"]
    host = tuple(np.asarray(a) for a in args)
    # Agreement first (bitwise); donated inputs are consumed, so copy.
    got = ours(*_copy_args(args))
    same = _agree(got, theirs(*_copy_args(args)), case.get("exact", True))
    picked = _picked(ours, args)
    ort = case["onnx"](host) if case.get("onnx") else None
    ort_same = None
    if ort is not None:
        ort_fn, ort_host, ort_check = ort
        ort_same = bool(ort_check(np.asarray(got), ort_fn(*ort_host)))
    copy = None
    if case.get("copy_bytes"):
        csrc = np.ones(case["copy_bytes"], np.uint8)
        cdst = np.zeros_like(csrc)
        copy = lambda: np.copyto(cdst, csrc)  # noqa: E731
    results = []
    for pattern in patterns:
        # onnxruntime takes its turn among the calls (its threads told not to spin after
        # a run, see _bench_gather); numpy's copy, a bandwidth yardstick, runs apart.
        calls = [_jax_side(ours, _copy_args(args), pattern, host, args, chain),
                 _jax_side(theirs, _copy_args(args), pattern, host, args, chain)]
        if ort is not None:
            calls.append(_host_side(ort_fn, ort_host, pattern))
        # warm-up (compiles), then the sample size: enough calls for min_sample_s
        _time_sides(calls, pattern, 2)
        iters = max(1, int(min_sample_s / max(1e-7, sum(_time_sides(calls, pattern, 2)[0]))))
        t_ours, t_ref, t_ort, t_copy, f_ours, f_ref = [], [], [], [], [], []
        for _ in range(rounds):
            ts, fs = _time_sides(calls, pattern, iters)
            t_ours.append(ts[0])
            t_ref.append(ts[1])
            f_ours.append(fs[0])
            f_ref.append(fs[1])
            if ort is not None:
                t_ort.append(ts[2])
            if copy is not None:
                t_copy.append(_time_sides([_host_side(copy, (), "reused")], "loop", iters)[0][0])
        del calls
        ratio = _stats([r / o for o, r in zip(t_ours, t_ref)])
        mo = statistics.median(t_ours)
        row = dict(pattern=pattern, ours_s=mo, ref_s=statistics.median(t_ref),
                   ratio=ratio["median"], ratio_min=ratio["min"], ratio_max=ratio["max"],
                   ratio_q1=ratio["q1"], ratio_q3=ratio["q3"],
                   spread=(max(t_ours) - min(t_ours)) / mo,
                   gbps=case["bytes"] / mo / 1e9, agrees=bool(same), picked=picked,
                   iters=iters, rounds=rounds, faults=statistics.median(f_ours),
                   ref_faults=statistics.median(f_ref), ort_s=None, ort_ratio=None,
                   ort_ratio_min=None, ort_ratio_max=None, ort_agrees=ort_same,
                   copy_s=None, copy_frac=None)
        if t_ort:
            r = _stats([w / o for o, w in zip(t_ours, t_ort)])
            row.update(ort_s=statistics.median(t_ort), ort_ratio=r["median"],
                       ort_ratio_min=r["min"], ort_ratio_max=r["max"])
        if t_copy:
            # our bandwidth over numpy's copy bandwidth, per round: 1.0 = as fast as a copy
            r = _stats([c / o for o, c in zip(t_ours, t_copy)])
            row.update(copy_s=statistics.median(t_copy), copy_frac=r["median"])
        results.append(row)
    return results


# ---------------------------------------------------------------------------------------
# report

def _fmt_t(s):
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def _fmt_ratio(r, lo, hi):
    return "-" if r is None else f"{r:.2f}x [{lo:.2f}-{hi:.2f}]"


# (header, width, cell(row) -> str). A list, so more columns can be added in one place.
COLUMNS = [
    ("case", -56, lambda r: r["name"]),
    ("calls", -6, lambda r: r["pattern"]),
    ("jax_ext", 11, lambda r: _fmt_t(r["ours_s"])),
    ("spread", 6, lambda r: f"{r['spread'] * 100:.0f}%"),
    ("reference", 11, lambda r: _fmt_t(r["ref_s"])),
    ("ratio [min-max]", 20, lambda r: _fmt_ratio(r["ratio"], r["ratio_min"], r["ratio_max"])),
    ("vs onnxruntime", 20,
     lambda r: _fmt_ratio(r.get("ort_ratio"), r.get("ort_ratio_min"), r.get("ort_ratio_max"))),
    ("of copy", 7, lambda r: "-" if r.get("copy_frac") is None else f"{r['copy_frac'] * 100:.0f}%"),
    ("GB/s", 6, lambda r: f"{r['gbps']:.1f}" if r["gbps"] else "-"),
    ("faults", 11, lambda r: "-" if r.get("faults") is None else
     f"{r['faults']:.0f}/{r['ref_faults']:.0f}"),
    ("agrees", 6, lambda r: ("NO" if not r["agrees"] else
                             "exact" if r.get("exact", True) else "close")),
    ("ran", -28, lambda r: r["picked"]),
]


def format_table(rows, columns=COLUMNS, markdown=False):
    if markdown:
        lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
                 "|" + "|".join("---" if w < 0 else "---:" for _, w, _ in columns) + "|"]
        lines += ["| " + " | ".join(f(r) for _, _, f in columns) + " |" for r in rows]
        return "\n".join(lines)

    def line(cells):
        return "  ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}"
                         for c, (_, w, _) in zip(cells, columns))
    head = line([h for h, _, _ in columns])
    return "\n".join([head, "-" * len(head)] + [line([f(r) for _, _, f in columns]) for r in rows])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(impl: str) -> dict:
    from importlib.metadata import version
    cores: int | None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    try:
        import onnxruntime
        ort = onnxruntime.__version__
    except ImportError:
        ort = None
    return dict(implementation=impl, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpu=_cpu_model(), cores=cores, machine=platform.machine(),
                jax=jax.__version__, jaxlib=version("jaxlib"), numpy=np.__version__,
                onnxruntime=ort, jax_ext=jax_ext.__version__,
                native=jax_ext.native_available(),
                # glibc's allocator settings change what every large result costs (README)
                malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")})


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m jax_ext.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, 7 rounds")
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating timing rounds (at least 3; default 15, --quick 7)")
    p.add_argument("--pattern", choices=("both", "reused", "fresh", "loop"), default="both",
                   help="calling pattern(s) to time (default both: reused and fresh; "
                        "loop: each side's calls back to back)")
    p.add_argument("--impl", choices=("auto", "native", "lax"), default="auto",
                   help="the jax_ext implementation measured: 'auto' (default, what users get: "
                        "native or lax per call site), 'native' forces the kernels everywhere, "
                        "'lax' benchmarks the fallback")
    p.add_argument("--json", default="bench.json", help="where to write the results")
    p.add_argument("--plot", default="bench.png", help="where to draw the plot (matplotlib)")
    p.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    p.add_argument("--devices", type=int, default=0,
                   help="also run the sharded cases (names start with 'shard') on N host "
                        "devices (sets XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    a = p.parse_args(argv)
    if a.impl != "lax" and not jax_ext.native_available():
        why = jax_ext.native_error() or "unknown reason"
        print(f"jax_ext.bench: the native module is not loaded ({why}).\n"
              "This benchmark measures the C++ handlers; without them "
              "every jax_ext call runs the lax fallback, and those timings must not pass for "
              "the native ones.\nFix: build and install the extension (see the README's "
              "'Supported versions and dependencies'), or pass --impl lax to benchmark the "
              "lax fallback on purpose.", file=sys.stderr)
        return 2
    if a.devices > 1:  # before anything starts jax's backends
        from . import _bench_sharded
        _bench_sharded.force_host_devices(a.devices, argv)
    rounds = max(3, a.rounds or (7 if a.quick else 15))
    min_sample = 0.01 if a.quick else 0.03
    patterns = ("reused", "fresh") if a.pattern == "both" else (a.pattern,)
    cases = [c for c in all_cases(a.quick, a.devices) if a.only in c["name"]]
    meta = machine_info(a.impl) | dict(quick=a.quick, rounds=rounds, patterns=list(patterns),
                                       loadavg_start=list(os.getloadavg()))
    native = "native module loaded" if meta["native"] else "NO native module"
    print(f"jax_ext {meta['jax_ext']} | implementation {a.impl} | {native} | {meta['date']} | "
          f"{meta['cpu']} x{meta['cores']} | jax {meta['jax']} jaxlib {meta['jaxlib']} | "
          f"onnxruntime {meta['onnxruntime'] or 'not installed'} | {len(cases)} cases x "
          f"{len(patterns)} patterns, {rounds} alternating rounds | "
          f"load {meta['loadavg_start'][0]:.1f}"
          + "".join(f" | {k}={v}" for k, v in meta["malloc_env"].items()),
          flush=True)
    rows = []
    with jax_ext.implementation(a.impl):
        for i, case in enumerate(cases):
            print(f"[{i + 1}/{len(cases)}] {case['name']} ...", end="", flush=True,
                  file=sys.stderr)
            for r in measure(case, rounds, min_sample, patterns):
                print(f" {r['pattern']} {r['ratio']:.2f}x", end="", flush=True, file=sys.stderr)
                rows.append({k: v for k, v in case.items() if not callable(v)} | r)
            print(file=sys.stderr)
    meta["loadavg_end"] = list(os.getloadavg())
    print(format_table(rows))
    if a.markdown:
        print()
        print(format_table(rows, markdown=True))
    with open(a.json, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)
    print(f"wrote {a.json}")
    _plot(rows, meta, a.plot)
    ok = all(r["agrees"] for r in rows) and all(
        r.get("ort_agrees") is not False for r in rows)
    return 0 if ok else 1


def _plot(rows, meta, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no plot")
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 1.4 + 0.3 * max(8, len(rows))),
                                 gridspec_kw=dict(width_ratios=[1, 1.4]))
    # Left: throughput against size for the f32 select sweep, both implementations.
    for pattern, mark in (("reused", "-"), ("fresh", ":")):
        f32 = [r for r in rows if r["name"].startswith("select f32 2^") and r["pattern"] == pattern]
        if f32:
            xs = [r["elements"] for r in f32]
            ax.plot(xs, [r["bytes"] / r["ours_s"] / 1e9 for r in f32], "o" + mark,
                    label=f"jax_ext.select ({pattern})")
            ax.plot(xs, [r["bytes"] / r["ref_s"] / 1e9 for r in f32], "s" + mark,
                    label=f"jax.jit(jnp.where) ({pattern})")
    if ax.lines:
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    ax.set_xlabel("result elements (float32)")
    ax.set_ylabel("GB/s (bytes read + written / median time)")
    ax.set_title("select throughput against size")
    # Right: the speed ratio of every row with its min-max spread (> 1: jax_ext is faster).
    names = [f"{r['name']} ({r['pattern']}) [{r['picked']}]" for r in rows][::-1]
    ratios = [r["ratio"] for r in rows][::-1]
    err = [[r["ratio"] - r["ratio_min"] for r in rows][::-1],
           [r["ratio_max"] - r["ratio"] for r in rows][::-1]]
    bx.barh(names, ratios, xerr=err, color=["tab:green" if v >= 1 else "tab:red" for v in ratios],
            error_kw=dict(lw=0.7))
    bx.axvline(1.0, color="k", lw=0.8)
    bx.set_xscale("log", base=2)
    bx.set_xlabel("reference time / jax_ext time (log scale; bars: min-max over rounds)")
    bx.set_title("speed-up over the jnp built-in, per case")
    bx.tick_params(axis="y", labelsize=6)
    for y, v in enumerate(ratios):
        bx.annotate(f"{v:.2f}x", (v, y), xytext=(3, -3), textcoords="offset points", fontsize=6)
    fig.suptitle(f"jax_ext {meta['jax_ext']} ({meta['implementation']}) | {meta['date']} | "
                 f"{meta['cpu']} x{meta['cores']} | jax {meta['jax']} jaxlib {meta['jaxlib']}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
