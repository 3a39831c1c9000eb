"""jax_ext.tune: the search and its stopping rule with a fake clock (no timings are
asserted), the cache (per machine and versions, off by environment or context), explain's
report of a tuned site, and the guarantee that a tuned program gives the very bits of an
untuned one."""
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from jax_ext.auto import search, stats, store, tuning
from references import assert_bits_equal


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test its own cache directory (never the user's)."""
    monkeypatch.setenv("JAX_EXT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tuning.json"


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# --- the stopping rule -------------------------------------------------------------------

def test_median_interval_is_the_binomial_order_statistic_interval():
    # n = 10: P(B <= 1) = 11/1024 < 0.025 < P(B <= 2) = 56/1024: the 2nd and 9th values
    xs = [float(v) for v in range(10)]
    assert stats.median_interval(xs) == (1.0, 8.0)
    # too few values to say anything at 95%
    assert stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (-math.inf, math.inf)
    # coverage by brute force: the interval covers the median of the distribution in at
    # least 95% of samples
    rng = np.random.default_rng(0)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (
        stats.median_interval(rng.standard_normal(15).tolist()) for _ in range(2000)))
    assert hits / 2000 >= 0.95


def _pairs(ratio, noise, clock, seed=0, call_s=1e-3):
    """time_pair for a candidate `ratio` times the incumbent, with lognormal noise; each
    pair advances the fake clock by the time it took."""
    rng = np.random.default_rng(seed)

    def pair(i):
        a = call_s * math.exp(noise * rng.standard_normal())
        b = call_s * ratio * math.exp(noise * rng.standard_normal())
        clock.t += a + b
        return a, b
    return pair


@pytest.mark.parametrize("ratio,want", [(0.7, "better"), (1.0, "not better"),
                                        (1.3, "not better")])
def test_compare_settles_clear_differences_early(ratio, want):
    clock = FakeClock()
    c = stats.compare(_pairs(ratio, 0.05, clock), min_gain=0.03, deadline=1e9, clock=clock)
    assert c.verdict == want and c.rounds < 12, c
    assert c.ratio == pytest.approx(ratio, rel=0.1)


def test_compare_within_noise_is_undecided_and_bounded():
    """A gain of about the minimum, buried in noise: no verdict, at most max_pairs rounds;
    with a deadline, no more than the minimum once it has passed."""
    clock = FakeClock()
    c = stats.compare(_pairs(0.97, 0.3, clock, seed=1), min_gain=0.03, deadline=1e9,
                       clock=clock)
    assert c.verdict == "undecided" and c.rounds == 40, c
    clock = FakeClock()
    c = stats.compare(_pairs(0.97, 0.3, clock, seed=1), min_gain=0.03, deadline=0.0,
                       clock=clock)
    assert c.rounds == 6


def test_compare_out_of_rounds_lets_a_clear_median_decide():
    """A large gain in heavy noise leaves the interval open after max_pairs rounds: the
    median decides ("likely better"), and the search keeps the switch."""
    clock = FakeClock()
    c = stats.compare(_pairs(0.75, 0.6, clock, seed=3), min_gain=0.03, deadline=1e9,
                       clock=clock)
    assert c.verdict == "likely better" and c.rounds == 40 and c.ratio < 0.94, c
    site = search.Tunable("k", "gather", "f.py:1", "lax", 1e-3)
    now, results = search.search(
        [site], lambda a, b: c if a != b else stats.Comparison("undecided", 0.9, 1, 0.9, 40),
        deadline=1e9, clock=clock)
    assert now == {"k": "native"} and "not settled" in str(results[0]), results


# --- the search ----------------------------------------------------------------------------

def _program(costs, interaction=0.0):
    """A fake program: its time per call is 1 ms plus, per site, the cost of its choice;
    `interaction` is added when every site is native (their gains do not add up)."""
    def time(assignment):
        t = 1e-3 + sum(costs[k][v] for k, v in assignment.items())
        if interaction and all(v == "native" for v in assignment.values()):
            t += interaction
        return t
    return time


def _measure(time, clock, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)

    def measure(a, b):
        def pair(i):
            ta = time(a) * math.exp(noise * rng.standard_normal())
            tb = time(b) * math.exp(noise * rng.standard_normal())
            clock.t += ta + tb
            return ta, tb
        return stats.compare(pair, min_gain=0.03, deadline=1e9, clock=clock)
    return measure


def _sites(*specs):
    return [search.Tunable(k, "gather", f"f.py:{n}", impl, stake)
            for n, (k, impl, stake) in enumerate(specs)]


def test_search_keeps_the_flips_that_pay_and_only_those():
    costs = {"a": {"native": 0.2e-3, "lax": 0.9e-3},   # the model chose lax: wrong
             "b": {"native": 0.5e-3, "lax": 0.1e-3},   # the model chose lax: right
             "c": {"native": 0.3e-3, "lax": 0.31e-3}}  # a tie: the model's choice stays
    clock = FakeClock()
    sites = _sites(("a", "lax", 1e-4), ("b", "lax", 3e-4), ("c", "native", 0.0))
    final, results = search.search(sites, _measure(_program(costs), clock), 1e9, clock)
    assert final == {"a": "native", "b": "lax", "c": "native"}
    by = {r.key: r for r in results}
    assert [r.key for r in results] == ["b", "a", "c"]  # the largest stake first
    assert by["a"].verdict == "measured faster" and by["a"].native_s < by["a"].lax_s
    assert by["b"].impl == "lax" and by["b"].verdict == "kept: not faster"
    assert by["c"].impl == "native" and by["c"].verdict.startswith("kept")
    assert all(r.rounds >= 6 for r in results)


def test_search_gives_up_a_combination_that_is_not_faster():
    """Each flip measured faster on top of the ones before, but the combination, timed
    against the model's choices at the end, was not (noise, drift, an interaction the
    rounds missed): the model's choices come back."""
    clock = FakeClock()
    sites = _sites(("a", "lax", 1.0), ("b", "lax", 0.5))
    start = {"a": "lax", "b": "lax"}
    seen = []

    def measure(inc, cand):
        seen.append((inc, cand))
        if inc == start and cand == {"a": "native", "b": "native"}:  # the confirmation
            return stats.Comparison("not better", 1.05, 1e-3, 1.05e-3, 12)
        return stats.Comparison("better", 0.8, 1e-3, 0.8e-3, 7)
    final, results = search.search(sites, measure, 1e9, clock)
    assert final == start and len(seen) == 3
    assert [r.impl for r in results] == ["lax", "lax"]
    assert all(r.verdict == "kept: the combination was not faster" for r in results)
    # a combination that holds up is kept
    final, _ = search.search(sites, _measure(_program(
        {"a": {"native": 0.0, "lax": 0.5e-3}, "b": {"native": 0.0, "lax": 0.5e-3}}), clock),
        1e9, clock)
    assert final == {"a": "native", "b": "native"}
    # and one whose second flip loses to an interaction never takes it
    final, _ = search.search(sites, _measure(_program(
        {"a": {"native": 0.0, "lax": 0.5e-3}, "b": {"native": 0.0, "lax": 0.5e-3}},
        interaction=2e-3), clock), 1e9, clock)
    assert final == {"a": "native", "b": "lax"}


def test_search_stops_at_the_deadline():
    costs = {k: {"native": 0.0, "lax": 1e-3} for k in "abc"}
    clock = FakeClock()
    sites = _sites(("a", "lax", 3), ("b", "lax", 2), ("c", "lax", 1))
    measure = _measure(_program(costs), clock)
    final, results = search.search(sites, measure, deadline=0.02, clock=clock)
    timed = [r for r in results if r.rounds]
    assert 1 <= len(timed) < 3 and clock.t < 0.1
    assert all(r.verdict == "not timed: out of time" and r.impl == "lax"
               for r in results if not r.rounds)


# --- tune on real programs, timed by a fake clock -----------------------------------------

def _gather_program():
    t = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
    i = np.random.default_rng(1).integers(0, 4096, 2048).astype(np.int32)
    return jax.jit(lambda t, i: jnp.tanh(jax_ext.gather(t, [0], 0, i)).sum(-1)), (t, i)


def _fake_times(monkeypatch, faster):
    """_Program.time without running anything: `faster` ('native' or 'lax') is what a
    tuned site runs fastest with; each call advances the fake clock."""
    clock = FakeClock()

    def time(self, assignment, pattern, trim=False):
        t = 1e-3 * (1 + sum(0.5 for v in assignment.values() if v != faster))
        clock.t += t
        return t
    monkeypatch.setattr(tuning._Program, "time", time)
    return clock


@pytest.mark.parametrize("faster", ["native", "lax"])
def test_tune_stores_the_measured_choice_and_auto_takes_it(monkeypatch, cache, faster):
    if not jax_ext.native_available():
        pytest.skip("auto decides only with the native module")
    fn, args = _gather_program()
    (before,) = jax_ext.explain(fn, *args)
    compiled_before = fn.lower(*args).as_text()
    clock = _fake_times(monkeypatch, faster)
    report = jax_ext.tune(fn, *args, budget_s=5, progress=False, _clock=clock)
    (r,) = report.sites
    assert (r.op, r.key, r.model_impl, r.impl) == ("gather", before.site, before.impl, faster)
    assert report.stored == str(cache) and cache.exists()
    (after,) = jax_ext.explain(fn, *args)
    assert after.impl == faster and after.reason.startswith("tuned: ") and "rounds" in after.reason
    assert after.site == before.site and after.est_native_s == before.est_native_s
    # the jitted function is compiled again with the stored choice
    text = fn.lower(*args).as_text()
    assert ("custom_call @jax_ext_gather" in text) == (faster == "native")
    if before.impl != faster:
        assert text != compiled_before
    # a tuning(False) block, and a process with the cache off, see the model again
    with jax_ext.tuning(False):
        (model,) = jax_ext.explain(fn, *args)
    assert model.impl == before.impl and model.reason.startswith("est. native")
    stored = json.loads(cache.read_text())
    (machine,) = stored["machines"]
    assert jax.__version__ in machine and jax_ext.__version__ in machine
    assert stored["machines"][machine][before.site]["impl"] == faster


def test_tune_with_the_cache_off_measures_but_stores_nothing(monkeypatch, cache):
    if not jax_ext.native_available():
        pytest.skip("auto decides only with the native module")
    fn, args = _gather_program()
    clock = _fake_times(monkeypatch, "native")
    with jax_ext.tuning(False):
        report = jax_ext.tune(fn, *args, budget_s=5, progress=False, _clock=clock)
    assert report.sites and report.stored is None and not cache.exists()
    monkeypatch.setenv("JAX_EXT_TUNING", "off")
    report = jax_ext.tune(fn, *args, budget_s=5, progress=False, _clock=clock)
    assert report.sites and report.stored is None and not cache.exists()


def test_cache_is_per_machine_and_survives_a_bad_file(cache):
    cached = store.Store(str(cache))
    t = store.Tuned("native", 1e-3, 2e-3, 9)
    cached.update("machine A", {"site-1": t})
    cached.update("machine B", {"site-1": store.Tuned("lax", 3e-3, 1e-3, 7)})
    again = store.Store(str(cache))
    assert again.sites("machine A") == {"site-1": t}
    assert again.sites("machine B")["site-1"].impl == "lax" and again.sites("C") == {}
    cache.write_text("{not json")
    assert store.Store(str(cache)).sites("machine A") == {}
    cache.write_text(json.dumps({"format": 99, "machines": {}}))
    assert store.Store(str(cache)).machines == {}


def test_environment_turns_the_cache_off_in_a_fresh_process(tmp_path):
    """JAX_EXT_TUNING=off: auto ignores a stored choice; the cache directory follows
    JAX_EXT_CACHE_DIR."""
    if not jax_ext.native_available():
        pytest.skip("auto decides only with the native module")
    fn, args = _gather_program()
    (d,) = jax_ext.explain(fn, *args)
    flipped = "lax" if d.impl == "native" else "native"
    cached = store.Store(str(tmp_path / "c" / "tuning.json"))
    cached.update(store.machine_key(), {d.site: store.Tuned(flipped, 1e-3, 1e-3, 6)})
    code = textwrap.dedent("""
        import numpy as np, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)  # as the suite runs: the same types
        import jax_ext
        t = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
        i = np.random.default_rng(1).integers(0, 4096, 2048).astype(np.int32)
        fn = jax.jit(lambda t, i: jnp.tanh(jax_ext.gather(t, [0], 0, i)).sum(-1))
        print(jax_ext.explain(fn, t, i)[0].impl)
    """)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(jax_ext.__file__)))
    for env, want in (({}, flipped), ({"JAX_EXT_TUNING": "off"}, d.impl)):
        e = dict(os.environ, JAX_EXT_CACHE_DIR=str(tmp_path / "c"), PYTHONPATH=pkg, **env)
        e.pop("JAX_EXT_TUNING", None) if not env else None
        r = subprocess.run([sys.executable, "-P", "-c", code], env=e, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[-1] == want, (env, r.stdout)


# --- tuning never changes a result ---------------------------------------------------------

def _programs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(4096).astype(np.float32)
    x[:4] = np.array([0x7fc00123, 0xff800001, 0x80000000, 0x00000001], np.uint32).view(np.float32)
    t = rng.standard_normal((512, 24)).astype(np.float32)
    i = rng.integers(-3, 515, 300).astype(np.int32)

    def step(x, t, i):
        h = jax_ext.where(x > 0, x * 2, -x)
        g = jax_ext.gather(t * 2, [0], 0, i, pad_value=-1.0)
        sel = jax_ext.select(g > 0, g, jnp.float32(0))
        return h.sum() + sel.sum(), h, sel
    grad = jax.grad(lambda t, i, x: (jnp.tanh(jax_ext.gather(t, [0], 0, i)) ** 2).sum()
                    + jax_ext.where(x > 0, x, 0.0).sum(), argnums=(0, 2))
    return [(step, (x, t, i)), (grad, (t, i, x))]


@pytest.mark.parametrize("k", [0, 1])
def test_every_assignment_of_choices_gives_the_same_bits(k):
    """A tuned program runs some combination of choices: every combination of native and
    lax at its sites gives the model's bits exactly (forward and gradient programs with
    select, gather and scatter-add sites, NaN payloads, -0.0 and denormals)."""
    if not jax_ext.native_available():
        pytest.skip("needs the native module: without it every site is lax")
    fn, args = _programs()[k]
    prog = tuning._Program(fn, args, {}, ("reused",), FakeClock())
    sites = prog.sites()
    assert len(sites) >= 2 and {s.op for s in sites} >= ({"select", "gather"} if k == 0
                                                          else {"gather", "scatter_add"})
    with jax_ext.tuning(False):
        want = jax.jit(fn)(*args)
    for combo in itertools.product(("native", "lax"), repeat=len(sites)):
        assignment = {s.key: c for s, c in zip(sites, combo)}
        got = prog.compiled(assignment)(*prog.dyn)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert_bits_equal(a, b)


# --- on jax's default backend (the GPU check runs this on the GPU) -----------------------
@pytest.mark.gpu
def test_auto_and_tune_on_the_default_backend():
    """auto lowers for the device the program runs on, and tune measures there: on the CPU
    it times every call site; elsewhere every call site runs lax, there is nothing to
    choose, and tune measures and stores nothing. The bits equal numpy's either way."""
    rng = np.random.default_rng(4)
    c = rng.integers(0, 2, (64, 8)).astype(bool)
    x, y = (rng.standard_normal((64, 8)).astype(np.float32) for _ in range(2))
    x[0, :2] = [-0.0, np.uint32(0x7f800011).view(np.float32)]  # a signalling NaN
    src, idx = rng.standard_normal((40, 8)).astype(np.float32), rng.integers(-2, 44, 30)

    def f(c, x, y, src, idx):
        return jax_ext.where(c, x, y), jax_ext.gather(src, [0], 0, idx, align_bytes=None)
    ok = (idx >= 0) & (idx < 40)
    want = (np.where(c, x, y), np.where(ok[:, None], src[np.clip(idx, 0, 39)], 0))
    on_cpu = jax.default_backend() == "cpu"
    with jax_ext.implementation("native"):  # for the default device: kernels on CPU only
        hlo = jax.jit(f).lower(c, x, y, src, idx).as_text()
    assert ("custom_call @jax_ext_" in hlo) == (on_cpu and jax_ext.native_available())
    for g, w in zip(jax.jit(f)(c, x, y, src, idx), want):
        assert_bits_equal(g, w)
    report = jax_ext.tune(f, c, x, y, src, idx, budget_s=3, progress=False)
    if on_cpu:
        assert sorted(r.op for r in report.sites) == ["gather", "select"]
    else:
        assert report.sites == [] and report.stored is None, report
    for g, w in zip(jax.jit(f)(c, x, y, src, idx), want):
        assert_bits_equal(g, w)


def test_tune_off_the_cpu_measures_and_stores_nothing(monkeypatch, cache):
    """The branch the GPU check takes, here with jax's default backend said to be a GPU."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    f = lambda t, i: jax_ext.gather(t, [0], 0, i).sum()  # noqa: E731
    report = jax_ext.tune(f, np.ones((64, 8), np.float32), np.arange(4), budget_s=1,
                          progress=False)
    assert report.sites == [] and report.stored is None and not cache.exists()
