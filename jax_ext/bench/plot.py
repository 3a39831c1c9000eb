"""The plot: the speed ratio of every case against its jnp twin, grouped by kind, on one
screen; and, beside the single calls, the select's throughput against size.

Each case is one line of its panel, with a marker per way jax_ext ran it (auto by its
cost model, auto tuned, forced native, forced lax; single calls have auto only), filled
for reused arguments and hollow for fresh ones. The shaded band around 1.0 is the noise
between two identical programs: a difference inside it is not a measured one.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .kinds import KINDS, SINGLE
from .records import Meta, Row

if TYPE_CHECKING:  # matplotlib is optional (the bench extra), imported where it draws
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Two sides that compile to the same program read up to about this far apart on a small
# shared machine (docs/performance.md), so the plot shades 1 +- this around 1.0: a gap
# inside it is not a measured difference.
NOISE = 0.15
BAND = "0.72"

# (the row's ratio field, legend label, marker, colour, size); "ratio" is the row's own
# side. Drawn last to first: auto on top, a little smaller than the tuned diamond, so that
# both show where they coincide.
Series = tuple[str, str, str, str, int]
SERIES: list[Series] = [("ratio", "auto (cost model)", "o", "tab:blue", 20),
          ("tuned_ratio", "auto, tuned", "D", "tab:green", 30),
          ("native_ratio", "forced native", "s", "tab:orange", 22),
          ("lax_ratio", "forced lax", "^", "tab:red", 26)]
PATTERNS = {"reused": +0.17, "fresh": -0.17}  # a case's two patterns, a little apart
ROW_IN = 0.22  # inches per case
DPI = 110  # a full run (about 45 cases) then fits a screen of 1920x1080


# A column of panels: (kind or "throughput", inches of plot area) each.
Panels = list[tuple[str, float]]


def _cases(rows: Sequence[Row], kind: str) -> tuple[list[str], dict[str, dict[str, Row]]]:
    """The names of a kind's cases in the order they ran, and each case's rows by pattern."""
    by: dict[str, dict[str, Row]] = {}
    for r in rows:
        if r.get("kind", SINGLE) == kind:
            by.setdefault(r["name"], {})[r["pattern"]] = r
    return list(by), by


def _label(name: str) -> str:
    return name.removeprefix("prog ")


def _series(meta: Meta) -> list[Series]:
    impl = meta.get("implementation", "auto")
    own = "auto (cost model)" if impl == "auto" else f"implementation {impl}"
    return [(k, own if k == "ratio" else label, m, c, size) for k, label, m, c, size in SERIES]


def _limits(rows: Sequence[Row]) -> tuple[float, float]:
    """One x range for every panel, so that positions compare across them."""
    vals = [r[k] for r in rows for k, *_ in SERIES if r.get(k)]
    lo, hi = min(vals + [1 - NOISE]), max(vals + [1 + NOISE])
    return lo / 1.25, hi * 1.25


def _ratio_panel(ax: Axes, rows: Sequence[Row], kind: str, meta: Meta,
                 xlim: tuple[float, float]) -> None:
    names, by = _cases(rows, kind)
    for i in range(0, len(names), 2):  # bands to follow a line from its name
        ax.axhspan(-i - 0.5, -i + 0.5, color="0.95", lw=0, zorder=0)
    ax.axvspan(1 - NOISE, 1 + NOISE, color=BAND, alpha=0.6, lw=0, zorder=1)
    ax.axvline(1.0, color="0.3", lw=0.8, zorder=2)
    _links(ax, names, by)
    _markers(ax, names, by, meta)
    ax.set_yticks([-i for i in range(len(names))], [_label(n) for n in names], fontsize=7)
    ax.set_ylim(-len(names) + 0.5, 0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}x")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", which="major", color="0.8", lw=0.5)
    ax.set_title(f"{kind} ({len(names)})", fontsize=9, loc="left")


def _links(ax: Axes, names: list[str], by: dict[str, dict[str, Row]]) -> None:
    """A thin line through a case's markers of one pattern, so they read as one case."""
    for i, n in enumerate(names):
        for pattern, dy in PATTERNS.items():
            xs = [by[n][pattern][k] for k, *_ in SERIES if by[n].get(pattern, {}).get(k)]
            if len(xs) > 1:
                ax.plot([min(xs), max(xs)], [-i + dy] * 2, color="0.6", lw=0.6, zorder=2)


def _markers(ax: Axes, names: list[str], by: dict[str, dict[str, Row]], meta: Meta) -> None:
    for key, label, marker, color, size in _series(meta)[::-1]:
        for pattern, dy in PATTERNS.items():
            pts = [(by[n][pattern][key], -i + dy) for i, n in enumerate(names)
                   if by[n].get(pattern, {}).get(key)]
            if pts:
                xs, ys = zip(*pts)
                ax.scatter(xs, ys, s=size, marker=marker, linewidths=1.1, zorder=3,
                           facecolors=color if pattern == "reused" else "white",
                           edgecolors=color, label=f"{label} ({pattern})")


