"""The overhead group (``jax-ext-bench --only overhead``): what jax_ext costs outside its
kernels, each side against its jnp twin in the same process.

* ``overhead eager ...`` rows: one front-end (``where``, ``where`` with a Python scalar,
  ``select``, ``where3``, ``gather``) or ``jax.grad`` of a gather, called outside ``jit``
  on small arrays, the way a user types it at a prompt. They are cases like the single
  calls (timing.measure: alternating calls, each waited for, medians over rounds), with
  reused arguments only: the time is the dispatch, which fresh arguments would only pad
  with the same transfer on both sides.
* ``overhead eager ... fresh Python scalars`` rows: an eager loop that gives a front-end a
  Python scalar it has never seen at every call (a threshold or fill value a loop varies):
  ``where(c, x, s)``, ``select(c, s, x)``, ``where3(c, x, s)`` (0-d) and ``gather``'s
  ``pad_value``, against ``jnp.where`` and ``jnp.take``'s ``fill_value``. They time
  themselves (``measure_scalar_loop``): each round times each side over a block of new
  values, the sides in balanced orders; the time is per call, and the row counts the XLA
  compiles each side made while timed (jax.monitoring's events), which a jit cache that
  grows with the values would show.
* ``overhead lowering ...`` rows: a program of N call sites (each site one ``gather`` and
  one ``where`` on small arrays, summed) and its gradient, traced and lowered
  (``jax.jit(f).trace(*args).lower()``) and compiled (``.compile()``), each time a new
  function object so that jit's caches do not serve it, at two N, for the jnp twin and for
  jax_ext under ``implementation`` "auto", "lax" and "native". They time themselves
  (``measure_lowering``) rather than calls.
"""
from __future__ import annotations

import contextlib
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

import jax_ext

from .._names import ImplementationName
from .kinds import OVERHEAD
from .records import Case, JaxFn, Made, Row

Array = jax.Array

# The two numbers of call sites of the lowering rows: with --only overhead (the issue's
# pair), in a run of other groups too (smaller: the gradient's XLA compile at 400 sites
# takes about a minute a repetition on two cores), and with --quick.
SITES_ALONE = (100, 400)
SITES_FULL = (25, 100)
SITES_QUICK = (5, 20)
REPEATS = 3  # each lowering measurement, alternating the sides; medians
IMPLS: tuple[ImplementationName, ...] = ("auto", "lax", "native")
SIDES = ("jnp", *IMPLS)
# The program's arrays: a (ROWS, COLS) f32 table, LOOKUPS rows gathered per site.
ROWS, COLS, LOOKUPS = 64, 8, 16
ELEMENTS = 256  # the eager selects' operands


# --- eager calls ----------------------------------------------------------------------

def _eager(name: str, ours: JaxFn, theirs: JaxFn,
           make_args: Callable[[np.random.Generator], tuple[npt.ArrayLike, ...]],
           elements: int) -> Case:
    def make() -> Made:  # not jitted: each call dispatches eagerly
        return ours, theirs, tuple(jnp.asarray(a) for a in make_args(np.random.default_rng(0)))
    return Case(name=f"overhead eager {name}", op="eager", dtype="float32",
                elements=elements, bytes=0, make=make, chain=False, kind=OVERHEAD,
                impls=True, patterns=("reused",))


def _cxy(rng: np.random.Generator) -> tuple[npt.ArrayLike, ...]:
    return (rng.random(ELEMENTS) < 0.5, rng.standard_normal(ELEMENTS).astype(np.float32),
            rng.standard_normal(ELEMENTS).astype(np.float32))


def _table_index(rng: np.random.Generator) -> tuple[npt.ArrayLike, ...]:
    return (rng.standard_normal((ROWS, COLS)).astype(np.float32),
            rng.integers(0, ROWS, LOOKUPS).astype(np.int32))


def _gather(t: Array, i: Array) -> Array:
    # align_bytes=None: the result keeps the table's 8 columns, jnp.take's shape
    return jax_ext.gather(t, [0], 0, i, align_bytes=None)


def _take(t: Array, i: Array) -> Array:
    return jnp.take(t, i, axis=0)


def _grad_of(take: Callable[[Array, Array], Array]) -> JaxFn:
    # jax.grad made at every call, as `jax.grad(f)(x)` typed at a prompt makes it
    return lambda t, i: jax.grad(lambda t: jnp.sum(take(t, i)))(t)


