"""Measured decisions: :func:`tune` times a program under the alternatives of its call
sites and records the faster choice per site, and ``auto`` then takes it.

Every path gives the same bits, so a measured choice can change only the time. A choice
is stored per call-site fingerprint (analysis.fingerprint: the op, its types and static
params, what produces its operands and consumes its result) in a JSON file under the user's
cache directory, keyed by the machine (CPU model, cores) and the jax, jaxlib and jax_ext
versions. ``JAX_EXT_TUNING=off`` (or a ``with jax_ext.tuning(False):`` block) turns the
cache off: ``auto`` then decides by the cost model alone and :func:`tune` stores nothing.
``JAX_EXT_CACHE_DIR`` moves the cache.

Which choices a program compiles with is part of jit's cache key (the config state
``jax_ext_tuning_state``): a call after :func:`tune` compiles again with the new choices.

The cache file is store.py's, the timing statistics stats.py's, the search over call sites
search.py's; this module holds the state a lowering reads and :func:`tune` itself.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _compat
from .explain import Decision, recording
from .model import Choice
from .search import SiteResult, Tunable, search
from .stats import compare
from .store import Tuned, enabled_by_env, machine_key, store

# --- which choices a lowering sees ------------------------------------------------------
# The state's value is part of jit's cache key: "off", "on:<generation>" (bumped whenever
# tune stores choices) or "try:<token>" (a candidate assignment while tune measures it).
_state = _compat.tuning_state("on:0" if enabled_by_env() else "off")
_generation = 0
_trials: dict[str, dict[str, str]] = {}


@contextlib.contextmanager
def tuning(enabled: bool = True) -> Iterator[None]:
    """Turn measured choices on or off inside a block.

    Under ``tuning(False)``, implementation ``"auto"`` decides by its cost model alone, as
    with the environment variable ``JAX_EXT_TUNING=off``; :func:`jax_ext.tune` still
    measures, but stores nothing. A function traced in one setting is not reused in the
    other: the setting is part of jit's cache key.

    Args:
        enabled: ``True`` (the default outside such a block, unless the environment
            variable says ``off``) or ``False``.

    Returns:
        A context manager.
    """
    with _state(f"on:{_generation}" if enabled else "off"):
        yield


def active() -> bool:
    """Are stored choices consulted where the program is being traced now?"""
    return str(_state.value).startswith("on")


@contextlib.contextmanager
def _trying(assignment: Mapping[str, str]) -> Iterator[None]:
    """Lower with `assignment` (site fingerprint -> "native" | "lax") at those sites."""
    token = hashlib.sha256(json.dumps(sorted(assignment.items())).encode()).hexdigest()[:16]
    _trials[token] = dict(assignment)
    with _state(f"try:{token}"):
        yield


def state() -> str:
    """The tuning state where the program is being traced now (what lookup reads)."""
    return str(_state.value)


def lookup(site: str) -> Choice | None:
    """The measured (or trial) choice at `site`, or None: the cost model decides."""
    value = state()
    if value.startswith("try:"):
        impl = _trials.get(value[4:], {}).get(site)
        return None if impl is None else Choice(impl == "native", f"tuning: trying {impl}")
    if value == "off":
        return None
    tuned = store().sites(machine_key()).get(site)
    return None if tuned is None else Choice(tuned.impl == "native", tuned.reason())


def _bump() -> None:
    """New stored choices: programs traced from now on see them."""
    global _generation
    _generation += 1
    if active():
        _compat.set_tuning_state(f"on:{_generation}")


# --- the user's program, compiled per assignment and timed ------------------------------

class _Program:
    """fn(*args, **kwargs) compiled for each assignment of choices, called as a user
    would: "reused" (the same argument arrays each call) or "fresh" (arrays made right
    before each call, untimed, as a program's new inputs)."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any],
                 kwargs: Mapping[str, Any], patterns: Sequence[str],
                 clock: Callable[[], float]) -> None:
        import jax
        import numpy as np

        from .explain import traceable
        self.traced, self.dyn = traceable(fn, args, kwargs)
        self.dyn = [jax.numpy.asarray(a) if not isinstance(a, jax.Array) else a
                    for a in self.dyn]
        self.host = [np.asarray(a) for a in self.dyn]
        self.patterns, self.clock = tuple(patterns), clock
        self._compiled: dict[tuple[tuple[str, str], ...], Any] = {}
        self.reps = 1
        self.faults = 0.0  # per call, in the last time()

    def sites(self) -> list[Tunable]:
        """The call sites auto decides by its cost model, one per fingerprint."""
        import jax
        with tuning(False), recording() as decisions:
            jax.jit(self.traced).trace(*self.dyn).lower(lowering_platforms=("cpu",))
        return _tunable(decisions)

    def compiled(self, assignment: Mapping[str, str]) -> Any:
        import jax
        key = tuple(sorted(assignment.items()))
        if key not in self._compiled:
            with _trying(assignment):
                self._compiled[key] = jax.jit(self.traced).lower(*self.dyn).compile()
        return self._compiled[key]

    def _args(self, pattern: str) -> list[Any]:
        import jax
        import numpy as np
        if pattern != "fresh":
            return self.dyn
        out = [jax.device_put(np.array(h, copy=True), a.sharding)
               for h, a in zip(self.host, self.dyn)]
        _block(out)
        return out

    def time(self, assignment: Mapping[str, str], pattern: str, trim: bool = False) -> float:
        """Seconds per call, over self.reps blocking calls; self.faults: the page faults
        per call. `trim`: freed heap memory given back to the system before each call
        (untimed), so that its results are mapped anew whatever the calls before it left."""
        f = self.compiled(assignment)
        total = 0.0
        faults = 0
        for _ in range(self.reps):
            args = self._args(pattern)
            if trim:
                _give_back()
            f0 = _faults()
            t0 = self.clock()
            _block(f(*args))
            total += self.clock() - t0
            faults += _faults() - f0
        self.faults = faults / self.reps
        return total / self.reps

    def settle(self, assignment: Mapping[str, str], sample_s: float = 2e-4) -> None:
        """Warms up, and sets how many calls make one sample (short programs: several,
        so that a sample is well above the timer's resolution)."""
        for p in self.patterns:
            self.time(assignment, p)
        t = min(self.time(assignment, p) for p in self.patterns)
        self.reps = max(1, min(64, int(sample_s / max(t, 1e-7))))

    def pair(self, a: Mapping[str, str], b: Mapping[str, str], i: int) -> tuple[float, float]:
        """Round i: a and b called in each pattern, one after the other, the order
        alternating from round to round; the seconds of each summed over the patterns
        (the program's time in a mix of both). Where the two faulted differently (one in
        fresh mappings, the other on reused memory: which one glibc's heap happened to
        favour), the round is timed again with every call's results mapped anew, so that
        no choice rests on which side got warm memory."""
        got = self._pair(a, b, i, trim=False)
        if faults_differ(*got[2:]) and _give_back():
            got = self._pair(a, b, i, trim=True)
        return got[0], got[1]

    def _pair(self, a: Mapping[str, str], b: Mapping[str, str], i: int,
              trim: bool) -> tuple[float, float, float, float]:
        """pair's times, then the faults per call of a and of b."""
        ta = tb = fa = fb = 0.0
        for pattern in self.patterns:
            for first in ((b, a) if i % 2 else (a, b)):
                t = self.time(first, pattern, trim)
                if first is a:
                    ta, fa = ta + t, fa + self.faults
                else:
                    tb, fb = tb + t, fb + self.faults
        return ta, tb, fa, fb


