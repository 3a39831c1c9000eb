"""The main job: jax_ext against the jnp built-ins, side by side, in one process.

    jax-ext-bench [--full] [--quick] [--only SUBSTRING] [--pattern both|reused|fresh]
                  [--memory both|warm|fresh|process]
                  [--impl auto|native|lax] [--tune [--tune-budget S]] [--sites N1,N2]
                  [--json bench.json] [--plot bench.png] [--report benchmark.md]
    jax-ext-bench --only overhead [--report PATH]
    jax-ext-bench --calibrate [--quick] [--table PATH] [--report PATH]

Two runs: the default, a selection of the cases (a few of each group: single selects and
gathers, element-wise and sparse programs, the overhead group), two to five minutes on two
cores; and ``--full``, every case, about ten. Both time a row alike (the same sizes,
rounds and memory states): the default has fewer rows, not cheaper ones, except that its
overhead group compiles programs of fewer call sites. ``--only`` picks among every case.

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

Besides standalone calls, whole jitted programs (``prog ...`` rows) are timed, each
written twice, identical but for the jax_ext call vs jnp.where / jnp.take: what a user's
program feels. By default jax_ext runs as users get it, ``implementation("auto")``; the
``ran`` column says what ran at each call site (native or lax; ``jax_ext.explain``).
Program rows also time the same program under forced native and forced lax in the same
alternation (the ``native`` and ``lax`` columns: jnp time / that time), so auto can be
judged against the better of the two, and under auto with the tuning cache consulted (the
``tuned`` column; ``jax_ext.tuning(True)``), while the row's own ratio is auto by its
cost model alone (``jax_ext.tuning(False)``). ``--tune`` tunes each program
(``jax_ext.tune``, at most ``--tune-budget`` seconds, 10 by default) before timing it,
writing the tuning cache, and records how long that took (``tuning s``); without it the
tuned column times whatever the cache holds (the same as auto unless the programs were
tuned on this machine before). ``--impl native`` / ``--impl lax`` force one everywhere.
Rows are grouped by kind: single calls, element-wise programs (selects among other ops)
and sparse programs (built on row gathers).

The overhead group (``--only overhead``, and a group of its own in every run) measures
what jax_ext costs outside its kernels, against jnp in the same process. Eager calls:
each front-end (where, where with a Python scalar, select, where3, gather) and
``jax.grad`` of a gather, called outside jit on small arrays, alternating call by call as
above (reused arguments only: the time is the dispatch). Trace+lower and compile: a
program of N call sites (each a gather and a where) and its gradient, traced and lowered
(``jax.jit(f).trace(*args).lower()``) and compiled, each time a new function, for jnp and
for jax_ext under implementation "auto", "lax" and "native", three times with the sides
alternating; medians, the ratio jnp/jax_ext (> 1: jax_ext is faster) and the growth from
the smaller N to the larger. N is 100 and 400 when the group runs alone, 25 and 100 in
the full sweep (at 400 sites the gradient's XLA compiles alone take about three minutes
on two cores), 5 and 20 in the default run and with --quick; ``--sites`` sets
them. Its arrays are small, so it
runs under the benchmark's own allocator settings ("process"), in a process of its own,
whatever --memory says. It has tables of its own (printed after the main table and
written by --report; kind "overhead" in the JSON) and no panel in the plot.

Every case runs under two memory states, the same for both sides, each in a process of
its own (``--memory``): "warm", where glibc keeps freed memory and results land on memory
the process used before, and "fresh", where every result of 128 KiB or more is mapped
anew (timing.MEMORY_STATES holds the settings). Rows whose two sides still faulted
differently are marked. ``--memory process`` times in this process as it is; then each
program row still runs in a process of its own (``--same-process`` runs them here), as a
user's program does: glibc's heap is state that one case leaves to the next (freeing a
block of 32 MiB raises its dynamic mmap threshold; a long run fragments the heap), and
that state, not the program, can decide which side pays the page faults (the docs'
performance page gives an example).

Without the compiled module this refuses to run (exit status 2) unless ``--impl lax``
asks for the lax fallback explicitly: lax timings must not pass for the native ones.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import jax_ext

from .._names import ImplementationName
from ..auto.store import enabled_by_env as tuning_enabled_by_env
from .kinds import OVERHEAD
from .plot import plot as _plot
from .records import Case, Meta, Row
from .report import (format_table, machine_info, onnxruntime_text, overhead_tables,
                     write_report)
from .select import select_cases
from .timing import MEMORY_STATES, child_env, measure


class _Options(argparse.Namespace):
    """The command line as _parser reads it."""
    quick: bool
    only: str
    rounds: int | None
    pattern: str
    impl: ImplementationName
    tune: bool
    tune_budget: float
    json: str
    plot: str
    markdown: bool
    report: str | None
    calibrate: bool
    table: str | None
    same_process: bool
    memory: str
    case: str | None
    devices: int
    sites: tuple[int, int] | None
    full: bool


# The overhead group's numbers of call sites in the default run: its trace+lower and compile
# rows, at fewer sites than --full's, so that the group costs seconds there.
SITES_DEFAULT = (5, 20)


def all_cases(quick: bool, devices: int = 0, sites: tuple[int, int] | None = None,
              full: bool = True) -> list[Case]:
    """Every case of a run, in the order they run: the full sweep's (`full`) or the
    default run's selection; `sites`: the overhead group's two numbers of call sites
    (default: those of the full sweep, or of --quick)."""
    from . import gather, overhead, programs, training
    cases = select_cases(quick, full)
    if devices > 1:
        from . import sharded
        cases += sharded.cases(quick, devices)
    sites = sites or (overhead.SITES_QUICK if quick else overhead.SITES_FULL)
    return (cases + gather.cases(quick, full) + programs.cases(quick, full)
            + training.cases(quick, full)
            + overhead.cases(sites))


def _every_case(a: _Options) -> bool:
    """Whether the run picks from every case: --full, and --only or a child's --case,
    which name any case of the full sweep."""
    return a.full or bool(a.only) or a.case is not None


def _selected(a: _Options, sites: tuple[int, int] | None) -> list[Case]:
    """The cases of the run: the default selection, every case with --full, or those
    --only (or a child's --case) picks among every case."""
    return [c for c in all_cases(a.quick, a.devices, sites, _every_case(a))
            if a.only in c["name"] and (a.case is None or c["name"] == a.case)]


def _sites(a: _Options) -> tuple[int, int]:
    """The overhead group's numbers of call sites: --sites, else the issue's pair when the
    run is the overhead group alone, a smaller one in a run of other groups too (the
    gradient's XLA compile dominates), smaller still in the default run, the smallest
    with --quick."""
    from . import overhead
    if a.sites:
        return a.sites
    if a.quick:
        return overhead.SITES_QUICK
    if not _every_case(a):
        return SITES_DEFAULT
    alone = all(c["kind"] == OVERHEAD for c in _selected(a, None))
    return overhead.SITES_ALONE if alone else overhead.SITES_FULL


def _run_name(a: _Options) -> str:
    """What the run is, for the header and the report."""
    if a.only:
        return f"the cases named by --only {a.only!r}"
    if a.full:
        return "the full sweep (every case)"
    return "the default selection of cases (--full runs every case)"


def _sites_arg(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want two numbers, like 100,400: {text!r}") from None
    if not 1 <= lo < hi:
        raise argparse.ArgumentTypeError(f"want 1 <= N1 < N2: {text!r}")
    return lo, hi


def _where(path: str) -> str:
    here = os.path.dirname(os.path.abspath(path)) == os.getcwd()
    return f"{path} (in the current directory)" if here else path


def _fields(case: Case) -> Row:
    """What a row keeps of its case: everything but the functions."""
    return {k: v for k, v in case.items() if not callable(v)}


def _tune_budget(a: _Options) -> float | None:
    return a.tune_budget if a.tune else None


def _states(a: _Options, case: Case | None = None) -> list[str]:
    """The memory states each case (`case`, where given) is timed under: "process" (this
    process as it is, and programs and the overhead group in a process of their own unless
    --same-process) or states of MEMORY_STATES, each in a process of its own. The
    overhead group, whose arrays are small, runs under "process" whatever --memory says."""
    if a.same_process or a.memory == "process" or (case and case["kind"] == OVERHEAD):
        return ["process"]
    return list(MEMORY_STATES) if a.memory == "both" else [a.memory]


def _isolated(name: str, a: _Options, rounds: int, memory: str = "process") -> list[Row]:
    """Measures one case in a fresh Python process (this jax_ext, these options), with
    glibc's allocator set up for `memory` (MEMORY_STATES) unless that is "process"."""
    import subprocess
    import tempfile
    env = child_env() | MEMORY_STATES.get(memory, {})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "jax_ext.bench", "--case", name, "--json", out,
               "--rounds", str(rounds), "--pattern", a.pattern, "--impl", a.impl,
               "--memory", memory]
        cmd += ["--quick"] if a.quick else []
        cmd += ["--devices", str(a.devices)] if a.devices > 1 else []  # the sharded cases
        cmd += ["--sites", ",".join(map(str, a.sites))] if a.sites else []
        cmd += ["--tune", "--tune-budget", str(a.tune_budget)] if a.tune else []
        # its stderr is ours: the tuner's progress lines show as they come
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            rows: list[Row] = json.load(f)
            return rows


def _parser() -> argparse.ArgumentParser:
    # prog: the command users run (`python -m jax_ext.bench` from a clone's root would
    # import the source folder, which has no compiled module).
    p = argparse.ArgumentParser(prog="jax-ext-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="every case (default: a selection "
                   "from every group; about ten minutes against two to five on two cores)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, 7 rounds")
    p.add_argument("--only", default="", help="run the cases whose name contains this "
                   "(among every case)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating timing rounds (at least 3; default 15, --quick 7)")
    p.add_argument("--pattern", choices=("both", "reused", "fresh", "loop"), default="both",
                   help="calling pattern(s) to time (default both: reused and fresh; "
                        "loop: each side's calls back to back)")
    p.add_argument("--impl", choices=("auto", "native", "lax"), default="auto",
                   help="the jax_ext implementation measured: 'auto' (default, what users get: "
                        "native or lax per call site), 'native' forces the kernels everywhere, "
                        "'lax' benchmarks the fallback")
    p.add_argument("--tune", action="store_true",
                   help="before timing each program, tune its call sites (jax_ext.tune; the "
                        "choices are stored in the tuning cache, as a user's tuning would) "
                        "and record how long that took")
    p.add_argument("--tune-budget", type=float, default=10.0, metavar="SECONDS",
                   help="with --tune: the most seconds tuning one program may take "
                        "(default 10)")
    p.add_argument("--json", default="bench.json", help="where to write the results "
                   "(default: bench.json in the current directory)")
    p.add_argument("--plot", default="bench.png", help="where to draw the plot "
                   "(matplotlib; default: bench.png in the current directory)")
    p.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    p.add_argument("--report", default=None, metavar="PATH",
                   help="also write the table as Markdown, under a header naming the machine "
                        "(CPU, cores, jax/jaxlib, allocator settings, patterns), to PATH "
                        "(the docs' page: --report docs/_generated/benchmark.md)")
    p.add_argument("--calibrate", action="store_true",
                   help="instead of the benchmark: time the kernels and XLA's loops on a grid, "
                        "fit the constants of the cost model behind implementation 'auto' and "
                        "write them (with --quick: a smaller grid, for CI; see --table; --report "
                        "writes the table as Markdown)")
    p.add_argument("--table", default=None, metavar="PATH",
                   help="with --calibrate: where to write the fitted table (default: "
                        "print it, with the path of the package's table it would replace)")
    p.add_argument("--same-process", action="store_true",
                   help="time the program rows in this process too (default: each program "
                        "in a process of its own)")
    p.add_argument("--memory", choices=("both", *MEMORY_STATES, "process"), default="both",
                   help="the memory state each case runs under, the same for every side: "
                        "'warm' (results land on memory the process reused), 'fresh' (every "
                        "result of 128 KiB or more mapped anew), 'both' (default: each case "
                        "twice, each state in a process of its own), or 'process' (this "
                        "process as it is, the old way; --same-process implies it)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, exact name
    p.add_argument("--devices", type=int, default=0,
                   help="also run the sharded cases (names start with 'shard') on N host "
                        "devices (sets XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    p.add_argument("--sites", type=_sites_arg, default=None, metavar="N1,N2",
                   help="the overhead group's two numbers of call sites (default: 100,400 "
                        "when the run is that group alone, --only overhead; 25,100 in a run "
                        "of other groups too, --full; 5,20 in the default run and with "
                        "--quick)")
    return p


def _no_native_module() -> int:
    why = jax_ext.native_error() or "unknown reason"
    print(f"jax_ext.bench: the native module is not loaded ({why}).\n"
          "This benchmark measures the C++ handlers; without them "
          "every jax_ext call runs the lax fallback, and those timings must not pass for "
          "the native ones.\nFix: build and install the extension (see the README's "
          "'Supported versions and dependencies'), or pass --impl lax to benchmark the "
          "lax fallback on purpose.", file=sys.stderr)
    return 2


def _headline(meta: Meta, a: _Options, n_cases: int) -> str:
    native = "native module loaded" if meta["native"] else "NO native module"
    tuned = (f"--tune ({a.tune_budget:g} s a program)" if a.tune
             else "the tuning cache as found")
    return (f"jax_ext {meta['jax_ext']} | {meta.get('run', '')} | implementation {a.impl} | "
            f"{native} | {meta['date']} | {meta['cpu']} x{meta['cores']} | "
            f"jax {meta['jax']} jaxlib {meta['jaxlib']} | "
            f"onnxruntime {onnxruntime_text(meta)} | {n_cases} cases x "
            f"{len(meta['patterns'])} patterns, {meta['rounds']} alternating rounds | "
            f"tuned column: {tuned} | load {meta['loadavg_start'][0]:.1f}"
            + "".join(f" | {k}={v}" for k, v in meta["malloc_env"].items()))


def _run_case(case: Case, tag: str, a: _Options, rounds: int, min_sample: float,
              patterns: Sequence[str]) -> list[Row]:
    """One case's rows (a program in a process of its own unless --same-process), its
    progress on stderr."""
    program = case["op"] == "program"
    # the tuner prints lines of its own: they start on a line of theirs
    print(f"{tag} {case['name']} ...", end="\n" if a.tune and program else "", flush=True,
          file=sys.stderr)
    states = _states(a, case)
    if states != ["process"]:
        got = [r for m in states for r in _isolated(case["name"], a, rounds, m)]
    elif (program or case["kind"] == OVERHEAD) and not a.same_process:
        got = _isolated(case["name"], a, rounds)
    else:
        got = measure(case, rounds, min_sample, patterns, _tune_budget(a))
    for r in got:
        print(_progress(r), end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return [_fields(case) | r for r in got]


def _progress(r: Row) -> str:
    """A row's ratios on the progress line."""
    if r["pattern"] == "lowering":
        return (f" {r['impl']} {r['sites']}: {r['tl_ratio']:.2f}x/"
                f"{r['compile_ratio']:.2f}x")
    tuned = f" (tuned {r['tuned_ratio']:.2f}x)" if r.get("tuned_ratio") else ""
    state = "" if r["memory"] == "process" else f"{r['memory']} "
    differ = " (faults differ)" if r["faults_differ"] else ""
    return f" {state}{r['pattern']} {r['ratio']:.2f}x{tuned}{differ}"


def _write_outputs(rows: list[Row], meta: Meta, a: _Options) -> None:
    timed = [r for r in rows if r.get("kind") != OVERHEAD]
    for markdown in (False, True) if a.markdown else (False,):
        if markdown:
            print()
        if timed:
            print(format_table(timed, markdown=markdown))
        if len(timed) < len(rows):
            print(("\n" if timed else "") + overhead_tables(rows, markdown))
    if a.report:
        write_report(rows, meta, a.report)
        print(f"wrote {_where(a.report)}")
    with open(a.json, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)
    # The last lines say where the outputs went (the current directory unless told).
    print(f"wrote {_where(a.json)}")
    if _plot(rows, meta, a.plot):
        print(f"wrote {_where(a.plot)}")


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv, namespace=_Options())
    if a.impl != "lax" and not jax_ext.native_available():
        return _no_native_module()
    if a.calibrate:
        from . import calibrate
        return calibrate.main(quick=a.quick, out=a.table, report=a.report)
    if a.devices > 1:  # before anything starts jax's backends
        from . import sharded
        sharded.force_host_devices(a.devices, argv)
    rounds = max(3, a.rounds or (7 if a.quick else 15))
    min_sample = 0.01 if a.quick else 0.03
    patterns = ("reused", "fresh") if a.pattern == "both" else (a.pattern,)
    a.sites = _sites(a)
    cases = _selected(a, a.sites)
    if a.case is not None:  # a child of _isolated: its rows only
        with jax_ext.implementation(a.impl):
            rows = [_fields(cases[0]) | r for r in
                    measure(cases[0], rounds, min_sample, patterns, _tune_budget(a),
                            a.memory)]
        with open(a.json, "w") as f:
            json.dump(rows, f)
        return 0
    if a.tune and not tuning_enabled_by_env():
        print("jax_ext.bench: JAX_EXT_TUNING is off, so --tune measures but stores nothing "
              "and the tuned column times the choices the cache held before.", file=sys.stderr)
    # the memory states and calling patterns the selected cases run under
    states = [m for m in ("process", *MEMORY_STATES) if any(m in _states(a, c) for c in cases)]
    used = [p for p in patterns if any(p in c.get("patterns", patterns) for c in cases
                                       if "measure" not in c)]  # lowering rows: no calls
    meta = machine_info(a.impl) | {"quick": a.quick, "rounds": rounds,
                                   "memory": {m: MEMORY_STATES.get(m, {}) for m in states},
                                   "patterns": used, "tune_budget_s": _tune_budget(a),
                                   "loadavg_start": list(os.getloadavg()),
                                   "run": _run_name(a)}
    if any(c["kind"] == OVERHEAD for c in cases):
        from . import overhead
        meta |= {"sites": list(a.sites), "overhead_repeats": overhead.REPEATS}
    print(_headline(meta, a, len(cases)), flush=True)
    with jax_ext.implementation(a.impl):
        rows = [r for i, case in enumerate(cases)
                for r in _run_case(case, f"[{i + 1}/{len(cases)}]", a, rounds, min_sample,
                                   patterns)]
    meta["loadavg_end"] = list(os.getloadavg())
    _write_outputs(rows, meta, a)
    ok = all(r["agrees"] for r in rows) and all(
        r.get("ort_agrees") is not False for r in rows)
    return 0 if ok else 1
