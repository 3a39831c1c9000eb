"""The main job: jax_ext against the jnp built-ins, side by side, in one process.

    python -m jax_ext.bench [--quick] [--only SUBSTRING] [--json bench.json] [--plot bench.png]

Each case jits both functions, checks they agree, then times them in alternating
rounds (ours, theirs, ours, ...) so machine noise hits both alike, and reports medians
and the ratio theirs/ours (> 1: jax_ext is faster). Writes a JSON file and, when
matplotlib is installed, a plot of throughput against size.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

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
    return dict(name=name, op="select", dtype=np.dtype(dtype).name, elements=size,
                bytes=nbytes, make=make, chain=donate)


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
    cases.append(_select_case("select 8 elements f32", (8,), (8,), (8,), np.float32))
    return cases


def all_cases(quick: bool, devices: int = 0):
    cases = select_cases(quick)
    if devices > 1:
        from . import _bench_sharded
        cases += _bench_sharded.cases(quick, devices)
    try:
        from . import _bench_gather
    except ImportError:
        return cases
    return cases + _bench_gather.cases(quick)


def _run(fn, args, chain):
    if chain:  # donated: feed each output back in as the donated operand
        out = fn(*args)
        out.block_until_ready()
        return (args[0], out) + tuple(args[2:])
    out = fn(*args)
    jax.block_until_ready(out)
    return args


def _sample(fn, args, chain, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        args = _run(fn, args, chain)
    return (time.perf_counter() - t0) / iters, args


def _copy_args(args, chain):
    # Donated operands are consumed: each side needs its own copies.
    return tuple(jnp.array(a, copy=True) for a in args) if chain else args


def measure(case, rounds: int, min_sample_s: float):
    ours, theirs, args = case["make"]()
    a_ours, a_theirs = _copy_args(args, case["chain"]), _copy_args(args, case["chain"])
    # Agreement first (bitwise), then warm-up; donated inputs are consumed, so copy.
    got = np.asarray(ours(*_copy_args(a_ours, case["chain"])))
    want = np.asarray(theirs(*_copy_args(a_theirs, case["chain"])))
    same = got.shape == want.shape and np.array_equal(
        got.view(np.uint8) if got.dtype != object else got, want.view(np.uint8))
    t, a_ours = _sample(ours, a_ours, case["chain"], 1)
    t2, a_theirs = _sample(theirs, a_theirs, case["chain"], 1)
    iters = max(1, int(min_sample_s / max(1e-7, min(t, t2))))
    t_ours, t_theirs = [], []
    for _ in range(rounds):
        t, a_ours = _sample(ours, a_ours, case["chain"], iters)
        t_ours.append(t)
        t, a_theirs = _sample(theirs, a_theirs, case["chain"], iters)
        t_theirs.append(t)
    mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
    return dict(ours_s=mo, ref_s=mt, ratio=mt / mo, gbps=case["bytes"] / mo / 1e9,
                bitwise_equal=bool(same), iters=iters, rounds=rounds)


def _fmt_t(s):
    return f"{s * 1e6:9.1f} us" if s < 1e-3 else f"{s * 1e3:9.3f} ms"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m jax_ext.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds (< 1 min)")
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    p.add_argument("--rounds", type=int, default=None, help="alternating timing rounds")
    p.add_argument("--json", default="bench.json", help="where to write the results")
    p.add_argument("--plot", default="bench.png", help="where to draw the plot (matplotlib)")
    p.add_argument("--devices", type=int, default=0,
                   help="also run the sharded cases (names start with 'shard') on N host "
                        "devices (sets XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    a = p.parse_args(argv)
    if a.devices > 1:  # before anything starts jax's backends
        from . import _bench_sharded
        _bench_sharded.force_host_devices(a.devices, argv)
    rounds = a.rounds or (5 if a.quick else 15)
    min_sample = 0.01 if a.quick else 0.03
    cases = [c for c in all_cases(a.quick, a.devices) if a.only in c["name"]]
    print(f"jax_ext {jax_ext.__version__} | jax {jax.__version__} | native "
          f"{'yes' if jax_ext.native_available() else 'NO (lax fallback)'} | "
          f"{platform.processor() or platform.machine()} x{os.cpu_count()} | {len(cases)} cases, "
          f"{rounds} alternating rounds", flush=True)
    head = f"{'case':<46} {'jax_ext':>12} {'reference':>12} {'ratio':>7} {'GB/s':>7}  exact"
    rows = []
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case['name']} ...", end="", flush=True, file=sys.stderr)
        r = measure(case, rounds, min_sample)
        print(f" {r['ratio']:.2f}x", flush=True, file=sys.stderr)
        rows.append({k: v for k, v in case.items() if k != "make"} | r)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:<46} {_fmt_t(r['ours_s'])} {_fmt_t(r['ref_s'])} "
              f"{r['ratio']:6.2f}x {r['gbps']:7.2f}  {'yes' if r['bitwise_equal'] else 'NO'}")
    meta = dict(date=time.strftime("%Y-%m-%d"), jax=jax.__version__, quick=a.quick,
                machine=platform.machine(), cpus=os.cpu_count(), rounds=rounds,
                native=jax_ext.native_available())
    with open(a.json, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)
    print(f"wrote {a.json}")
    _plot(rows, a.plot)
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


def _plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no plot")
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 0.9 + 0.32 * max(8, len(rows))),
                                 gridspec_kw=dict(width_ratios=[1, 1.3]))
    # Left: throughput against size for the f32 select sweep, both implementations.
    f32 = [r for r in rows if r["name"].startswith("select f32 2^")]
    if f32:
        xs = [r["elements"] for r in f32]
        ax.plot(xs, [r["bytes"] / r["ours_s"] / 1e9 for r in f32], "o-", label="jax_ext.select")
        ax.plot(xs, [r["bytes"] / r["ref_s"] / 1e9 for r in f32], "s--",
                label="jax.jit(jnp.where)")
        ax.set_xscale("log", base=2)
        ax.legend()
    ax.set_xlabel("result elements (float32)")
    ax.set_ylabel("GB/s (bytes read + written / median time)")
    ax.set_title("select throughput against size")
    # Right: the speed ratio of every case (> 1: jax_ext is faster).
    names = [r["name"] for r in rows][::-1]
    ratios = [r["ratio"] for r in rows][::-1]
    bx.barh(names, ratios, color=["tab:green" if v >= 1 else "tab:red" for v in ratios])
    bx.axvline(1.0, color="k", lw=0.8)
    bx.set_xscale("log", base=2)
    bx.set_xlabel("reference time / jax_ext time (log scale)")
    bx.set_title("speed-up over the jnp built-in, per case")
    bx.tick_params(axis="y", labelsize=7)
    for y, v in enumerate(ratios):
        bx.annotate(f"{v:.2f}x", (v, y), xytext=(3, -3), textcoords="offset points", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
