"""What jax_ext costs outside its kernels, counted rather than timed (the benchmark's
``--only overhead`` group times it).

An eager call of every front-end, once its shapes have been seen, is one dispatch of a
compiled call from jit's C++ cache: jit's C++ path runs no Python, so the Python functions
that run during the call are only the few of jax_ext's own wrapper (counted with
sys.setprofile, bounded), nothing is traced or compiled (jax.monitoring's events), and
nothing moves to the device (a transfer guard) when the operands are there already and
gather's offsets are Python ints (made into arrays once, kept). A program's lowering grows
linearly with its call sites on every implementation: counted at three sizes, the Python
calls it makes (jax's and jax_ext's) grow by the same amount from each size to the next
double, the per-site rule runs once per site, each lax implementation is traced once and
auto indexes a jaxpr's uses once. A regression here grows a program's lowering with the
square of its call sites, or an eager call with jax's Python dispatch."""
import collections
import contextlib
import gc
import os
import sys

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import jax_ext
from jax_ext import _gather, _gather_rules, _lowering, _scatter_add, _select, _select_rules
from jax_ext.auto import analysis, explain, model
from references import IMPLS, assert_bits_equal

BIND = jax.extend.core.Primitive.bind
_JAX_EXT_DIR = os.path.dirname(jax_ext.__file__) + os.sep
_JAX_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib))


class Calls:
    """The Python calls made in a block (on this thread: jit traces, lowers and dispatches
    on the calling thread), by code object: a generator's resumption counts as a call, so
    a loop over a generator expression counts its steps."""

    def __init__(self) -> None:
        self.by_code: collections.Counter = collections.Counter()

    def of(self, fn) -> int:
        """Calls of the Python function `fn`."""
        return self.by_code[fn.__code__]

    def total(self, where: tuple[str, ...] | str = ("",)) -> int:
        """Calls of every function defined in a file under the folders `where`."""
        return sum(n for code, n in self.by_code.items()
                   if code.co_filename.startswith(where))

    def names(self, where: tuple[str, ...] | str) -> dict[str, int]:
        """For a failing assertion's message: the functions called under `where`."""
        return {f"{os.path.basename(c.co_filename)}:{c.co_name}": n
                for c, n in self.by_code.most_common() if c.co_filename.startswith(where)}


@contextlib.contextmanager
def calls():
    """Counts the Python calls in the block (see Calls). The garbage collector is off
    meanwhile: a collection could run finalizers that are no part of the call."""
    counted = Calls()
    by_code = counted.by_code

    def profile(frame, event, arg):
        if event == "call":
            by_code[frame.f_code] += 1
    old, was_enabled = sys.getprofile(), gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        yield counted
    finally:
        sys.setprofile(old)
        if was_enabled:
            gc.enable()


# jax reports each trace, lowering and compilation of a jitted function as a duration
# event through jax.monitoring (public at both ends); the event names are jax's (the
# constants of jax._src.dispatch, spelled out here rather than imported from there).
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


@contextlib.contextmanager
def compilations():
    """Counts jax's trace, lowering and compile events in the block, by event name."""
    seen: collections.Counter = collections.Counter()

    def listen(event, duration, **kwargs):
        if event in _COMPILE_EVENTS:
            seen[event] += 1
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


# What one warm eager call may run in Python (the test's own lambda and the counting's
# exit included): jax_ext's wrapper sorts the arguments (`_eager`: an operand for a Python
# scalar, which jit's cache may hash and compare; the kept offsets arrays) and reads a few
# cheap properties of jax (a config flag, an array's shape, a dtype's canonical form);
# jit's C++ path then runs none. jax's Python dispatch of a cache miss, or a device_put,
# runs many times these bounds.
EAGER_CALLS = 48  # every Python call
EAGER_JAX_CALLS = 8  # of those, calls of functions of jax and jaxlib


rng = np.random.default_rng(0)
C = jnp.asarray(rng.random(24) > 0.5)
X = jnp.asarray(rng.standard_normal(24), jnp.float32)
Y = jnp.asarray(rng.standard_normal(24), jnp.float32)
SRC = jnp.asarray(rng.standard_normal((12, 6)), jnp.float32)
SRC3 = SRC[None]
OFF = jnp.asarray([1])
IDX = jnp.asarray([3, 0, 11, 12, -1], jnp.int32)
PAD = jnp.asarray(-2.0, jnp.float32)

