"""The results table (text or Markdown) and the machine it ran on."""
from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

import jax_ext

from .records import Meta, Row

# (header, width, cell(row) -> str): a negative width aligns left.
Column = tuple[str, int, Callable[[Row], str]]


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


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
    ("ran", -28, lambda r: _ran(r)),
]


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


def machine_info(impl: str) -> Meta:
    from importlib.metadata import version

    from ..auto.store import cores, cpu_model  # what the tuning cache is keyed by, too
    try:
        import onnxruntime
        ort = onnxruntime.__version__
    except ImportError:
        ort = None
    return Meta(implementation=impl, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpu=cpu_model(), cores=cores(), machine=platform.machine(),
                jax=jax.__version__, jaxlib=version("jaxlib"), numpy=np.__version__,
                onnxruntime=ort, jax_ext=jax_ext.__version__,
                native=jax_ext.native_available(),
                # glibc's allocator settings change what every large result costs (README)
                malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")})


def header_lines(meta: Meta) -> list[str]:
    """What a reader needs to judge the numbers: the machine, the versions, the allocator
    settings and the calling patterns. No paths and no dates (the docs include it)."""
    malloc = ", ".join(f"`{k}={v}`" for k, v in sorted(meta["malloc_env"].items()))
    return [
        f"- machine: {meta['cpu']}, {meta['cores']} cores ({meta['machine']})",
        f"- jax {meta['jax']}, jaxlib {meta['jaxlib']}, numpy {meta['numpy']}, onnxruntime "
        f"{meta['onnxruntime'] or 'not installed'}; jax_ext {meta['jax_ext']} "
        f"({'native module loaded' if meta['native'] else 'no native module'})",
        f"- glibc allocator of the benchmark's own process: "
        f"{malloc or 'default settings (no MALLOC_* variable)'}",
        f"- implementation: {meta['implementation']}; calling patterns: "
        f"{', '.join(meta['patterns'])}; {meta['rounds']} alternating rounds"
        f"{' (--quick sizes)' if meta['quick'] else ''}",
        f"- memory: {_memory_source(meta)}",
        f"- tuned column: {_tuned_source(meta)}",
        f"- load average at start/end: {meta['loadavg_start'][0]:.1f} / "
        f"{meta.get('loadavg_end', meta['loadavg_start'])[0]:.1f}",
    ]


def _memory_source(meta: Meta) -> str:
    states = meta.get("memory") or {"process": {}}
    told = "; ".join(
        f"{m}: " + (", ".join(f"`{k}={v}`" for k, v in sorted(env.items())) if env else
                    "the benchmark's process as it was (`--memory process`)")
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
    """The results table as Markdown under its machine header, to `path`."""
    text = "\n".join(["Benchmark run (`jax-ext-bench --report PATH` writes this page):", "",
                      *header_lines(meta), "", format_table(rows, markdown=True), ""])
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
