"""The search: one call site at a time from the cost model's choice (the largest stake
first), each flip kept where the program ran faster with confidence, then the combination
timed against the model's."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import fmt_s
from .stats import Comparison


@dataclass(frozen=True)
class Tunable:
    """A tunable call site (all call sites sharing one fingerprint move together)."""
    key: str
    op: str
    where: str
    model_impl: str
    stake_s: float  # how far apart the model's two estimates are


@dataclass
class SiteResult:
    """What tune found at one site."""
    key: str
    op: str
    where: str
    model_impl: str
    impl: str
    native_s: float = math.nan  # the program's median time with the site native
    lax_s: float = math.nan     # ... and with it lax
    rounds: int = 0
    verdict: str = "not timed"

    def __str__(self) -> str:
        if not self.rounds:
            return f"{self.where}: {self.op} -> {self.impl} (model; {self.verdict})"
        return (f"{self.where}: {self.op} -> {self.impl} ({self.verdict}; program "
                f"{fmt_s(self.native_s)} with native vs {fmt_s(self.lax_s)} with lax, "
                f"{self.rounds} rounds; the model chose {self.model_impl})")


def _other(impl: str) -> str:
    return "lax" if impl == "native" else "native"


def search(sites: Sequence[Tunable], measure: Callable[[dict[str, str], dict[str, str]],
                                                    Comparison],
           deadline: float, clock: Callable[[], float],
           log: Callable[[str], None] = lambda s: None
           ) -> tuple[dict[str, str], list[SiteResult]]:
    """Greedy: each site flipped in turn on top of the choices so far (the largest stake
    first), kept where the program ran faster with confidence; then the combination is
    timed against the model's, and given up if it is not faster."""
    start = {s.key: s.model_impl for s in sites}
    now = dict(start)
    results = []
    for k, s in enumerate(sorted(sites, key=lambda s: -s.stake_s)):
        r = SiteResult(s.key, s.op, s.where, s.model_impl, now[s.key])
        results.append(r)
        if clock() > deadline:
            r.verdict = "not timed: out of time"
            continue
        cand = dict(now, **{s.key: _other(now[s.key])})
        log(f"site {k + 1}/{len(sites)}: {s.op} at {s.where}, {now[s.key]} vs "
            f"{cand[s.key]}")
        c = measure(now, cand)
        times = {now[s.key]: c.inc_s, cand[s.key]: c.cand_s}
        r.native_s, r.lax_s, r.rounds = times["native"], times["lax"], c.rounds
        r.verdict = {"better": "measured faster", "not better": "kept: not faster",
                     "likely better": "faster by the median, not settled",
                     "undecided": "kept: within noise"}[c.verdict]
        if c.verdict in ("better", "likely better"):
            now = cand
        r.impl = now[s.key]
    return _confirm(start, now, results, measure, clock, deadline, log)


def _confirm(start: dict[str, str], now: dict[str, str], results: list[SiteResult],
             measure: Callable[[dict[str, str], dict[str, str]], Comparison],
             clock: Callable[[], float], deadline: float, log: Callable[[str], None]
             ) -> tuple[dict[str, str], list[SiteResult]]:
    if now == start:
        return now, results
    log("confirming the combination against the model's choices")
    c = measure(start, now)
    if c.ratio < 1:
        return now, results
    for r in results:  # the sites' gains did not add up: back to the model
        if r.impl != r.model_impl:
            r.impl, r.verdict = r.model_impl, "kept: the combination was not faster"
    return start, results