def faults_differ(ours: float, theirs: float) -> bool:
    """Whether two sides ran under different memory states: one faulted in a fresh
    mapping (64 or more page faults per call) where the other hardly faulted (under 16)."""
    return max(ours, theirs) >= 64 and min(ours, theirs) < 16


def _faults() -> int:
    """Page faults of the whole process so far (every thread: XLA's pool included)."""
    try:
        import resource
    except ImportError:  # not Unix
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _give_back() -> bool:
    """Gives the C library's freed heap memory back to the system (glibc's malloc_trim;
    it changes no setting); False where there is no such call."""
    import ctypes
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def _block(tree: Any) -> None:
    import jax
    for leaf in jax.tree.leaves(tree):
        leaf.block_until_ready()


def _tunable(decisions: Sequence[Decision]) -> list[Tunable]:
    """Sites where the cost model chose (not forced, not out of the kernels' reach),
    one per fingerprint, with the stake of their two estimates summed."""
    out: dict[str, Tunable] = {}
    for d in decisions:
        if (d.requested != "auto" or d.site is None or d.est_native_s is None
                or d.est_lax_s is None or not d.reason.startswith("est.")):
            continue
        stake = abs(d.est_native_s - d.est_lax_s)
        prev = out.get(d.site)
        out[d.site] = Tunable(d.site, d.op, d.where if prev is None else prev.where, d.impl,
                           stake + (prev.stake_s if prev else 0.0))
    return list(out.values())