def eager_cases() -> list[Case]:
    f32 = f"f32 {ELEMENTS}"
    table = f"f32 {ROWS}x{COLS} n={LOOKUPS}"
    return [
        _eager(f"where(c, x, y) {f32}", jax_ext.where, jnp.where, _cxy, ELEMENTS),
        _eager(f"where(c, x, 0.0) {f32}", lambda c, x: jax_ext.where(c, x, 0.0),
               lambda c, x: jnp.where(c, x, 0.0), lambda rng: _cxy(rng)[:2], ELEMENTS),
        _eager(f"select(c, x, y) {f32}", jax_ext.select, jnp.where, _cxy, ELEMENTS),
        _eager(f"where3(c, x, y) {f32}", jax_ext.where3, jnp.where, _cxy, ELEMENTS),
        _eager(f"gather {table}", _gather, _take, _table_index, LOOKUPS * COLS),
        _eager(f"grad of sum(gather) {table}", _grad_of(_gather), _grad_of(_take),
               _table_index, ROWS * COLS),
    ] + scalar_loop_cases()


# --- eager loops over fresh Python scalars ----------------------------------------------

# The values each round gives each side: jnp.take compiles once per fill_value, so its loop
# is shorter (a compile per call); the ratio is per call either way.
LOOP_VALUES = 120
PAD_LOOP_VALUES = 12
LOOP_ROUNDS = 9  # rounds of the scalar loops; medians
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class _Fresh:
    """Python floats never given before: `take(n)` returns the next n."""
    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> list[float]:
        k, self.next = self.next, self.next + n
        return [0.5 + (k + j) * 2.0 ** -20 for j in range(n)]


def _loop(call: Callable[[float], Array], values: Sequence[float]) -> tuple[float, Array]:
    """Seconds per call of `call` over `values`, each result waited for; the last one."""
    out: Array | None = None
    t0 = time.perf_counter()
    for v in values:
        out = call(v)
        out.block_until_ready()
    assert out is not None
    return (time.perf_counter() - t0) / len(values), out


def _same_bits(a: Array, b: Array) -> bool:
    x, y = np.asarray(a), np.asarray(b)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@contextlib.contextmanager
def _compiles() -> Iterator[list[int]]:
    """The number of XLA compiles in the block (jax.monitoring's compile events)."""
    count = [0]

    def listen(event: str, duration_secs: float, **_: str | int) -> None:
        count[0] += event == _COMPILE_EVENT
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def measure_scalar_loop(ours: Callable[..., Array], theirs: Callable[..., Array],
                        args: Sequence[Array], n: int, rounds: int) -> list[Row]:
    """One eager row: `ours(*args, v)` (under auto, native and lax) and `theirs(*args, v)`
    over `n` fresh Python floats a side each round, the sides in balanced orders; times per
    call (medians, the per-round ratios jnp / jax_ext), whether the two sides agree bit for
    bit on the same values, and the compiles each side made while timed."""
    from .timing import _forced, _orders, _ratio
    sides: dict[str, tuple[Callable[[float], Array], Callable[[], Any]]] = {
        "ours": (lambda v: ours(*args, v), contextlib.nullcontext),
        "ref": (lambda v: theirs(*args, v), contextlib.nullcontext),
        "native": (lambda v: ours(*args, v), _forced("native")),
        "lax": (lambda v: ours(*args, v), _forced("lax"))}
    fresh = _Fresh()
    same = fresh.take(2)
    agrees = all(_same_bits(ours(*args, v), theirs(*args, v)) for v in same)
    for call, ctx in sides.values():  # the first call of each side compiles
        with ctx():
            call(fresh.take(1)[0]).block_until_ready()
    names = list(sides)
    times: dict[str, list[float]] = {k: [] for k in names}
    compiles = dict.fromkeys(names, 0)
    orders = _orders(len(names))
    for r in range(rounds):
        for s in orders[r % len(orders)]:
            call, ctx = sides[names[s]]
            with ctx(), _compiles() as c:
                times[names[s]].append(_loop(call, fresh.take(n))[0])
            compiles[names[s]] += c[0]
    ratio = _ratio(times["ref"], times["ours"])
    mo = statistics.median(times["ours"])
    return [dict(pattern="fresh scalars", ours_s=mo, ref_s=statistics.median(times["ref"]),
                 ratio=ratio["median"], ratio_min=ratio["min"], ratio_max=ratio["max"],
                 ratio_q1=ratio["q1"], ratio_q3=ratio["q3"],
                 spread=(max(times["ours"]) - min(times["ours"])) / mo, agrees=agrees,
                 rounds=rounds, values=n * rounds, picked="-", faults_differ=False,
                 native_ratio=_ratio(times["ref"], times["native"])["median"],
                 lax_ratio=_ratio(times["ref"], times["lax"])["median"],
                 compiles=compiles["ours"] + compiles["native"] + compiles["lax"],
                 ref_compiles=compiles["ref"])]


