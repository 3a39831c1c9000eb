"""Measuring: alternating pairs of calls, and a noise-aware stop (a distribution-free
confidence interval of the median ratio)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    """An incumbent and a candidate timed in alternation. `verdict`: "better" (the
    candidate is faster by more than the minimum gain, with confidence), "not better"
    (with confidence, it is not), "likely better" (the limits came first, and the median
    shows twice the minimum gain) or "undecided" (the limits came first)."""
    verdict: str
    ratio: float   # median of candidate / incumbent over the pairs
    inc_s: float   # median seconds per call
    cand_s: float
    rounds: int


def median_interval(xs: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """A distribution-free confidence interval for the median (order statistics: the
    number of values below the median is binomial(n, 1/2))."""
    s, n = sorted(xs), len(xs)
    k, cum = -1, 0.0
    while k + 1 < n:
        p = math.comb(n, k + 1) / 2 ** n
        if cum + p > alpha / 2:
            break
        cum += p
        k += 1
    return (s[k], s[n - 1 - k]) if k >= 0 else (-math.inf, math.inf)


def compare(time_pair: Callable[[int], tuple[float, float]], *, min_gain: float,
            deadline: float, clock: Callable[[], float], min_pairs: int = 6,
            max_pairs: int = 40) -> Comparison:
    """Pairs (incumbent, candidate) until the candidate's gain is settled either way, or
    `max_pairs` or the deadline (after `min_pairs`) is reached."""
    inc: list[float] = []
    cand: list[float] = []
    ratios: list[float] = []
    verdict = "undecided"
    for i in range(max_pairs):
        if i >= min_pairs and clock() > deadline:
            break
        a, b = time_pair(i)
        inc.append(a)
        cand.append(b)
        ratios.append(b / max(a, 1e-12))
        if len(ratios) >= min_pairs:
            lo, hi = median_interval(ratios)
            if hi < 1 - min_gain:
                verdict = "better"
                break
            if lo > 1 - min_gain:
                verdict = "not better"
                break
    ratio = statistics.median(ratios)
    # Out of rounds, a decision is still due: every choice gives the same bits, so the
    # median, the best estimate there is, decides, with a margin that leans to the model
    # (calls that sometimes fault in a fresh result can keep the interval open for good).
    if verdict == "undecided" and ratio < 1 - 2 * min_gain:
        verdict = "likely better"
    return Comparison(verdict, ratio, statistics.median(inc), statistics.median(cand),
                      len(ratios))
