"""The results table (text or Markdown) and the machine it ran on."""
from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

import jax_ext

from .kinds import OVERHEAD
from .records import Meta, Row

# (header, width, cell(row) -> str): a negative width aligns left.
Column = tuple[str, int, Callable[[Row], str]]


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def _fmt_s(s: float | None) -> str:
    """Seconds of tracing, lowering or compiling."""
    if s is None:
        return "-"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"


def _fmt_ratio(r: float | None, lo: float | None, hi: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x [{lo:.2f}-{hi:.2f}]"


def _fmt_x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _ran(r: Row) -> str:
    """What ran at each call site; where the tuning cache changed that, what ran tuned."""
    tuned = r.get("tuned_picked")
    return r["picked"] if not tuned or tuned == r["picked"] else f"{r['picked']}; tuned: {tuned}"


# (header, width, cell(row) -> str). A list, so more columns can be added in one place.
COLUMNS: list[Column] = [
    ("case", -56, lambda r: r["name"]),
    ("calls", -6, lambda r: r["pattern"]),
    ("memory", -7, lambda r: r.get("memory", "process")),
    ("jax_ext", 11, lambda r: _fmt_t(r["ours_s"])),
    ("spread", 6, lambda r: f"{r['spread'] * 100:.0f}%"),
    ("reference", 11, lambda r: _fmt_t(r["ref_s"])),
    ("ratio [min-max]", 20, lambda r: _fmt_ratio(r["ratio"], r["ratio_min"], r["ratio_max"])),
    ("vs onnxruntime", 20,
     lambda r: _fmt_ratio(r.get("ort_ratio"), r.get("ort_ratio_min"), r.get("ort_ratio_max"))),
    ("of copy", 7, lambda r: "-" if r.get("copy_frac") is None else f"{r['copy_frac'] * 100:.0f}%"),
    ("GB/s", 6, lambda r: f"{r['gbps']:.1f}" if r["gbps"] else "-"),
    ("faults", 13, lambda r: "-" if r.get("faults") is None else
     f"{r['faults']:.0f}/{r['ref_faults']:.0f}" + (" !" if r.get("faults_differ") else "")),
    ("agrees", 6, lambda r: ("NO" if not r["agrees"] else
                             "exact" if r.get("exact", True) else "close")),
    ("native", 6, lambda r: _fmt_x(r.get("native_ratio"))),
    ("lax", 6, lambda r: _fmt_x(r.get("lax_ratio"))),
    ("tuned", 6, lambda r: _fmt_x(r.get("tuned_ratio"))),
    ("tuning s", 8, lambda r: "-" if r.get("tune_s") is None else f"{r['tune_s']:.1f}"),
    ("temp/device MiB", 15, lambda r: "-" if r.get("temp_mib") is None else
     f"{r['temp_mib']:.1f}/{r['ref_temp_mib']:.1f}"),
    ("ran", -28, lambda r: _ran(r)),
]


def _growth(r: Row, key: str) -> str:
    """seconds at the larger N / at the smaller, jax_ext's and (in brackets) jnp's."""
    g = r.get(f"{key}_growth")
    return "-" if g is None else f"{g:.2f}x (jnp {r[f'{key}_ref_growth']:.2f}x)"


# The overhead group's tables (overhead.py): eager calls, a row per front-end...
EAGER_COLUMNS: list[Column] = [
    ("eager call", -44, lambda r: r["name"].removeprefix("overhead eager ")),
    ("jax_ext", 11, lambda r: _fmt_t(r["ours_s"])),
    ("spread", 6, lambda r: f"{r['spread'] * 100:.0f}%"),
    ("jnp", 11, lambda r: _fmt_t(r["ref_s"])),
    ("ratio [min-max]", 20, lambda r: _fmt_ratio(r["ratio"], r["ratio_min"], r["ratio_max"])),
    ("native", 6, lambda r: _fmt_x(r.get("native_ratio"))),
    ("lax", 6, lambda r: _fmt_x(r.get("lax_ratio"))),
    ("agrees", 6, lambda r: "exact" if r["agrees"] else "NO"),
    ("compiles", 9, lambda r: "-" if r.get("compiles") is None else
     f"{r['compiles']}/{r['ref_compiles']}"),
    ("ran", -28, lambda r: _ran(r)),
]
# ... and the N-site program's trace+lower and compile, a row per N and implementation.
LOWERING_COLUMNS: list[Column] = [
    ("program", -8, lambda r: "grad" if r["grad"] else "forward"),
    ("sites", 5, lambda r: str(r["sites"])),
    ("impl", -6, lambda r: r["impl"]),
    ("trace+lower", 11, lambda r: _fmt_s(r["tl_s"])),
    ("jnp", 11, lambda r: _fmt_s(r["tl_ref_s"])),
    ("ratio [min-max]", 20,
     lambda r: _fmt_ratio(r["tl_ratio"], r["tl_ratio_min"], r["tl_ratio_max"])),
    ("compile", 11, lambda r: _fmt_s(r["compile_s"])),
    ("jnp", 11, lambda r: _fmt_s(r["compile_ref_s"])),
    ("ratio [min-max]", 20,
     lambda r: _fmt_ratio(r["compile_ratio"], r["compile_ratio_min"], r["compile_ratio_max"])),
    ("trace+lower growth", 20, lambda r: _growth(r, "tl")),
    ("compile growth", 20, lambda r: _growth(r, "compile")),
    ("native calls", 12, lambda r: str(r["native_calls"])),
    ("agrees", 6, lambda r: "close" if r["agrees"] else "NO"),
]


def overhead_tables(rows: Sequence[Row], markdown: bool = False) -> str:
    """The overhead group's rows of `rows` as two tables, each under a line that says how
    to read it (nothing for a run without them)."""
    eager = [r for r in rows if r.get("kind") == OVERHEAD and r["op"] == "eager"]
    lowering = [r for r in rows if r.get("kind") == OVERHEAD and r["op"] == "lowering"]
    parts: list[str] = []
    if eager:
        parts += ["Eager calls (outside jit), time per call; ratio = jnp's time / jax_ext's "
                  "(> 1: jax_ext is faster), median [min-max] over rounds; native, lax: the "
                  "same under a forced implementation; the rows over fresh Python scalars "
                  "give each call a value never given before, and compiles = the XLA "
                  "compiles while they were timed, jax_ext's (all three implementations) / "
                  "jnp's:", "",
                  format_table(eager, EAGER_COLUMNS, markdown)]
    if lowering:
        sites = sorted({r["sites"] for r in lowering})
        parts += ([""] if parts else []) + [
            f"Trace+lower and compile of a program of {' and '.join(map(str, sites))} call "
            f"sites and of its gradient (a new function each time, "
            f"{lowering[0]['repeats']} repetitions, medians); ratio = jnp's seconds / "
            "jax_ext's (> 1: jax_ext is faster), [min-max] over repetitions; growth = "
            f"seconds at {sites[-1]} sites / at {sites[0]}, jax_ext's (jnp's); native "
            "calls = jax_ext custom calls in the compiled program:", "",
            format_table(lowering, LOWERING_COLUMNS, markdown)]
    return "\n".join(parts)


def format_table(rows: Sequence[Row], columns: Sequence[Column] = COLUMNS,
                 markdown: bool = False) -> str:
    if markdown:
        lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
                 "|" + "|".join("---" if w < 0 else "---:" for _, w, _ in columns) + "|"]
        # A "|" inside a cell (the clip program's name) would end the cell.
        lines += ["| " + " | ".join(f(r).replace("|", "\\|") for _, _, f in columns) + " |"
                  for r in rows]
        return "\n".join(lines)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}"
                         for c, (_, w, _) in zip(cells, columns))
    head = line([h for h, _, _ in columns])
    return "\n".join([head, "-" * len(head)] + [line([f(r) for _, _, f in columns]) for r in rows])