@dataclass
class Report:
    """What :func:`jax_ext.tune` measured and chose, site by site."""
    sites: list[SiteResult] = field(default_factory=list)
    seconds: float = 0.0
    stored: str | None = None  # the cache file written, or None (cache off, nothing timed)

    def choices(self) -> dict[str, str]:
        return {r.key: r.impl for r in self.sites}

    def __str__(self) -> str:
        head = (f"jax_ext.tune: {len(self.sites)} call site(s) in {self.seconds:.1f} s; "
                + (f"stored in {self.stored}" if self.stored else "nothing stored"))
        return "\n".join([head] + [f"  {r}" for r in self.sites])


def _progress(enabled: bool, clock: Callable[[], float], t0: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if enabled:
            print(f"jax_ext.tune [{clock() - t0:5.1f} s]: {msg}", file=sys.stderr, flush=True)
    return log


def tune(fn: Callable[..., Any], *args: Any, budget_s: float = 10.0, pattern: str = "both",
         min_gain: float = 0.03, progress: bool = True,
         _clock: Callable[[], float] = time.perf_counter, **kwargs: Any) -> Report:
    """Measure which implementation runs each call site of ``fn`` fastest, and keep it.

    ``fn(*args, **kwargs)`` is compiled with the cost model's choices, then with one call
    site's choice flipped at a time (native for lax, or lax for native; call sites that
    share a fingerprint move together), and each candidate is timed against the
    choices so far, call by call in alternation, until the difference is settled either
    way or the time runs out. A flip is kept where the program ran faster by more than
    ``min_gain`` with confidence; the combination is then timed against the model's
    choices and kept only if faster. The choices are stored in the tuning cache (see
    :func:`tuning`), and implementation ``"auto"`` takes them from then on, in this
    process and later ones on this machine: :func:`explain` then says
    ``tuned: 1.9 ms vs lax 3.1 ms, 24 rounds``. Every path gives the same bits, so tuning
    changes times, never results. On a GPU or TPU (jax's default backend is not the
    CPU) every call site runs lax, so ``tune`` measures and stores nothing.

    Args:
        fn: the program, a function or a ``jax.jit``-ed one, as for :func:`explain`.
        *args: example arguments, as for the call (arrays are traced; other leaves are
            passed as static values).
        budget_s: a bound on the whole search in seconds (compilations included); a site
            left untimed keeps the model's choice.
        pattern: ``"both"`` (the default: rounds alternate between the two), ``"reused"``
            (the same argument arrays every call) or ``"fresh"`` (arrays made right
            before each call, as new inputs are).
        min_gain: the least relative gain a flip must show, 0.03 = 3%.
        progress: print a line per step to stderr.
        **kwargs: keyword arguments of ``fn``.

    Returns:
        A :class:`Report`: per site, the model's and the measured choice, the program's
        median time either way and the rounds timed.

    Example:
        >>> import numpy as np, jax_ext
        >>> f = lambda t, i: jax_ext.gather(t, [0], 0, i).sum()
        >>> report = jax_ext.tune(f, np.ones((64, 8), np.float32), np.arange(4),
        ...                       budget_s=1, progress=False)
        >>> [r.op for r in report.sites]
        ['gather']
    """
    if pattern not in ("both", "reused", "fresh"):
        raise ValueError(f"tune: pattern must be 'both', 'reused' or 'fresh', got {pattern!r}")
    t0 = _clock()
    deadline, log = t0 + budget_s, _progress(progress, _clock, t0)
    import jax
    if jax.default_backend() != "cpu":
        # The kernels are CPU code: on any other device every call site lowers to lax, so
        # there is nothing to choose (and a choice stored here would steer the CPU's).
        log(f"done: jax's default backend is {jax.default_backend()}, where every call site "
            "runs lax; nothing to tune")
        return Report(seconds=_clock() - t0)
    patterns = ("reused", "fresh") if pattern == "both" else (pattern,)
    prog = _Program(fn, args, kwargs, patterns, _clock)
    sites = prog.sites()
    report = Report()
    if sites:
        prog.settle({s.key: s.model_impl for s in sites})
        measure = lambda a, b: compare(  # noqa: E731
            lambda i: prog.pair(a, b, i), min_gain=min_gain, deadline=deadline, clock=_clock)
        _, report.sites = search(sites, measure, deadline, _clock, log)
    report.seconds = _clock() - t0
    timed = {r.key: Tuned(r.impl, r.native_s, r.lax_s, r.rounds)
             for r in report.sites if r.rounds}
    if timed and enabled_by_env() and str(_state.value) != "off":
        store().update(machine_key(), timed)
        report.stored = store().path
        _bump()
    log(f"done: {sum(r.impl != r.model_impl for r in report.sites)} of {len(report.sites)} "
        f"site(s) changed from the model's choice")
    return report
