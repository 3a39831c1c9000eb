"""The benchmark harness: it must not pass lax timings off as native ones, and its
results carry what is needed to judge them (implementation, machine, spread)."""
import os
import contextlib
import json
import re

import jax
import numpy as np
import pytest

import jax_ext
from jax_ext import _native, bench

# The benchmark's process as it is: one process, no child per memory state (the tests of
# other features need no controlled memory).
PROCESS = ["--memory", "process"]


def test_refuses_without_native_module(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(_native, "_AVAILABLE", False)
    monkeypatch.setattr(_native, "_ERROR", "ImportError: no module named _jax_ext")
    rc = bench.main(["--only", "select 8 elements", "--json", str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "native module is not loaded" in err and "no module named _jax_ext" in err
    assert "--impl lax" in err
    assert not (tmp_path / "b.json").exists()


def test_lax_on_request_records_implementation_and_spread(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = bench.main(PROCESS + ["--impl", "lax", "--only", "select 8 elements", "--rounds", "3",
                     "--json", str(out), "--plot", str(tmp_path / "b.png")])
    assert rc == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "implementation lax" in head and "jaxlib" in head
    assert "the cases named by --only 'select 8 elements'" in head  # which run it was
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["implementation"] == "lax" and meta["cores"] >= 1 and meta["cpu"]
    assert meta["jax"] and meta["jaxlib"] and meta["rounds"] == 3
    rows = data["results"]
    assert [r["pattern"] for r in rows] == ["reused", "fresh"]
    for r in rows:
        assert r["agrees"] and r["picked"] == "select:lax"
        assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
        assert r["spread"] >= 0 and r["rounds"] == 3
        assert r["faults"] >= 0 and r["ref_faults"] >= 0


def test_each_call_counts_the_page_faults_it_caused():
    """A call that writes a fresh 16 MiB mapping faults once per 4 KiB page at least;
    the count is the call's own, not the process's total."""
    import mmap

    def touch():
        m = mmap.mmap(-1, 16 << 20)
        m[::4096] = b"x" * (4 << 10)  # one byte per page
        m.close()

    call = bench._host_side(touch, (), "reused")
    dt, faults = call()
    assert dt > 0 and faults >= 4096
    assert bench._host_side(lambda: None, (), "reused")()[1] < 4096


def test_quick_uses_at_least_seven_rounds(tmp_path):
    out = tmp_path / "b.json"
    impl = "native" if jax_ext.native_available() else "lax"
    assert bench.main(PROCESS + ["--quick", "--impl", impl, "--only", "select 8 elements",
                       "--pattern", "reused", "--json", str(out),
                       "--plot", str(tmp_path / "b.png")]) == 0
    assert json.loads(out.read_text())["results"][0]["rounds"] >= 7


def test_table_is_built_from_the_column_list():
    row = dict(name="c", pattern="reused", ours_s=1e-3, ref_s=2e-3, ratio=2.0, ratio_min=1.5,
               ratio_max=2.5, spread=0.1, gbps=1.0, agrees=True, picked="select:native")
    cols = bench.COLUMNS + [("picked", 6, lambda r: "native")]
    text = bench.format_table([row], cols)
    assert "picked" in text.splitlines()[0] and text.splitlines()[-1].rstrip().endswith("native")
    md = bench.format_table([row], cols, markdown=True)
    assert md.splitlines()[0].count("|") == len(cols) + 1
    # A "|" in a cell (the clip program's name) is escaped, so the row keeps its columns.
    piped = bench.format_table([dict(row, name="clip where(|g|>t)")], cols, markdown=True)
    cells = re.split(r"(?<!\\)\|", piped.splitlines()[-1])
    assert len(cells) == len(cols) + 2 and cells[1].strip() == r"clip where(\|g\|>t)"


def test_every_select_case_runs_the_dtype_it_names():
    # The float64 row once ran float32 arrays: without x64 (the benchmark's default, not
    # this suite's), jnp.asarray narrows them.
    cases = [c for c in bench.select_cases(quick=True) if "8 elements" not in c["name"]]
    assert any(c["dtype"] == "float64" for c in cases)
    for case in cases:
        with jax.enable_x64(False), (
                jax.enable_x64(True) if case.get("x64") else contextlib.nullcontext()):
            _, _, args = case["make"]()
        assert args[1].dtype.name == case["dtype"], case["name"]


def test_a_float64_case_is_timed_as_float64(tmp_path):
    out = tmp_path / "b.json"
    with jax.enable_x64(False):
        rc = bench.main(PROCESS + ["--quick", "--only", "select float64", "--rounds", "3",
                                   "--pattern", "reused", "--json", str(out),
                                   "--plot", str(tmp_path / "b.png")])
    assert rc == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["dtype"] == "float64" and row["agrees"]
    # 2^20 elements: condition bytes + 8 bytes for each of x, y and the result
    assert row["bytes"] == (1 << 20) * (1 + 3 * 8)


def test_help_names_the_command(capsys):
    import pytest
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: jax-ext-bench ") and "python -m" not in out.split("\n")[0]


def test_report_is_markdown_with_machine_header_and_outputs_are_named_last(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "docs" / "benchmark.md"
    rc = bench.main(PROCESS + ["--impl", "lax", "--only", "select 8 elements", "--rounds", "3",
                     "--pattern", "reused", "--report", str(report)])
    assert rc == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-2:]
    assert last[0].startswith("wrote bench.json (in the current directory)"), last
    assert (tmp_path / "bench.json").exists()
    text = report.read_text()
    assert "| case |" in text and "select 8 elements f32" in text
    for want in ("cores", "jaxlib", "glibc allocator", "reused"):
        assert want in text, want
    # no machine paths, no dates: the docs include this page as it is
    assert str(tmp_path) not in text and not re.search(r"\d{4}-\d\d-\d\d|UTC", text)


def test_programs_time_forced_native_and_lax_too(tmp_path):
    out = tmp_path / "b.json"
    impl = "auto" if jax_ext.native_available() else "lax"
    rc = bench.main(PROCESS + ["--quick", "--impl", impl, "--only", "prog where(x>0, x*2, y+1) f32",
                     "--rounds", "3", "--pattern", "reused", "--json", str(out),
                     "--plot", str(tmp_path / "b.png")])
    assert rc == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["native_ratio"] > 0 and row["lax_ratio"] > 0 and row["native_s"] > 0


class _Children(list):
    """Command lines, and in .envs the environments, of the child processes started."""
    envs: list


@pytest.fixture
def children(monkeypatch):
    """The command lines of the child processes the benchmark starts (still run)."""
    import subprocess
    cmds = _Children()
    cmds.envs = []
    real_run = subprocess.run

    def run(cmd, *a, **k):
        cmds.append(cmd)
        cmds.envs.append(k.get("env"))
        return real_run(cmd, *a, **k)
    monkeypatch.setattr(subprocess, "run", run)
    return cmds


def test_each_program_runs_in_a_process_of_its_own(tmp_path, children):
    """Program rows come from a child process (heap state is not carried from one case
    to the next); --same-process times them here, with the same columns."""
    impl = "auto" if jax_ext.native_available() else "lax"
    rows = {}
    for extra in ([], ["--same-process"]):
        out = tmp_path / f"b{len(extra)}.json"
        assert bench.main(PROCESS + ["--quick", "--impl", impl, "--only",
                                     "prog where(x>0, x*2, y+1) f32", "--rounds", "3",
                                     "--pattern", "reused", "--json", str(out),
                                     "--plot", str(tmp_path / "b.png")] + extra) == 0
        (rows[len(extra)],) = json.loads(out.read_text())["results"]
    assert len(children) == 1 and "--case" in children[0]
    assert children[0][children[0].index("--case") + 1] == rows[0]["name"]
    assert set(rows[0]) == set(rows[1]) and rows[0]["name"] == rows[1]["name"]


def test_quick_calibration_writes_a_complete_table(tmp_path, capsys, monkeypatch):
    """The CI form of `jax-ext-bench --calibrate`: every constant of the shipped table is
    fitted and written as JSON the package's loader takes, each with what it was fitted
    on (numbers not asserted)."""
    import pytest
    from jax_ext.auto import costs
    if not jax_ext.native_available():
        pytest.skip("the calibration times the kernels")
    out = tmp_path / "costs.json"
    assert bench.main(["--calibrate", "--quick", "--table", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    fitted, shipped = costs.load(str(out)), costs.shipped()
    assert [p for p, _ in costs.leaves(fitted)] == [p for p, _ in costs.leaves(shipped)]
    assert set(fitted.about) == set(shipped.about) and all(fitted.about.values())
    assert fitted.structure == shipped.structure and str(tmp_path) not in out.read_text()
    # without --table it prints the table and the path it would replace (not re-timed)
    from jax_ext.bench import calibrate
    monkeypatch.setattr(calibrate, "calibrate", lambda quick, machine, log: fitted)
    assert bench.main(["--calibrate", "--quick"]) == 0
    text = capsys.readouterr().out
    assert '"machine":' in text and "--table " in text.splitlines()[-1]


def test_call_orders_are_balanced():
    """In the sequence of calls the harness makes (rows back to back, round after round),
    each side runs right after each other side equally often, and each row holds every
    side once (programs time four sides: an order that favours whoever follows whom
    showed as two identical programs reading 0.97x and 1.22x)."""
    from collections import Counter

    from jax_ext.bench.timing import _orders, _time_sides
    for n in (2, 3, 4, 5):
        rows = _orders(n)
        assert all(sorted(r) == list(range(n)) for r in rows)
        seq = [s for r in rows for s in r] * 3  # three rounds' worth, as _time_sides runs
        pairs = Counter(zip(seq, seq[1:] + seq[:1]))
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1, (n, pairs)
        # and it is the order _time_sides calls them in, continued across rounds
        ran = []
        calls = [lambda k=k: (ran.append(k), (0.0, 0))[1] for k in range(n)]
        for r in range(3):
            _time_sides(calls, "reused", len(rows), start=r * len(rows))
        assert ran == seq


def test_calibration_least_squares_is_nonnegative_and_optimal():
    """The fit's NNLS against brute force: the best least-squares solution over every
    subset of columns whose solution is non-negative (the optimum is one of them)."""
    import itertools

    import numpy as np
    from jax_ext.bench.calibrate import _nnls
    rng = np.random.default_rng(0)
    for _ in range(200):
        m, n = int(rng.integers(4, 20)), int(rng.integers(1, 5))
        # column scales as the fit's: seconds per row and per byte against 1/seconds
        A = rng.random((m, n)) * rng.choice([1e-3, 1.0, 1e3, 1e6, 1e9], n)
        b = rng.standard_normal(m) + rng.random()
        x = _nnls(A, b)
        assert (x >= 0).all()
        best = np.linalg.norm(b)
        for k in range(1, n + 1):
            for cols in itertools.combinations(range(n), k):
                z = np.linalg.lstsq(A[:, cols], b, rcond=None)[0]
                if (z >= 0).all():
                    best = min(best, np.linalg.norm(A[:, cols] @ z - b))
        assert np.linalg.norm(A @ x - b) <= best * (1 + 1e-9) + 1e-9 * np.linalg.norm(b)


def test_sides_read_the_same_argument_buffers_unless_donated():
    """In the reused pattern every side gets the very same argument arrays (copies differ
    in where they live, which alone moved identical programs by 25%). (A donated operand
    gets copies per side, since each call consumes it: the donated select cases.)"""
    import jax.numpy as jnp

    from jax_ext.bench.timing import measure
    # Every call's arguments, held until the asserts: none is freed meanwhile, so no two
    # live buffers share an address and an address tells the arrays apart.
    calls: dict[str, list] = {"ours": [], "theirs": []}

    def recording(side, fn):
        def call(*args):
            if not isinstance(args[0], jax.core.Tracer):  # timed calls, not explain's traces
                calls[side].append(args)
            return fn(*args)
        return call
    x = jnp.arange(64, dtype=jnp.float32)
    f = jax.jit(lambda a: a * 2)
    case = dict(name="shared args", op="program", dtype="float32", elements=64, bytes=0,
                chain=False, exact=True,
                make=lambda: (recording("ours", f), recording("theirs", f), (x,)))
    (row,) = measure(case, rounds=3, min_sample_s=0.0, patterns=("reused",))
    assert row["agrees"]
    reads_x = lambda args: args[0].unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    copies = {}
    for side, seen in calls.items():
        assert all(len(args) == 1 for args in seen), side
        # every timed call reads x itself; the agreement check, one call, runs on a copy
        assert sum(map(reads_x, seen)) >= 3, side
        (copies[side],) = [args[0] for args in seen if not reads_x(args)]
        np.testing.assert_array_equal(copies[side], x)
    assert copies["ours"].unsafe_buffer_pointer() != copies["theirs"].unsafe_buffer_pointer()


def test_program_sides_run_by_the_cost_model_forced_and_tuned():
    """A program's row ratio is auto by its cost model alone (tuning off), its native and
    lax columns the forced implementations, and its tuned column auto with the tuning
    cache consulted: each side's calls run in its own context."""
    from jax_ext import _config
    from jax_ext.auto import tuning
    from jax_ext.bench.timing import measure
    seen: dict[str, set] = {"ours": set(), "theirs": set()}
    f = jax.jit(lambda a: a * 2)

    def recording(side):
        def call(*args):
            if not isinstance(args[0], jax.core.Tracer):  # timed calls, not explain's traces
                seen[side].add((_config.current(), tuning.active()))
            return f(*args)
        return call
    x = jax.numpy.arange(64, dtype=jax.numpy.float32)
    case = dict(name="sides", op="program", dtype="float32", elements=64, bytes=0,
                chain=False, exact=False, impls=True, kind="element-wise programs",
                make=lambda: (recording("ours"), recording("theirs"), (x,)))
    with jax_ext.implementation("auto"):
        (row,) = measure(case, rounds=3, min_sample_s=0.0, patterns=("reused",))
    assert seen["ours"] == {("auto", False), ("native", True), ("lax", True), ("auto", True)}
    for side in ("native", "lax", "tuned"):
        assert row[f"{side}_ratio"] > 0 and row[f"{side}_s"] > 0, side
    assert row["tune_s"] is None and row["tune_changes"] is None  # not asked to tune
    assert "tuned_picked" in row


def test_tune_tunes_each_program_before_timing_it(tmp_path, children):
    """--tune: the program is tuned in its own process (the flag is passed on), and its
    row records the tuned column, how long tuning took and what it changed. The cache
    written is the suite's temporary one (conftest sets JAX_EXT_CACHE_DIR; children
    inherit it), never the user's."""
    import os
    out = tmp_path / "b.json"
    impl = "auto" if jax_ext.native_available() else "lax"
    assert bench.main(PROCESS + ["--quick", "--impl", impl, "--tune", "--tune-budget", "2",
                       "--only", "prog where(x>0, x*2, y+1) f32", "--rounds", "3",
                       "--pattern", "reused", "--json", str(out),
                       "--plot", str(tmp_path / "b.png")]) == 0
    (cmd,) = children
    assert "--tune" in cmd and cmd[cmd.index("--tune-budget") + 1] == "2.0"
    data = json.loads(out.read_text())
    assert data["meta"]["tune_budget_s"] == 2.0
    (row,) = data["results"]
    assert row["kind"] == "element-wise programs"
    assert row["tuned_ratio"] > 0 and row["tuned_s"] > 0 and row["tune_s"] >= 0
    assert isinstance(row["tune_changes"], list) and row["tuned_picked"].startswith("select:")
    cache = os.environ["JAX_EXT_CACHE_DIR"]
    assert "jax_ext_test_cache_" in cache
    if impl == "auto":  # a site auto decides: measured, and stored in the suite's cache
        assert os.path.exists(os.path.join(cache, "tuning.json"))


def test_table_has_tuned_and_tuning_columns():
    """Program rows show the tuned ratio and the seconds tuning took; single calls show
    "-" there. Where the tuning cache changed what ran, `ran` says so."""
    single = dict(name="select 8 elements f32", pattern="reused", ours_s=1e-5, ref_s=2e-5,
                  ratio=2.0, ratio_min=1.5, ratio_max=2.5, spread=0.1, gbps=1.0, agrees=True,
                  picked="select:native", kind="single calls")
    prog = dict(single, name="prog x", exact=False, native_ratio=1.5, lax_ratio=0.9,
                tuned_ratio=1.62, tune_s=3.14, picked="gather:lax",
                tuned_picked="gather:native", kind="sparse programs")
    untuned = dict(prog, tune_s=None, tuned_picked="gather:lax")
    head = [h for h, _, _ in bench.COLUMNS]
    assert head[head.index("lax") + 1:head.index("lax") + 3] == ["tuned", "tuning s"]
    md = bench.format_table([single, prog, untuned], markdown=True).splitlines()
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in md]
    col = {h: i for i, h in enumerate(cells[0])}
    assert cells[2][col["tuned"]] == "-" and cells[2][col["tuning s"]] == "-"
    assert cells[3][col["tuned"]] == "1.62x" and cells[3][col["tuning s"]] == "3.1"
    assert cells[3][col["ran"]] == "gather:lax; tuned: gather:native"
    assert cells[4][col["tuning s"]] == "-" and cells[4][col["ran"]] == "gather:lax"
    text = bench.format_table([single, prog])
    assert "tuned" in text.splitlines()[0] and "tuning s" in text.splitlines()[0]


def _synthetic_rows():
    """A row per case of a full run and pattern, as the benchmark writes them (made up
    times, nothing run)."""
    rows = []
    for k, case in enumerate(bench.all_cases(quick=False)):
        fields = {f: v for f, v in case.items() if not callable(v)}
        for pattern in ("reused", "fresh"):
            r = dict(fields, pattern=pattern, ours_s=1e-4, ref_s=1e-4 * (0.5 + k % 7 / 2),
                     picked="x")
            r["ratio"] = r["ref_s"] / r["ours_s"]
            if case["op"] == "program":
                r.update(native_ratio=1.2, lax_ratio=0.9, tuned_ratio=1.25)
            rows.append(r)
    return rows


_META = dict(jax_ext="0", implementation="auto", date="today", cpu="cpu", cores=2, jax="0",
             jaxlib="0")


def test_plot_groups_the_ratios_by_kind_on_one_screen(tmp_path):
    """One panel per kind (and the select sweep's throughput), one line per case with a
    marker per way it ran, the noise band between identical programs named in the
    legend; a full run's cases fit one screen."""
    import pytest
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from jax_ext.bench import kinds, plot
    rows = _synthetic_rows()
    fig = plot.figure(rows, _META)
    panels = {ax.get_title(loc="left"): ax for ax in fig.axes}
    assert "select throughput against size" in panels
    for kind in kinds.KINDS:
        (ax,) = [ax for t, ax in panels.items() if t.startswith(kind)]
        names = {r["name"].removeprefix("prog ") for r in rows if r["kind"] == kind}
        assert {t.get_text() for t in ax.get_yticklabels()} == names, kind
        # single calls: auto only; programs: auto, tuned, native and lax; each reused
        # (filled) and fresh (hollow)
        assert len(ax.collections) == (2 if kind == kinds.SINGLE else 8), kind
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert any("±15%" in t and "identical" in t for t in legend), legend
    assert {"auto (cost model)", "auto, tuned", "forced native", "forced lax"} <= set(legend)
    w, h = fig.get_size_inches() * plot.DPI
    assert w <= 1920 and h <= 1080, (w, h)
    matplotlib.pyplot.close(fig)
    assert plot.plot(rows, _META, str(tmp_path / "b.png")) and (tmp_path / "b.png").stat().st_size


def test_every_row_runs_under_a_stated_memory_state(tmp_path, children):
    """By default each case runs twice, in a process per memory state whose allocator
    settings are the state's: "warm", where results land on memory the process reused
    (a 1 MiB result faults on neither side), and "fresh", where every result of 128 KiB
    or more is mapped anew (both sides fault once per 4 KiB page)."""
    from jax_ext.bench.timing import MEMORY_STATES
    if not jax_ext.native_available():
        pytest.skip("times the kernel against XLA's loop")
    out = tmp_path / "b.json"
    # 7 rounds: the fault counts are medians over rounds, and under load (the suite's other
    # worker) a heap can still grow through the first two or three.
    assert bench.main(["--quick", "--only", "select f32 2^18", "--rounds", "7", "--pattern",
                       "reused", "--json", str(out), "--plot", str(tmp_path / "b.png")]) == 0
    assert [c[c.index("--memory") + 1] for c in children] == ["warm", "fresh"]
    for state, env in zip(("warm", "fresh"), children.envs):
        assert {k: env[k] for k in MEMORY_STATES[state]} == MEMORY_STATES[state]
    data = json.loads(out.read_text())
    assert data["meta"]["memory"] == MEMORY_STATES
    warm, fresh = data["results"]
    assert (warm["memory"], fresh["memory"]) == ("warm", "fresh")
    if os.environ.get("JAX_EXT_EXPECT_SANITIZED"):
        return  # ASan's allocator replaces glibc's: the states' glibc settings do not apply
    pages = (1 << 18) * 4 // 4096
    assert warm["faults"] < pages / 4 and warm["ref_faults"] < pages / 4
    assert fresh["faults"] >= pages and fresh["ref_faults"] >= pages
    assert not warm["faults_differ"] and not fresh["faults_differ"]


def test_rows_whose_sides_fault_differently_are_flagged():
    from jax_ext.bench.timing import faults_differ
    assert faults_differ(528, 0) and faults_differ(3, 4097)
    assert not faults_differ(528, 8193) and not faults_differ(0, 15) and not faults_differ(63, 0)
    row = dict(name="c", pattern="reused", memory="warm", ours_s=1e-3, ref_s=2e-3, ratio=2.0,
               ratio_min=1.5, ratio_max=2.5, spread=0.1, gbps=1.0, agrees=True, picked="x",
               faults=528.0, ref_faults=0.0, faults_differ=True)
    md = bench.format_table([row, dict(row, faults_differ=False)], markdown=True).splitlines()
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in md]
    col = {h: i for i, h in enumerate(cells[0])}
    assert cells[2][col["faults"]] == "528/0 !" and cells[3][col["faults"]] == "528/0"
    assert cells[2][col["memory"]] == "warm"


def test_tune_retimes_a_round_whose_sides_faulted_differently(monkeypatch):
    """A tuning round in which one choice faulted in fresh mappings and the other ran on
    reused memory is timed again with every call's results mapped anew (freed heap
    memory given back first), and that round counts."""
    from jax_ext.auto import tuning
    trims = []
    monkeypatch.setattr(tuning, "_give_back", lambda: trims.append(1) or True)
    prog = object.__new__(tuning._Program)
    prog.patterns, prog.faults = ("reused",), 0.0

    def time(assignment, pattern, trim=False):
        native = assignment["s"] == "native"
        prog.faults = 500.0 if native or trim else 0.0  # lax got warm memory, untrimmed
        return (2.0 if native else 1.0) if not trim else 1.5
    prog.time = time
    a, b = {"s": "native"}, {"s": "lax"}
    assert prog.pair(a, b, 0) == (1.5, 1.5) and trims == [1]
    prog.time = lambda assignment, pattern, trim=False: 1.0  # alike: kept as timed
    assert prog.pair(a, b, 1) == (1.0, 1.0) and trims == [1]


def test_a_case_child_gets_the_device_count_of_the_sharded_cases(monkeypatch):
    """With --devices N every case runs in a child per memory state, the sharded ones
    too: the child is told N, or it would not have those cases."""
    import subprocess

    from jax_ext.bench import cli
    cmds = []

    def run(cmd, *a, **k):  # writes the rows file the child would write, runs nothing
        cmds.append(cmd)
        with open(cmd[cmd.index("--json") + 1], "w") as f:
            f.write("[]")
    monkeypatch.setattr(subprocess, "run", run)
    a = cli._parser().parse_args(["--devices", "4"], namespace=cli._Options())
    assert cli._isolated("shard x", a, 3, "warm") == []
    assert cmds[0][cmds[0].index("--devices") + 1] == "4"
    assert cmds[0][cmds[0].index("--memory") + 1] == "warm"


# --- the overhead group (jax-ext-bench --only overhead) ---------------------------------

def _finite_positive(*xs):
    import math
    return all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in xs)


def test_overhead_group_alone_writes_its_tables_json_and_report(tmp_path, monkeypatch):
    """`--only overhead`: eager rows (reused arguments only, whatever --pattern says) and
    the N-site program's trace+lower and compile rows, a row per N and implementation,
    with growth on the larger N; a group of their own in the JSON and the report (numbers
    checked for sense, never for speed)."""
    from jax_ext.bench import kinds, overhead
    if not jax_ext.native_available():
        pytest.skip("the lowering rows compile forced native too")
    monkeypatch.setattr(overhead, "REPEATS", 2)
    monkeypatch.setattr(overhead, "LOOP_ROUNDS", 3)
    monkeypatch.setattr(overhead, "LOOP_VALUES", 20)
    monkeypatch.setattr(overhead, "PAD_LOOP_VALUES", 2)
    out, report = tmp_path / "b.json", tmp_path / "overhead.md"
    assert bench.main(["--same-process", "--quick", "--only", "overhead", "--sites", "2,3",
                       "--rounds", "3", "--pattern", "fresh", "--json", str(out),
                       "--plot", str(tmp_path / "b.png"), "--report", str(report)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["sites"] == [2, 3] and data["meta"]["overhead_repeats"] == 2
    assert data["meta"]["memory"] == {"process": {}}
    rows = data["results"]
    assert {r["kind"] for r in rows} == {kinds.OVERHEAD}
    eager = [r for r in rows if r["op"] == "eager"]
    assert [r["name"] for r in eager] == [c["name"] for c in overhead.eager_cases()]
    loops = [r for r in eager if r["name"].endswith(", fresh Python scalars")]
    for front in ("where(c, x, y)", "where(c, x, 0.0)", "select(", "where3(", "gather f32",
                  "grad of sum(gather)"):
        assert sum(front in r["name"] for r in eager if r not in loops) == 1, front
    for front in ("where(c, x, s)", "select(c, s, x)", "where3(c, x, s)", "gather pad_value=s"):
        assert sum(front in r["name"] for r in loops) == 1, front
    for r in eager:
        assert r["pattern"] == ("fresh scalars" if r in loops else "reused"), r["name"]
        assert r["agrees"] and r["rounds"] == 3, r["name"]
        assert _finite_positive(r["ours_s"], r["ref_s"], r["ratio"], r["native_ratio"],
                                r["lax_ratio"]), r
    for r in loops:  # no compile per value (jnp.take compiles once per fill_value)
        assert r["compiles"] == 0 and r["values"] == 3 * (2 if "pad" in r["name"] else 20)
        assert r["ref_compiles"] == (6 if "pad" in r["name"] else 0), r["name"]
    lowering = [r for r in rows if r["op"] == "lowering"]
    assert sorted((r["grad"], r["sites"], r["impl"]) for r in lowering) == sorted(
        (g, n, i) for g in (False, True) for n in (2, 3) for i in ("auto", "lax", "native"))
    for r in lowering:
        assert r["agrees"] and r["repeats"] == 2 and r["memory"] == "process"
        assert _finite_positive(r["tl_s"], r["tl_ref_s"], r["compile_s"], r["compile_ref_s"])
        assert r["tl_ratio_min"] <= r["tl_ratio"] <= r["tl_ratio_max"]
        assert r["compile_ratio_min"] <= r["compile_ratio"] <= r["compile_ratio_max"]
        growth = [r[f"{k}_growth"] for k in ("tl", "tl_ref", "compile", "compile_ref")]
        if r["sites"] == 3:
            assert _finite_positive(*growth)
        else:
            assert growth == [None] * 4
        # forced native: every site a custom call (forward: 2 per site; the gradient adds
        # the scatter-adds and the where's transposes); forced lax: none
        assert (r["native_calls"] >= 2 * r["sites"]) if r["impl"] == "native" else \
            r["impl"] == "auto" or r["native_calls"] == 0
    text = report.read_text()
    assert "`jax-ext-bench --only overhead --report PATH`" in text
    assert "| eager call |" in text and "| program | sites | impl | trace+lower |" in text
    assert "| case |" not in text  # no timed rows: no main table
    assert "overhead group: programs of 2 and 3 call sites" in text
    assert str(tmp_path) not in text and not re.search(r"\d{4}-\d\d-\d\d|UTC", text)


def test_overhead_rows_run_in_a_child_under_the_process_state(tmp_path, children):
    """Rows not about memory: each overhead case runs once, in a process of its own with
    the benchmark's allocator settings, whatever --memory says (default: both states),
    and the child is told the numbers of call sites."""
    out = tmp_path / "b.json"
    impl = "auto" if jax_ext.native_available() else "lax"
    assert bench.main(["--quick", "--impl", impl, "--only", "overhead eager where(c, x, y)",
                       "--rounds", "3", "--json", str(out),
                       "--plot", str(tmp_path / "b.png")]) == 0
    (cmd,) = children
    assert cmd[cmd.index("--memory") + 1] == "process"
    assert cmd[cmd.index("--sites") + 1] == "5,20"
    (row,) = json.loads(out.read_text())["results"]
    assert row["memory"] == "process" and row["pattern"] == "reused" and row["agrees"]


def test_overhead_sites_by_run(capsys):
    """The lowering rows' numbers of call sites: the issue's 100 and 400 when the run is
    the overhead group alone, fewer in a run of every group (the gradient's compile at
    400 sites takes minutes), fewest with --quick; --sites sets them."""
    from jax_ext.bench import cli, kinds, overhead

    def sites(*argv):
        return cli._sites(cli._parser().parse_args(list(argv), namespace=cli._Options()))
    assert sites("--only", "overhead") == overhead.SITES_ALONE == (100, 400)
    assert sites("--only", "overhead lowering") == overhead.SITES_ALONE
    assert sites("--full") == sites("--only", "gather") == overhead.SITES_FULL
    assert sites() == cli.SITES_DEFAULT  # the default run: fewer sites still
    assert sites("--quick", "--only", "overhead") == overhead.SITES_QUICK
    assert sites("--sites", "3,7") == (3, 7)
    for bad in ("4,2", "0,3", "5", "a,b"):
        with pytest.raises(SystemExit):
            sites("--sites", bad)
    assert "--sites" in capsys.readouterr().err
    # a full run holds the group, with the smaller pair
    full = [c for c in bench.all_cases(quick=False) if c["kind"] == kinds.OVERHEAD]
    assert len(full) == len(overhead.eager_cases()) + 2
    assert all(c["name"].startswith("overhead ") for c in full)
    assert [c["sites"] for c in full if c["op"] == "lowering"] == [[25, 100]] * 2


def test_default_run_is_a_selection_of_every_group_and_full_runs_every_case():
    """The default run (a first contact: minutes) picks cases of every group from the full
    sweep, the same cases at the same sizes; --full runs every case; --only names any case
    of the full sweep; the header and the report say which run it was."""
    from jax_ext.bench import cli, kinds

    def names(*argv):
        a = cli._parser().parse_args(list(argv), namespace=cli._Options())
        return [c["name"] for c in cli._selected(a, cli._sites(a))], cli._run_name(a)
    default, run = names()
    full, full_run = names("--full")
    assert "default" in run and "--full" in run and "full sweep" in full_run
    assert [n for n in full if n in default] == default and len(default) < len(full) / 2
    by_kind = {c["name"]: c["kind"] for c in bench.all_cases(quick=False)}
    assert {by_kind[n] for n in default} == {*kinds.KINDS, kinds.OVERHEAD}  # every group
    assert len(set(names("--quick")[0])) == len(default)  # --quick: the same selection, smaller
    missing = next(n for n in full if n not in default)
    assert names("--only", missing)[0] == [missing]


def test_overhead_tables_read_ratios_and_growth():
    """The overhead tables: ratio = jnp / jax_ext (as everywhere in the benchmark), seconds
    of tracing and compiling, growth on the larger N only."""
    from jax_ext.bench.report import overhead_tables
    base = dict(kind="overhead", op="lowering", name="overhead lowering N-site program",
                pattern="lowering", impl="auto", grad=False, repeats=3, tl_s=0.5,
                tl_ref_s=0.25, tl_ratio=0.5, tl_ratio_min=0.4, tl_ratio_max=0.6,
                compile_s=2.5, compile_ref_s=2.0, compile_ratio=0.8, compile_ratio_min=0.7,
                compile_ratio_max=0.9, native_calls=0, agrees=True, tl_growth=None,
                tl_ref_growth=None, compile_growth=None, compile_ref_growth=None)
    rows = [dict(base, sites=100),
            dict(base, sites=400, tl_growth=4.2, tl_ref_growth=3.9, compile_growth=4.5,
                 compile_ref_growth=4.1)]
    eager = dict(kind="overhead", op="eager", name="overhead eager gather f32 64x8 n=16",
                 pattern="reused", ours_s=3e-5, ref_s=2e-5, ratio=0.67, ratio_min=0.6,
                 ratio_max=0.7, spread=0.1, native_ratio=0.7, lax_ratio=0.6, agrees=True,
                 picked="gather:native")
    md = overhead_tables([eager, *rows], markdown=True)
    assert "jnp's time / jax_ext's" in md and "100 and 400 call sites" in md
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert cells[2][:5] == ["gather f32 64x8 n=16", "30.0 us", "10%", "20.0 us",
                            "0.67x [0.60-0.70]"]
    head = cells[3]
    col = {h: i for i, h in enumerate(head)}
    assert cells[5][col["trace+lower"]] == "500.0 ms" and cells[5][col["compile"]] == "2.50 s"
    assert cells[5][col["trace+lower growth"]] == "-"
    assert cells[6][col["trace+lower growth"]] == "4.20x (jnp 3.90x)"
    assert cells[6][col["compile growth"]] == "4.50x (jnp 4.10x)"
    assert overhead_tables([dict(eager, kind="single calls")]) == ""


@pytest.mark.parametrize("marker,left_out", [('python_version < "3"', True),
                                             ('python_version >= "3"', False)])
def test_onnxruntime_column_says_why_it_is_absent(monkeypatch, marker, left_out):
    """Without onnxruntime the report's header and first line say why its column is absent:
    the bench extra's marker leaves it out on this Python (no wheel), or it was just not
    installed. The marker is read from the installed package's metadata."""
    import importlib.metadata
    import sys

    from jax_ext.bench import report
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: [
        f'onnxruntime>=1.17; {marker} and extra == "bench"', 'onnx>=1.15; extra == "bench"',
        'onnxruntime>=1.17; extra == "onnx"'])
    why = report.onnxruntime_absent()
    python = ".".join(map(str, sys.version_info[:2]))
    if left_out:
        assert why == (f"absent: no onnxruntime wheel for Python {python}, so the bench extra "
                       "leaves it out")
    else:
        assert why.startswith("not installed")
    meta = {"onnxruntime": None, "onnxruntime_absent": why}
    assert report.onnxruntime_text(meta) == why
    assert report.onnxruntime_text({"onnxruntime": "1.32.0"}) == "1.32.0"