def onnxruntime_absent() -> str:
    """Why onnxruntime (the onnxruntime column) is missing: where the bench extra leaves it
    out by an environment marker (no onnxruntime wheel for this Python), that; else it was
    not installed. The marker is read from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError, requires
    try:
        from packaging.requirements import Requirement  # with matplotlib, of the bench extra
        reqs = [Requirement(r) for r in requires("jax_ext") or ()]
    except (ImportError, PackageNotFoundError):  # no packaging, or a source tree
        reqs = []
    bench = [r.marker for r in reqs if r.name == "onnxruntime" and r.marker is not None
             and 'extra == "bench"' in str(r.marker)]
    if bench and not any(m.evaluate({"extra": "bench"}) for m in bench):
        python = ".".join(map(str, sys.version_info[:2]))
        return (f"absent: no onnxruntime wheel for Python {python}, so the bench extra leaves "
                "it out")
    return 'not installed (pip install "jax_ext[bench]")'


def onnxruntime_text(meta: Meta) -> str:
    """The onnxruntime version the run used, or why it had none."""
    return meta["onnxruntime"] or meta.get("onnxruntime_absent") or "not installed"


def machine_info(impl: str) -> Meta:
    from importlib.metadata import version

    from ..auto.store import cores, cpu_model  # what the tuning cache is keyed by, too
    try:
        import onnxruntime
        ort, absent = onnxruntime.__version__, None
    except ImportError:
        ort, absent = None, onnxruntime_absent()
    meta = Meta(implementation=impl, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpu=cpu_model(), cores=cores(), machine=platform.machine(),
                jax=jax.__version__, jaxlib=version("jaxlib"), numpy=np.__version__,
                onnxruntime=ort, jax_ext=jax_ext.__version__,
                native=jax_ext.native_available(),
                # glibc's allocator settings change what every large result costs (README)
                malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")})
    if absent is not None:
        meta["onnxruntime_absent"] = absent
    return meta


def header_lines(meta: Meta, timed: bool = True) -> list[str]:
    """What a reader needs to judge the numbers: the machine, the versions, the allocator
    settings and the calling patterns. No paths and no dates (the docs include it).
    `timed`: the run has rows besides the overhead group (the tuned column's line)."""
    malloc = ", ".join(f"`{k}={v}`" for k, v in sorted(meta["malloc_env"].items()))
    overhead = ([f"- overhead group: programs of {' and '.join(map(str, meta['sites']))} call "
                 f"sites, {meta.get('overhead_repeats')} repetitions"]
                if meta.get("sites") else [])
    tuned = [f"- tuned column: {_tuned_source(meta)}"] if timed else []
    return [
        f"- machine: {meta['cpu']}, {meta['cores']} cores ({meta['machine']})",
        f"- jax {meta['jax']}, jaxlib {meta['jaxlib']}, numpy {meta['numpy']}, onnxruntime "
        f"{onnxruntime_text(meta)}; jax_ext {meta['jax_ext']} "
        f"({'native module loaded' if meta['native'] else 'no native module'})",
        f"- glibc allocator of the benchmark's own process: "
        f"{malloc or 'default settings (no MALLOC_* variable)'}",
        *([f"- cases: {meta['run']}"] if meta.get("run") else []),
        f"- implementation: {meta['implementation']}; calling patterns: "
        f"{', '.join(meta['patterns'])}; {meta['rounds']} alternating rounds"
        f"{' (--quick sizes)' if meta['quick'] else ''}",
        f"- memory: {_memory_source(meta)}",
        *tuned,
        *overhead,
        f"- load average at start/end: {meta['loadavg_start'][0]:.1f} / "
        f"{meta.get('loadavg_end', meta['loadavg_start'])[0]:.1f}",
    ]


def _memory_source(meta: Meta) -> str:
    states = meta.get("memory") or {"process": {}}
    told = "; ".join(
        f"{m}: " + (", ".join(f"`{k}={v}`" for k, v in sorted(env.items())) if env else
                    "the settings of the benchmark's own process, above (`--memory "
                    "process`, and the overhead group whatever `--memory` says)")
        for m, env in states.items())
    return (f"{told}. Both sides of a row ran in one process, under one state; faults "
            "marked ! are rows whose sides still faulted differently (64 or more per call on "
            "one side, under 16 on the other)")


def _tuned_source(meta: Meta) -> str:
    budget = meta.get("tune_budget_s")
    if budget is None:
        return ("auto with the tuning cache as found (no `--tune`: the same choices as auto "
                "unless these programs were tuned before)")
    return (f"auto with the choices `jax_ext.tune` measured for each program right before "
            f"timing it (`--tune`, at most {budget:g} s a program; `tuning s` says how long)")


def write_report(rows: Sequence[Row], meta: Meta, path: str) -> None:
    """The results table as Markdown under its machine header, to `path`; the overhead
    group's tables after it."""
    timed = [r for r in rows if r.get("kind") != OVERHEAD]
    command = "jax-ext-bench --report PATH" if timed or not rows else \
        "jax-ext-bench --only overhead --report PATH"
    lines = [f"Benchmark run (`{command}` writes this page):", "",
             *header_lines(meta, timed=bool(timed)), ""]
    if timed or not rows:
        lines += [format_table(timed, markdown=True), ""]
    if len(timed) < len(rows):
        lines += [overhead_tables(rows, markdown=True), ""]
    text = "\n".join(lines)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