def _scalar_loop(name: str, ours: Callable[..., Array], theirs: Callable[..., Array],
                 make_args: Callable[[np.random.Generator], tuple[npt.ArrayLike, ...]],
                 elements: int, short: bool = False) -> Case:
    """A row of measure_scalar_loop: LOOP_VALUES fresh values a side each round
    (PAD_LOOP_VALUES where `short`), LOOP_ROUNDS rounds."""
    def args() -> tuple[Array, ...]:
        return tuple(jnp.asarray(a) for a in make_args(np.random.default_rng(0)))

    def make() -> Made:  # for a look at one call
        v = 0.25
        return (lambda *a: ours(*a, v)), (lambda *a: theirs(*a, v)), args()
    return Case(name=f"overhead eager {name}, fresh Python scalars", op="eager",
                dtype="float32", elements=elements, bytes=0, make=make, chain=False,
                kind=OVERHEAD, impls=True,
                measure=lambda: measure_scalar_loop(
                    ours, theirs, args(), PAD_LOOP_VALUES if short else LOOP_VALUES,
                    LOOP_ROUNDS))


def _c0x0(rng: np.random.Generator) -> tuple[npt.ArrayLike, ...]:
    return np.bool_(rng.random() < 0.5), np.float32(rng.standard_normal())


def scalar_loop_cases() -> list[Case]:
    f32 = f"f32 {ELEMENTS}"
    table = f"f32 {ROWS}x{COLS} n={LOOKUPS}"
    fill = np.concatenate([np.arange(LOOKUPS - 2), [ROWS, ROWS + 5]]).astype(np.int32)

    def table_fill(rng: np.random.Generator) -> tuple[npt.ArrayLike, ...]:
        return _table_index(rng)[0], fill  # two rows out of range: they hold the pad

    def take_fill(t: Array, i: Array, v: float) -> Array:
        return jnp.take(t, i, axis=0, mode="fill", fill_value=v)
    return [
        _scalar_loop(f"where(c, x, s) {f32}", jax_ext.where, jnp.where,
                     lambda rng: _cxy(rng)[:2], ELEMENTS),
        _scalar_loop(f"select(c, s, x) {f32}", lambda c, x, v: jax_ext.select(c, v, x),
                     lambda c, x, v: jnp.where(c, v, x), lambda rng: _cxy(rng)[:2], ELEMENTS),
        _scalar_loop("where3(c, x, s) f32 0-d", jax_ext.where3, jnp.where, _c0x0, 1),
        _scalar_loop(f"gather pad_value=s {table}",
                     lambda t, i, v: jax_ext.gather(t, [0], 0, i, pad_value=v,
                                                    align_bytes=None),
                     take_fill, table_fill, LOOKUPS * COLS, short=True),
    ]


# --- trace+lower and compile of an N-site program ---------------------------------------

def program(where: Callable[..., Array], take: Callable[[Array, Array], Array],
            n: int) -> JaxFn:
    """N call sites, each a gather of its own index row and a where on the rows it got,
    summed. A new function object at every call (jit's caches are keyed by it).

    The sites feed one sum rather than each other: a chain (each where's result the next
    one's operand) made XLA's compile of the gradient grow with the square of N (its
    scatter-adds are merged into one whose fused operand recomputes the chain for every
    site: the jnp twin's gradient of such a chain took 13 s to compile at 100 sites and 11
    minutes at 400)."""
    def f(table: Array, idx: Array, x: Array) -> Array:
        acc = x
        for k in range(n):
            g = take(table, idx[k])
            acc = acc + where(g > 0.5, g, x)
        return acc
    return f


def _fn(side: str, n: int, grad: bool) -> JaxFn:
    where, take = (jnp.where, _take) if side == "jnp" else (jax_ext.where, _gather)
    f = program(where, take, n)
    if grad:
        return jax.grad(lambda t, i, x: jnp.sum(f(t, i, x)), argnums=(0, 2))
    return f


def _args(n: int, seed: int = 0) -> tuple[Array, Array, Array]:
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((ROWS, COLS)).astype(np.float32)),
            jnp.asarray(rng.integers(0, ROWS, (n, LOOKUPS)).astype(np.int32)),
            jnp.asarray(rng.standard_normal((LOOKUPS, COLS)).astype(np.float32)))


def _time_one(side: str, n: int, grad: bool,
              args: Sequence[Array]) -> tuple[float, float, Any]:
    """(trace+lower seconds, compile seconds, the compiled program) of a new function
    object, jax_ext's sides under their implementation."""
    impl = cast(ImplementationName, "auto" if side == "jnp" else side)
    with jax_ext.implementation(impl):
        fn = jax.jit(_fn(side, n, grad))
        t0 = time.perf_counter()
        lowered = fn.trace(*args).lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1, compiled