def _throughput_panel(ax: Axes, rows: Sequence[Row]) -> None:
    """Throughput against size for the f32 select sweep, both implementations."""
    for pattern, line in (("reused", "-"), ("fresh", ":")):
        f32 = [r for r in rows if r["name"].startswith("select f32 2^") and r["pattern"] == pattern]
        if f32:
            xs = [r["elements"] for r in f32]
            ax.plot(xs, [r["bytes"] / r["ours_s"] / 1e9 for r in f32], "o" + line,
                    color="tab:blue", ms=4, label=f"jax_ext.select ({pattern})")
            ax.plot(xs, [r["bytes"] / r["ref_s"] / 1e9 for r in f32], "s" + line,
                    color="0.4", ms=4, label=f"jnp.where ({pattern})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("result elements (float32)", fontsize=7)
    ax.set_ylabel("GB/s read + written", fontsize=7)
    ax.set_title("select throughput against size", fontsize=9, loc="left")


def _columns(rows: Sequence[Row]) -> list[Panels]:
    """Panels per column, each (kind or "throughput", inches of plot area): single calls
    on the left (with the throughput below them where the sweep ran), programs on the
    right; one column when only one side has rows."""
    counts = {k: len(_cases(rows, k)[0]) for k in KINDS}
    left: Panels = [(SINGLE, counts[SINGLE] * ROW_IN)] if counts[SINGLE] else []
    if any(r["name"].startswith("select f32 2^") for r in rows):
        left.append(("throughput", THROUGHPUT_IN))
    right = [(k, counts[k] * ROW_IN) for k in KINDS[1:] if counts[k]]
    return [c for c in (left, right) if c] if left and right else [left + right]


# The figure's frame, in inches: names left of each panel (CHAR_IN a character of them),
# a title above it and tick labels below it (an axis label below the last of a column),
# the legend and the machine above everything.
PANEL_W_IN, COL_GAP_IN, CHAR_IN = 4.4, 0.3, 0.056
TITLE_IN, LEGEND_ROW_IN, GAP_IN, XLABEL_IN, BOTTOM_IN, THROUGHPUT_IN = \
    0.35, 0.22, 0.5, 0.15, 0.45, 1.6


def _labels_in(rows: Sequence[Row], col: Panels) -> float:
    """Inches for the longest case name of a column's panels."""
    names = [_label(n) for kind, _ in col for n in _cases(rows, kind)[0]]
    return 0.2 + CHAR_IN * max(map(len, names), default=30)


def _xlabeled(col: Panels, k: int) -> bool:
    """Does panel k of a column carry the ratio axis' label (the last ratio panel)?"""
    return col[k][0] != "throughput" and all(n == "throughput" for n, _ in col[k + 1:])


def figure(rows: Sequence[Row], meta: Meta) -> Figure:
    """The figure `plot` saves (matplotlib, imported here: an optional dependency)."""
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("kind", SINGLE) in KINDS]  # not the overhead group
    columns = _columns(rows)
    widths = [_labels_in(rows, col) + PANEL_W_IN + COL_GAP_IN for col in columns]
    tall = max(sum(h + GAP_IN + XLABEL_IN * _xlabeled(col, k) for k, (_, h) in enumerate(col))
               for col in columns)
    handles = _legend_handles(rows, meta)
    per_row = len(handles) if len(columns) > 1 else (len(handles) + 1) // 2
    top_in = TITLE_IN + LEGEND_ROW_IN * -(-len(handles) // per_row) + 0.2
    w, h = sum(widths), top_in + tall + BOTTOM_IN - GAP_IN
    fig = plt.figure(figsize=(w, h))
    xlim = _limits(rows)
    for c, col in enumerate(columns):
        left = sum(widths[:c]) + widths[c] - PANEL_W_IN - COL_GAP_IN
        top = h - top_in
        for k, (name, height) in enumerate(col):
            ax = fig.add_axes((left / w, (top - height) / h, PANEL_W_IN / w, height / h))
            top -= height + GAP_IN + XLABEL_IN * _xlabeled(col, k)
            if name == "throughput":
                _throughput_panel(ax, rows)
                continue
            _ratio_panel(ax, rows, name, meta, xlim)
            if _xlabeled(col, k):
                ax.set_xlabel("jnp time / jax_ext time (log scale; right of 1: jax_ext "
                              "faster)", fontsize=7)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, (h - TITLE_IN) / h),
               ncol=per_row, fontsize=7, frameon=False)
    fig.suptitle(f"jax_ext {meta['jax_ext']} ({meta['implementation']}) | {meta['date']} | "
                 f"{meta['cpu']} x{meta['cores']} | jax {meta['jax']} jaxlib {meta['jaxlib']} | "
                 f"memory {rows[0].get('memory', 'process') if rows else '-'}",
                 fontsize=8, y=(h - 0.08) / h, va="top")
    return fig


def _legend_handles(rows: Sequence[Row], meta: Meta) -> list[Artist]:
    """A marker per series the rows have, the two fillings, and the noise band."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Line2D([], [], ls="", marker=m, color=c, label=lab)
               for key, lab, m, c, _ in _series(meta) if any(r.get(key) for r in rows)]
    return handles + [
        Line2D([], [], ls="", marker="o", color="0.4", label="filled: reused arguments"),
        Line2D([], [], ls="", marker="o", mfc="white", color="0.4",
               label="hollow: fresh arguments"),
        Patch(color=BAND, alpha=0.6,
              label=f"±{NOISE:.0%}: the noise between two identical programs")]


def plot(rows: Sequence[Row], meta: Meta, path: str) -> bool:
    """Draws the plot to `path`; False (and says why) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no plot")
        return False
    # One memory state per plot, the first the rows have: two would overlap case by case.
    # The overhead group has tables of its own.
    rows = [r for r in rows if r.get("kind", SINGLE) in KINDS]
    rows = [r for r in rows if r.get("memory") == rows[0].get("memory")] if rows else []
    if not rows:
        return False
    fig = figure(rows, meta)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True