# (name, the jax_ext call, its jnp/numpy twin): each through the jitted front-end.
EAGER = [
    ("where", lambda: jax_ext.where(C, X, Y), lambda: jnp.where(C, X, Y)),
    ("where, numpy operands", lambda: jax_ext.where(np.asarray(C), np.asarray(X), Y),
     lambda: jnp.where(C, X, Y)),
    ("where, Python scalar", lambda: jax_ext.where(C, X, -0.0),
     lambda: jnp.where(C, X, jnp.float32(-0.0))),
    ("where, Python bool condition", lambda: jax_ext.where(True, X, Y), lambda: X),
    ("select", lambda: jax_ext.select(C, X, Y), lambda: jnp.where(C, X, Y)),
    ("select none", lambda: jax_ext.select(C, X, Y, auto_broadcast="none"),
     lambda: jnp.where(C, X, Y)),
    ("where3", lambda: jax_ext.where3(C, X, Y), lambda: jnp.where(C, X, Y)),
    ("gather", lambda: jax_ext.gather(SRC, [0], 0, IDX, align_bytes=None),
     lambda: jnp.where((IDX >= 0)[:, None] & (IDX < 12)[:, None],
                       jnp.take(SRC, IDX, axis=0, mode="clip"), 0)),
    ("gather, every argument", lambda: jax_ext.gather(SRC3, (0, 1), 1, IDX,
                                                      num_indices=3, pad_value=-2.0),
     lambda: jnp.pad(jnp.where(((IDX >= -1) & (IDX < 11) & (jnp.arange(5) < 3))[:, None],
                               jnp.take(SRC, IDX + 1, axis=0, mode="clip"), -2.0),
                     ((0, 0), (0, 2)), constant_values=-2.0)),
    ("gather, int num_indices", lambda: jax_ext.gather(SRC3, (0, 1), 1, IDX,
                                                       num_indices=3, pad_value=PAD),
     lambda: jnp.pad(jnp.where(((IDX >= -1) & (IDX < 11) & (jnp.arange(5) < 3))[:, None],
                               jnp.take(SRC, IDX + 1, axis=0, mode="clip"), -2.0),
                     ((0, 0), (0, 2)), constant_values=-2.0)),
    ("gather, array offsets", lambda: jax_ext.gather(SRC, OFF, 0, IDX),
     lambda: jnp.pad(jnp.where(((IDX >= -1) & (IDX < 11))[:, None],
                               jnp.take(SRC, IDX + 1, axis=0, mode="clip"), 0.0),
                     ((0, 0), (0, 2)))),
]
# The calls whose every operand is on the device already, or is a Python int of gather's
# (offsets, num_indices: made into arrays once and kept).
ON_DEVICE = [c for c in EAGER if c[0] in ("where", "select", "select none", "where3", "gather",
                                          "gather, int num_indices", "gather, array offsets")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,call,twin", EAGER, ids=[c[0] for c in EAGER])
def test_an_eager_call_is_one_dispatch(name, call, twin, impl):
    """Once its shapes have been seen, an eager call is served by jit's C++ path: nothing
    is traced, lowered or compiled, and no Python function of jax's dispatch runs (jit's
    C++ path runs none), only the few of jax_ext's wrapper. A new jit per call, or a
    conversion that calls into jax (device_put, jnp), each makes jax's Python run."""
    with jax_ext.implementation(impl):
        first = call()
        with compilations() as compiled, calls() as n:
            again = call()
    assert not compiled, dict(compiled)
    assert n.total(_JAX_DIRS) <= EAGER_JAX_CALLS, n.names(_JAX_DIRS)
    assert n.total() <= EAGER_CALLS, n.names("")
    assert n.of(BIND) == 0 and n.of(_gather._gather) == n.of(_select._where) == 0
    assert_bits_equal(again, first)
    assert_bits_equal(first, twin())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,call,twin", ON_DEVICE, ids=[c[0] for c in ON_DEVICE])
def test_a_warm_eager_call_moves_nothing_to_the_device(name, call, twin, impl):
    """With its operands on the device and gather's offsets and num_indices Python ints
    seen before, an eager call transfers nothing from the host, explicitly or not: the
    offsets arrays are made once and kept, not put on the device at every call."""
    with jax_ext.implementation(impl):
        first = call()
        with jax.transfer_guard_host_to_device("disallow_explicit"):
            again = call()
    assert_bits_equal(again, first)
    assert_bits_equal(first, twin())


def test_an_eager_call_outside_jit_binds_as_before():
    """The operands jit would change go the unjitted way, with the same result: a list
    is refused as before, and a numpy int64 index too wide for int32 without x64 is
    checked, not narrowed."""
    with pytest.raises(TypeError, match="where: x must be an array or a scalar"):
        jax_ext.where(C, [1.0] * 24, Y)
    with calls() as n:
        jax_ext.where(C, X, Y)
    assert n.of(_select._where) <= 1  # traced at most once (the shapes may be new here)


@pytest.mark.parametrize("call,prim", [
    (lambda: jax_ext.where(C, X, Y), "jax_ext_select"),
    (lambda: jax_ext.select(C, X, 1.0), "jax_ext_select"),
    (lambda: jax_ext.where3(C, X, Y), "jax_ext_select"),
    (lambda: jax_ext.gather(SRC, [0], 0, IDX), "jax_ext_gather")], ids=["where", "select",
                                                                         "where3", "gather"])
def test_a_traced_call_is_inlined(call, prim):
    """Inside a trace the jitted front-end leaves no call of its own: its equations join
    the enclosing jaxpr (jax >= 0.11 keeps a nested jit's equation unless told
    Inline.JAX_EARLY), so auto's analysis and donation see the call site where the user
    wrote it."""
    jaxpr = jax.make_jaxpr(lambda: call())()
    names = [e.primitive.name for e in jaxpr.eqns]
    assert prim in names and not any(n in ("jit", "pjit") for n in names), names


@pytest.mark.parametrize("impl", IMPLS)
def test_offsets_in_a_loop_share_one_compiled_call(impl):
    """gather's Python-int offsets and num_indices are traced values: a loop over them
    traces and compiles nothing after the first call."""
    with jax_ext.implementation(impl):
        jax_ext.gather(SRC, [0], 0, IDX, num_indices=1)
        with compilations() as compiled, calls() as n:
            outs = [jax_ext.gather(SRC, [k], 0, IDX, num_indices=k % 5) for k in range(1, 8)]
    assert not compiled and n.of(_gather._gather) == 0, dict(compiled)
    for k, o in enumerate(outs, 1):
        want = jax_ext.gather(SRC, jnp.asarray([k]), 0, IDX, num_indices=jnp.asarray(k % 5))
        assert_bits_equal(o, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_shortest_gather_path_takes_python_ints_only(impl):
    """gather's shortest eager path (Python-int offsets, no num_indices or pad_value)
    keeps its offsets arrays by value: a bool, equal to 1 and hashed like it, is still
    refused, and a loop over int offsets traces and compiles nothing after the first."""
    with jax_ext.implementation(impl):
        jax_ext.gather(SRC, [1], 0, IDX)
        with pytest.raises(TypeError,
                           match=r"gather: offsets\[0\] must be an integer, got bool"):
            jax_ext.gather(SRC, [True], 0, IDX)
        with compilations() as compiled, calls() as n:
            outs = [jax_ext.gather(SRC, [k], 0, IDX) for k in range(6)]
    assert not compiled and n.of(_gather._gather) == 0, dict(compiled)
    for k, o in enumerate(outs):
        assert_bits_equal(o, jax_ext.gather(SRC, jnp.asarray([k]), 0, IDX))


@pytest.mark.parametrize("impl", IMPLS)
def test_an_eager_gradient_traces_no_front_end(impl):
    """jax.grad of a gather, unjitted, called again: the front-end is not run again, and
    nothing is compiled."""
    f = jax.grad(lambda s: jnp.sum(jax_ext.gather(s, [0], 0, IDX) ** 2))
    with jax_ext.implementation(impl):
        first = f(SRC)
        with compilations() as compiled, calls() as n:
            again = f(SRC)
    assert n.of(_gather._gather) == 0
    assert not compiled["/jax/core/compile/backend_compile_duration"], dict(compiled)
    assert_bits_equal(again, first)
    want = jax.grad(lambda s: jnp.sum(jnp.pad(jnp.where(
        ((IDX >= 0) & (IDX < 12))[:, None], jnp.take(s, IDX, axis=0, mode="clip"), 0.0),
        ((0, 0), (0, 2))) ** 2))(SRC)
    assert_bits_equal(first, want)


def _sites(n, grad=False):
    """A program of n identical select and gather call sites (fresh each call, so that
    no lowering of it is cached)."""
    def f(s, c):
        acc = jnp.zeros((5, 8), s.dtype)
        for _ in range(n):
            g = jax_ext.gather(s, [0], 0, IDX)
            acc = jax_ext.where(c, acc + g, acc * 0.5)
        return jnp.sum(acc)
    return jax.grad(f) if grad else f


SIZES = (10, 20, 40)  # each the double of the one before


def _linear(counts):
    """Do the counts at SIZES grow linearly: by as much from the second size to the
    third as twice from the first to the second (exactly, for a lowering that does the
    same work at every site), where work per site that grows with the sites (a scan of
    the program at each) makes it up to four times?"""
    a, b, c = counts
    return b > a and c - b <= 2 * (b - a) + (b - a) // 20


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
def test_lowering_grows_linearly_with_the_call_sites(impl, grad):
    """The lowering of N identical call sites, at three sizes: the Python calls it makes
    (jax's lowering and jax_ext's rules; a generator's steps count, so a scan of the
    program's equations does) grow linearly with N; the per-site rule runs at every site
    (explain's record; the native custom call on native, auto's reading of the site on
    auto); each lax implementation is traced at most once per (avals, params) and auto
    indexes a jaxpr's uses and estimates each kind of site once, whatever N."""
    c = jnp.asarray(rng.random((5, 8)) > 0.5)
    fns = {"record": explain.record, "custom call": _lowering.ffi_call,
           "site": analysis.site, "index": analysis._index_uses, "estimate": model.decide,
           "select lax": _select_rules._lax_impl, "gather lax": _gather_rules._gather_lax,
           "scatter lax": _scatter_add._scatter_lax}
    seen, work, ours = [], [], []
    with jax_ext.implementation(impl):
        jax.jit(_sites(SIZES[0], grad)).lower(SRC, c)  # what loads once (auto's table)
        for n in SIZES:
            jax.clear_caches()  # jit's trace caches too: count this lowering's own traces
            with calls() as counted:
                text = jax.jit(_sites(n, grad)).lower(SRC, c).as_text()
            seen.append({k: counted.of(f) for k, f in fns.items()})
            work.append(counted.total())
            ours.append(counted.total(_JAX_EXT_DIR))
            if impl == "lax":
                assert "custom_call" not in text or "jax_ext" not in text
    assert _linear(work) and _linear(ours), (work, ours)
    per_site = [s["record"] for s in seen]
    # (the gradient of this linear program keeps no forward gather: only its transpose)
    assert per_site == ([2 * n for n in SIZES] if not grad else
                        [3 * n - 1 for n in SIZES]), seen
    lax_traces = [{k: v for k, v in s.items() if k.endswith(" lax")} for s in seen]
    if impl == "native":
        assert [s["custom call"] for s in seen] == per_site, seen
        assert not any(v for t in lax_traces for v in t.values()), seen
    else:
        # one trace per distinct (avals, params): the gradient has two selects, the
        # forward one and its transpose
        assert lax_traces[0] == lax_traces[1] == lax_traces[2], seen
        assert all(v <= 2 for v in lax_traces[2].values()), seen
    if impl == "lax":
        assert sum(lax_traces[2].values()) >= 2 and not seen[2]["custom call"], seen
    if impl == "auto":
        assert [s["site"] for s in seen] == per_site, seen
        # one index per jaxpr, one estimate per distinct site (the first and the last
        # sites' surroundings differ: 6 kinds in the gradient), at every size
        assert [s["index"] for s in seen] == [1, 1, 1], seen
        assert seen[0]["estimate"] == seen[2]["estimate"] <= 6, seen
    out = jax.jit(_sites(SIZES[0], grad))(SRC, c)
    with jax_ext.implementation("lax"):
        assert_bits_equal(out, jax.jit(_sites(SIZES[0], grad))(SRC, c))


def test_explain_records_every_identical_site():
    """The per-site rule still runs at every site: explain reports each of N identical
    sites, and auto's choice is the site's (a cached lowering would report one)."""
    c = jnp.asarray(rng.random((5, 8)) > 0.5)
    decisions = jax_ext.explain(_sites(6), SRC, c)
    assert [d.op for d in decisions].count("select") == 6
    assert [d.op for d in decisions].count("gather") == 6