def _native_calls(compiled: Any) -> int:
    """jax_ext custom calls in the compiled program (the sites that run native)."""
    return len(re.findall(r'custom_call_target="jax_ext_', compiled.as_text()))


@contextlib.contextmanager
def _no_persistent_cache() -> Iterator[None]:
    """jax's persistent compilation cache off (where a user set its directory, a hit
    would time a file read, not a compile)."""
    # jax's config attributes and update are untyped
    was = jax.config.jax_enable_compilation_cache  # type: ignore[attr-defined]
    jax.config.update("jax_enable_compilation_cache", False)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)  # type: ignore[no-untyped-call]


def measure_lowering(grad: bool, sites: Sequence[int], repeats: int = REPEATS) -> list[Row]:
    """Trace+lower and compile seconds of the N-site program (its gradient with `grad`) at
    each N of `sites`, for the jnp twin and jax_ext under each of IMPLS: `repeats` rounds,
    each N in turn, the sides in balanced orders (timing._orders); one row per N and
    implementation with the medians, the per-round ratios jnp / jax_ext, and on the
    largest N the growth from the smallest. jax's persistent compilation cache is off
    meanwhile (a hit would time a file read); what outlives a function object (jnp's
    internal helpers, registered rules) is warmed up first at 2 sites."""
    from .timing import _agree, _orders, _ratio
    with _no_persistent_cache():
        for side in SIDES:
            _time_one(side, 2, grad, _args(2))
        tl: dict[tuple[int, str], list[float]] = {(n, s): [] for n in sites for s in SIDES}
        comp: dict[tuple[int, str], list[float]] = {k: [] for k in tl}
        last: dict[tuple[int, str], Any] = {}
        orders = _orders(len(SIDES))
        for r in range(repeats):
            for n in sites:
                args = _args(n)
                for s in orders[r % len(orders)]:
                    a, b, compiled = _time_one(SIDES[s], n, grad, args)
                    tl[n, SIDES[s]].append(a)
                    comp[n, SIDES[s]].append(b)
                    last[n, SIDES[s]] = compiled
        outs = {k: c(*_args(k[0])) for k, c in last.items()}
        native = {k: _native_calls(c) for k, c in last.items()}
        del last

    def med(d: dict[tuple[int, str], list[float]], n: int, side: str) -> float:
        return statistics.median(d[n, side])

    rows: list[Row] = []
    lo, hi = min(sites), max(sites)
    for n in sites:
        for impl in IMPLS:
            t, c = _ratio(tl[n, "jnp"], tl[n, impl]), _ratio(comp[n, "jnp"], comp[n, impl])
            row: Row = dict(
                pattern="lowering", sites=n, impl=impl, grad=grad, repeats=repeats,
                tl_s=med(tl, n, impl), tl_ref_s=med(tl, n, "jnp"), tl_ratio=t["median"],
                tl_ratio_min=t["min"], tl_ratio_max=t["max"],
                compile_s=med(comp, n, impl), compile_ref_s=med(comp, n, "jnp"),
                compile_ratio=c["median"], compile_ratio_min=c["min"],
                compile_ratio_max=c["max"], native_calls=native[n, impl],
                agrees=bool(_agree(outs[n, impl], outs[n, "jnp"], exact=False)),
                tl_growth=None, tl_ref_growth=None, compile_growth=None,
                compile_ref_growth=None)
            if n == hi and hi != lo:
                row.update(
                    tl_growth=med(tl, hi, impl) / med(tl, lo, impl),
                    tl_ref_growth=med(tl, hi, "jnp") / med(tl, lo, "jnp"),
                    compile_growth=med(comp, hi, impl) / med(comp, lo, impl),
                    compile_ref_growth=med(comp, hi, "jnp") / med(comp, lo, "jnp"))
            rows.append(row)
    return rows


def _lowering_case(grad: bool, sites: Sequence[int], repeats: int) -> Case:
    name = "overhead lowering N-site program" + (" grad" if grad else "")

    def make() -> Made:  # the program at the largest N, jitted, for a look at it
        n = max(sites)
        return (jax.jit(_fn("auto", n, grad)), jax.jit(_fn("jnp", n, grad)), _args(n))
    return Case(name=name, op="lowering", dtype="float32", elements=0, bytes=0, make=make,
                chain=False, kind=OVERHEAD, exact=False, sites=list(sites),
                measure=lambda: measure_lowering(grad, sites, repeats))


def cases(sites: Sequence[int], repeats: int | None = None) -> list[Case]:
    """The overhead group: the eager rows, then the lowering rows (forward, gradient) at
    the two numbers of call sites `sites`, `repeats` times each (default REPEATS)."""
    return eager_cases() + [_lowering_case(g, sites, repeats or REPEATS) for g in (False, True)]
