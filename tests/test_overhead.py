"""What jax_ext costs outside its kernels, counted rather than timed (the benchmark's
``--only overhead`` group times it): an eager call of every front-end is one dispatch of a
compiled call, with no primitive bound from Python once its shapes have been seen; a
program's N identical call sites trace each lax implementation once; auto's analysis
indexes a jaxpr's uses once, whatever the number of sites. A regression here grows a
program's lowering with its call sites, or an eager call with its checks."""
import collections
import contextlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from jax_ext import _gather, _scatter_add, _select
from jax_ext.auto import analysis, model
from references import IMPLS, assert_bits_equal

BIND = jax.extend.core.Primitive.bind


@contextlib.contextmanager
def calls(**fns):
    """Counts the Python calls of each named function (by its code object) in the block,
    on this thread (jit traces and lowers on the calling thread)."""
    codes = {f.__code__: name for name, f in fns.items()}
    counts = collections.Counter({name: 0 for name in fns})

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1
    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(old)


rng = np.random.default_rng(0)
C = jnp.asarray(rng.random(24) > 0.5)
X = jnp.asarray(rng.standard_normal(24), jnp.float32)
Y = jnp.asarray(rng.standard_normal(24), jnp.float32)
SRC = jnp.asarray(rng.standard_normal((12, 6)), jnp.float32)
SRC3 = SRC[None]
OFF = jnp.asarray([1])
IDX = jnp.asarray([3, 0, 11, 12, -1], jnp.int32)

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
    ("gather, array offsets", lambda: jax_ext.gather(SRC, OFF, 0, IDX),
     lambda: jnp.pad(jnp.where(((IDX >= -1) & (IDX < 11))[:, None],
                               jnp.take(SRC, IDX + 1, axis=0, mode="clip"), 0.0),
                     ((0, 0), (0, 2)))),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,call,twin", EAGER, ids=[c[0] for c in EAGER])
def test_an_eager_call_is_one_dispatch(name, call, twin, impl):
    """Once its shapes have been seen, an eager call binds no primitive from Python and
    runs none of the front-end's checks: jit's C++ cache dispatches the compiled call."""
    with jax_ext.implementation(impl):
        first = call()
        with calls(bind=BIND, select=_select._select, where=_select._where,
                   where3=_select._where3, gather=_gather._gather) as n:
            again = call()
    assert sum(n.values()) == 0, dict(n)
    assert_bits_equal(again, first)
    assert_bits_equal(first, twin())


def test_an_eager_call_outside_jit_binds_as_before():
    """The operands jit would change go the unjitted way, with the same result: a list
    is refused as before, and a numpy int64 index too wide for int32 without x64 is
    checked, not narrowed."""
    with pytest.raises(TypeError, match="where: x must be an array or a scalar"):
        jax_ext.where(C, [1.0] * 24, Y)
    with calls(where=_select._where) as n:
        jax_ext.where(C, X, Y)
    assert n["where"] <= 1  # traced at most once (the shapes may be new here)


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


def test_offsets_in_a_loop_share_one_compiled_call():
    """gather's Python-int offsets and num_indices are traced values: a loop over them
    traces the front-end once."""
    jax_ext.gather(SRC, [0], 0, IDX, num_indices=1)
    with calls(gather=_gather._gather) as n:
        outs = [jax_ext.gather(SRC, [k], 0, IDX, num_indices=k % 5) for k in range(1, 8)]
    assert n["gather"] == 0
    for k, o in enumerate(outs, 1):
        want = jax_ext.gather(SRC, jnp.asarray([k]), 0, IDX, num_indices=jnp.asarray(k % 5))
        assert_bits_equal(o, want)


def test_the_shortest_gather_path_takes_python_ints_only():
    """gather's shortest eager path (Python-int offsets, no num_indices or pad_value)
    keeps its offsets arrays by value: a bool, equal to 1 and hashed like it, is still
    refused, and a loop over int offsets shares one compiled call."""
    jax_ext.gather(SRC, [1], 0, IDX)
    with pytest.raises(TypeError, match=r"gather: offsets\[0\] must be an integer, got bool"):
        jax_ext.gather(SRC, [True], 0, IDX)
    with calls(gather=_gather._gather) as n:
        outs = [jax_ext.gather(SRC, [k], 0, IDX) for k in range(6)]
    assert n["gather"] == 0
    for k, o in enumerate(outs):
        assert_bits_equal(o, jax_ext.gather(SRC, jnp.asarray([k]), 0, IDX))


@pytest.mark.parametrize("impl", IMPLS)
def test_an_eager_gradient_traces_no_front_end(impl):
    """jax.grad of a gather, unjitted, called again: the front-end is not run again."""
    f = jax.grad(lambda s: jnp.sum(jax_ext.gather(s, [0], 0, IDX) ** 2))
    with jax_ext.implementation(impl):
        first = f(SRC)
        with calls(gather=_gather._gather) as n:
            again = f(SRC)
    assert n["gather"] == 0
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


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
def test_identical_sites_lower_their_lax_path_once(impl, grad):
    """N identical call sites trace each lax implementation at most once per lowering,
    and auto indexes the program's uses once and estimates each kind of site once, not
    once per site."""
    c = jnp.asarray(rng.random((5, 8)) > 0.5)
    seen = []
    for n in (3, 12):
        jax.clear_caches()  # jit's trace caches too: count this lowering's own traces
        with jax_ext.implementation(impl), \
                calls(select=_select._lax_impl, gather=_gather._gather_lax,
                      scatter=_scatter_add._scatter_lax,
                      index=analysis._index_uses, estimate=model.decide) as counts:
            text = jax.jit(_sites(n, grad)).lower(SRC, c).as_text()
        seen.append(dict(counts))
        if impl == "lax":
            assert "custom_call" not in text or "jax_ext" not in text
        out = jax.jit(_sites(n, grad))(SRC, c)
        with jax_ext.implementation("lax"):
            assert_bits_equal(out, jax.jit(_sites(n, grad))(SRC, c))
    # Per lowering: one trace per distinct (avals, params) (the gradient has two selects:
    # the forward one and its transpose), one index per jaxpr, one estimate per distinct
    # site (the first and the last sites' surroundings differ: 6 kinds in the gradient);
    # none grows with the sites.
    assert seen[0] == seen[1], seen
    assert all(v <= (6 if k == "estimate" else 2) for k, v in seen[1].items()), seen
    if impl == "lax":
        # (the gradient of this linear program needs no forward gather: only its transpose)
        assert seen[1]["select"] >= 1 and seen[1]["gather"] + seen[1]["scatter"] >= 1, seen


def test_explain_records_every_identical_site():
    """The per-site rule still runs at every site: explain reports each of N identical
    sites, and auto's choice is the site's (a cached lowering would report one)."""
    c = jnp.asarray(rng.random((5, 8)) > 0.5)
    decisions = jax_ext.explain(_sites(6), SRC, c)
    assert [d.op for d in decisions].count("select") == 6
    assert [d.op for d in decisions].count("gather") == 6
