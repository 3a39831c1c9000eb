"""The lax path fuses like jnp and stays exact; implementation "auto" picks per call site.

Issue 8: a native call is opaque to XLA, so "auto" takes it only where its operands are
already in memory, nothing would fuse its result, and there is enough work; elsewhere the
lax path, which must compile to the same fusions as the jnp program it replaces.
"""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jax_ext
from jax_ext import _lowering
from jax_ext.auto import costs
from references import assert_bits_equal, bits_equal

BIG = 1 << 16  # elements: enough work for auto's thresholds in f32
MEASURED_ON = "0.10.2"  # the jaxlib _lowering.XLA_INEXACT was measured on

# Every dtype XLA:CPU has, with whether it moves them bit for bit through select/pad.
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
          "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu"]


def _dtype(name):
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _random_bits(rng, dt, shape):
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    n = int(np.prod(shape))
    return rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)


@pytest.mark.parametrize("name", [n for n in DTYPES if hasattr(ml_dtypes, n) or hasattr(np, n)])
def test_xla_select_exactness_per_dtype_is_pinned(name):
    """The finding _lowering.XLA_INEXACT rests on: XLA:CPU's own select and pad rewrite the
    bits of these dtypes (via float32). Every dtype XLA rewrites must be listed, on any jax
    (one missing loses exactness). On the jaxlib the set was measured on, 0.10.2, the set is
    exactly those; a newer XLA may move a listed dtype exactly (0.11.2 does bfloat16), which
    costs nothing: the lax path then views it as an integer where it need not."""
    dt, rng = _dtype(name), np.random.default_rng(0)
    c = rng.integers(0, 2, 4099).astype(bool)
    x, y = _random_bits(rng, dt, (4099,)), _random_bits(rng, dt, (4099,))
    plain = jax.jit(lambda c, x, y: lax.select_n(c, y, x))(c, x, y)
    padded = jax.jit(lambda x: lax.pad(x, jnp.zeros((), x.dtype), [(1, 2, 0)]))(x)
    exact = bits_equal(plain, np.where(c, x, y)) and bits_equal(
        padded, np.pad(x, (1, 2)))
    if not exact:
        assert name in _lowering.XLA_INEXACT, f"XLA:CPU rewrites {name}: add it to XLA_INEXACT"
    if jax.lib.__version__ == MEASURED_ON:
        assert exact == (name not in _lowering.XLA_INEXACT), name


@pytest.mark.parametrize("name", sorted(_lowering.XLA_INEXACT))
def test_lax_path_is_exact_where_xla_is_not(name):
    dt, rng = _dtype(name), np.random.default_rng(1)
    c = rng.integers(0, 2, (64, 33)).astype(bool)
    x, y = _random_bits(rng, dt, (64, 33)), _random_bits(rng, dt, (1, 33))
    src = _random_bits(rng, dt, (50, 3, 5))
    pad = _random_bits(rng, dt, ())
    idx = rng.integers(-3, 53, 40)
    with jax_ext.implementation("lax"):
        got = jax.jit(jax_ext.where)(c, x, y)
        g = jax.jit(lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p, align_bytes=32)
                    )(src, idx, pad)
    with jax_ext.implementation("native"):
        g_native = jax.jit(lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p,
                                                          align_bytes=32))(src, idx, pad)
    assert bits_equal(got, np.where(c, x, y))
    assert bits_equal(g, g_native)


def _fusions(fn, *args):
    """(fusions, custom calls) in the compiled entry computation of jit(fn)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    entry = text[text.index("\nENTRY"):]
    return (len(re.findall(r"= \S+ fusion\(", entry)),
            len(re.findall(r"custom-call\(", entry)))


def _programs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(BIG).astype(np.float32)
    y = rng.standard_normal(BIG).astype(np.float32)
    xb, yb = x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)
    table = rng.standard_normal((5000, 128)).astype(np.float32)
    idx = rng.integers(0, 5000, 2048).astype(np.int32)

    def take(t, i):
        return jnp.take(t, i, axis=0, mode="fill", fill_value=0)

    def gather(t, i):
        return jax_ext.gather(t, [0], 0, i, align_bytes=None)

    def chain(w):
        return lambda x, y: w(x > 0, x * 2, y + 1)

    def grad_chain(w):
        return jax.grad(lambda x, y: jnp.sum(w(x > 0, x * x, y)), argnums=(0, 1))

    def clip(w):
        return lambda g, t: w(jnp.abs(g) > t, jnp.sign(g) * t, g)

    def tanh_sum(g):
        return lambda t, i: jnp.tanh(g(t, i)).sum(-1)

    return {
        "chain f32": (chain(jax_ext.where), chain(jnp.where), (x, y)),
        "chain bf16": (chain(jax_ext.where), chain(jnp.where), (xb, yb)),
        "sum": (lambda x, y: jnp.sum(jax_ext.where(x > 0, x, y)),
                lambda x, y: jnp.sum(jnp.where(x > 0, x, y)), (x, y)),
        "grad chain": (grad_chain(jax_ext.where), grad_chain(jnp.where), (x, y)),
        "clip": (clip(jax_ext.where), clip(jnp.where), (x, np.float32(1))),
        "select one-way": (lambda x, y: jax_ext.select(x[:1] > 0, x * 2, y),
                           lambda x, y: jnp.where(x[:1] > 0, x * 2, y), (x, y)),
        "gather tanh": (tanh_sum(gather), tanh_sum(take), (table, idx)),
        "gather grad": (jax.grad(lambda t, i: tanh_sum(gather)(t, i).sum()),
                        jax.grad(lambda t, i: tanh_sum(take)(t, i).sum()), (table, idx)),
    }


@pytest.mark.parametrize("name", list(_programs()))
def test_lax_path_compiles_to_the_fusions_of_the_jnp_program(name):
    ours, theirs, args = _programs()[name]
    with jax_ext.implementation("lax"):
        got = _fusions(ours, *args)
    want = _fusions(theirs, *args)
    if name == "gather grad":
        want = (want[0], want[1])  # jnp.take's scatter is an XLA op, not a custom call
    assert got == want, (got, want)
    with jax_ext.implementation("lax"):
        a = jax.jit(ours)(*args)
    b = jax.jit(theirs)(*args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=1e-5), a, b)


def _choices(fn, *args):
    return [(d.op, d.impl) for d in jax_ext.explain(fn, *args)]


def test_auto_as_shipped_decides_by_its_two_estimates():
    """With the shipped table, whatever its numbers: every auto decision carries both
    estimates, takes the cheaper one, and says so in its reason."""
    c, x = np.ones(1 << 20, bool), np.ones(1 << 20, np.float32)
    table = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
    idx = np.arange(4096, dtype=np.int32)
    g = jax.grad(lambda t, i: jax_ext.gather(t, [0], 0, i, align_bytes=None).sum())
    margin = costs.shipped().structure.native_margin
    assert 0 < margin <= 1
    cases = [(jax_ext.where, (c, x, x)), (jax_ext.where, (c[:64], x[:64], x[:64])),
             (lambda c, x: jax_ext.where(x > 0, x * 2, x), (c, x)),
             (lambda t, i: jax_ext.gather(t, [0], 0, i), (table, idx)), (g, (table, idx))]
    for fn, args in cases:
        (d,) = jax_ext.explain(fn, *args)
        assert d.requested == "auto" and d.est_native_s > 0 and d.est_lax_s > 0, d
        assert d.impl == ("native" if d.est_native_s < d.est_lax_s * margin else "lax"), d
        assert d.reason.startswith("est. native ") and " vs lax " in d.reason, d
        native = d.impl == "native"
        assert ("custom_call" in jax.jit(fn).lower(*args).as_text()) == native, d


def test_cost_table_is_complete_and_says_what_each_constant_was_fitted_on():
    t = costs.shipped()
    paths = [p for p, _ in costs.leaves(t)]
    assert set(paths) == set(t.about) and len(paths) == len(set(paths))
    assert all(v >= 0 for _, v in costs.leaves(t))
    assert all(len(t.about[p]) > 10 for p in paths)
    assert "/" not in t.machine  # no paths in the shipped table
    assert t.row_lengths == tuple(sorted(t.row_lengths)) and len(t.row_lengths) > 3


def test_cost_table_file_is_checked():
    """A table that does not fit the model is refused with the path of the leaf."""
    import copy
    import json
    with open(costs.PATH) as f:
        tree = json.load(f)
    for mutate, match in (
            (lambda t: t["select"]["native"].pop("s0"), r"select\.native: missing \['s0'\]"),
            (lambda t: t["gather"].update(extra={}), r"gather: missing \[\], unknown \['extra'\]"),
            (lambda t: t["fresh"]["lax"]["s_per_byte"].update(value=-1.0),
             r"fresh\.lax\.s_per_byte must be a non-negative float"),
            (lambda t: t["materialize"]["s0"].update(value="1"), "non-negative float"),
            (lambda t: t["structure"]["pool_min_bytes"].update(value=1.5), "non-negative int"),
            (lambda t: t["select"]["lax"]["s0"].update(about=""), r"select\.lax\.s0 needs"),
            (lambda t: t["gather"]["lax"]["row_ratio"].update(x=t["gather"]["lax"]["s0"]),
             "keys must be integers")):
        bad = copy.deepcopy(tree)
        mutate(bad)
        with pytest.raises(costs.CostTableError, match=match):
            costs.from_tree(bad)
    assert costs.from_tree(json.loads(costs.dumps(costs.shipped()))) == costs.shipped()


ROW_LENGTHS = costs.shipped().row_lengths

# A table as an idle machine's: the kernels cheaper per byte and per row, XLA's
# single-thread loop cheaper for tiny results, and materializing (a loop writing an operand,
# a consumer reading a result back) dear, so the rule around the estimates is what is
# tested: native only around values already in memory.
TABLE = {
    "select.lax.s0_single": 1e-6, "select.lax.s0": 10e-6, "select.lax.s_per_byte": 1e-10,
    "select.native.s0_single": 2e-6, "select.native.s0": 3e-6,
    "select.native.s_per_byte": 0.5e-10,
    "gather.lax.s0": 5e-6,
    # XLA's loop 3x the kernel's on short rows, 1.5x from 75 elements
    **{f"gather.lax.row_ratio.{n}": 3.0 if n < 75 else 1.5
       for n in ROW_LENGTHS},
    "gather.native.s0": 3e-6, "gather.native.s_per_row": 2e-9,
    "gather.native.s_per_byte": 0.5e-10,
    "scatter_add.lax.s0": 10e-6, "scatter_add.lax.s_per_row": 1e-8,
    "scatter_add.lax.s_per_ct_byte": 2e-10, "scatter_add.lax.s_per_out_byte": 1e-10,
    "scatter_add.native.s0": 5e-6, "scatter_add.native.s_per_row": 2e-9,
    "scatter_add.native.s_per_ct_byte": 1e-10, "scatter_add.native.s_per_out_byte": 0.5e-10,
    "update_rows.lax.s0": 50e-6, "update_rows.lax.s_per_row": 2e-9,
    "update_rows.lax.s_per_byte": 1e-10,
    "update_rows.native.s0": 10e-6, "update_rows.native.s_per_row": 5e-9,
    "update_rows.native.s_per_byte": 1e-10,
    "fresh.lax.s_per_byte": 2e-10, "fresh.native.s_per_byte": 2e-11,
    "materialize.s0": 5e-6, "materialize.s_per_byte": 1e-9,
}


# The corrections learned from tuning, neutral: the tests below test the fitted terms.
NO_CORRECTIONS = {"corrections.select_lax_one_full_operand": 1.0,
                  "corrections.gather_lax_fused_short_rows": 1.0,
                  "corrections.gather_fused_short_rows_below": 0}


@pytest.fixture
def table(monkeypatch):
    """The model reads TABLE (a dict the test may change) instead of the shipped table."""
    shipped = costs.shipped()
    d = dict(TABLE, **{p: v for p, v in costs.leaves(shipped) if p.startswith("structure.")})
    d.update(NO_CORRECTIONS)
    assert set(d) == {p for p, _ in costs.leaves(shipped)}
    monkeypatch.setattr(costs, "shipped",
                        lambda: costs.from_flat("test", d, {p: "test" for p in d}))
    return d


def test_auto_takes_native_only_around_materialized_values(table):
    rng = np.random.default_rng(3)
    n = BIG
    c = rng.integers(0, 2, n).astype(bool)
    x, y = rng.standard_normal((2, n)).astype(np.float32)
    m = rng.standard_normal((256, 256)).astype(np.float32)
    cm = rng.integers(0, 2, (256, 256)).astype(bool)
    W = jax_ext.where
    cases = {
        # arguments in, program output out: nothing to fuse
        "standalone": (lambda c, x, y: W(c, x, y), (c, x, y), [("select", "native")]),
        # a fusible producer (compare, multiply) -> lax
        "chain": (lambda c, x, y: W(x > 0, x * 2, y + 1), (c, x, y), [("select", "lax")]),
        # a fusible consumer (multiply, an int reduction) -> lax
        "consumer": (lambda c, x, y: W(c, x, y) * 2, (c, x, y), [("select", "lax")]),
        "int sum": (lambda c, x, y: W(c, x.astype(np.int32), 0).sum(), (c, x, y),
                    [("select", "lax")]),
        # XLA:CPU's float sum reads its operand from memory: nothing to fuse
        "sum": (lambda c, x, y: W(c, x, y).sum(), (c, x, y), [("select", "native")]),
        # a matmul's result, consumed by another matmul: both sides in memory anyway
        "dot": (lambda c, a, b: W(c, a @ b, 0.0) @ b, (cm, m, m), [("select", "native")]),
        # a nested jit is looked through
        "nested jit": (lambda c, x, y: jax.jit(W)(c, x, y), (c, x, y), [("select", "native")]),
        # free views of an argument are looked through: reshape, a transpose of a size-1 dim
        "views": (lambda c, x, y: W(c.reshape(256, 256), x.reshape(1, 256, 256).transpose(
            1, 0, 2).reshape(256, 256), y.reshape(256, 256)), (c, x, y),
            [("select", "native")]),
        # too little work: XLA's one-thread loop is cheaper than the call
        "small": (lambda c, x, y: W(c, x, y), (c[:64], x[:64], y[:64]), [("select", "lax")]),
        # loop state kept by a row condition: carried in and out of the loop
        "scan carry": (lambda c, x: jax.lax.scan(
            lambda h, a: (jax_ext.where3(a, jnp.tanh(h @ m), h), None), x.reshape(256, 256),
            cm[:8])[0], (cm, x), [("select", "lax")]),
    }
    for name, (fn, args, want) in cases.items():
        assert _choices(fn, *args) == want, name
        text = jax.jit(fn).lower(*args).as_text()
        assert ("jax_ext_select_v2" in text) == (want[0][1] == "native"), name
        with jax_ext.implementation("lax"):
            ref = jax.jit(fn)(*args)
        assert_bits_equal(jax.jit(fn)(*args), ref)


def test_auto_gather_and_its_gradient(table):
    rng = np.random.default_rng(4)
    tab = rng.standard_normal((5000, 64)).astype(np.float32)
    idx = rng.integers(0, 5000, 4096).astype(np.int32)

    def g(t, i):
        return jax_ext.gather(t, [0], 0, i, align_bytes=None)
    assert _choices(g, tab, idx) == [("gather", "native")]
    # tanh fuses with XLA's gather: materializing the rows costs more than the kernel saves
    assert _choices(lambda t, i: jnp.tanh(g(t, i)), tab, idx) == [("gather", "lax")]
    # the scatter-add of the gradient never fuses, and the kernel is cheaper here
    assert _choices(jax.grad(lambda t, i: jnp.tanh(g(t, i)).sum()), tab, idx) == [
        ("gather", "lax"), ("scatter_add", "native")]
    # a table computed by a fusible op: XLA reads only the gathered rows of it
    assert _choices(lambda t, i: g(t * 2, i), tab, idx) == [("gather", "lax")]
    # vmap over the index: the size-1 batch dim jax_ext's batching rule puts on src is a
    # view of the argument, not a fusible producer
    (d,) = jax_ext.explain(lambda t, i: jax.vmap(lambda i: g(t, i))(i), tab,
                           idx.reshape(8, 512))
    assert d.impl == "native" and "src: argument" in d.reason, d


def test_lax_gather_is_estimated_at_its_row_length(table):
    """XLA's gather loop is estimated as the kernel's loop times the ratio measured at
    the longest row length of ROW_LENGTHS not above the result's last dim: a step (f32
    rows of 74 and 75 elements differ 2.5x on XLA:CPU), whatever the lengths between."""
    def est(cols, n=2048):
        tab = np.zeros((4096, cols), np.float32)
        idx = np.zeros(n, np.int32)
        (d,) = jax_ext.explain(lambda t, i: jax_ext.gather(t, [0], 0, i, align_bytes=None),
                               tab, idx)
        return d
    table.update({f"gather.lax.row_ratio.{n}": float(k + 1)
                  for k, n in enumerate(ROW_LENGTHS)})
    loop = {}
    for cols in (74, 75, 100, 8, 4, 1000):
        d = est(cols)
        out = 2048 * cols * 4
        small = 2048 * 4 + 3 * 4  # index, offsets, num_indices, pad_value
        loop[cols] = (TABLE["gather.native.s_per_row"] * 2048
                      + TABLE["gather.native.s_per_byte"] * (small + 2 * out))
        at = max([n for n in ROW_LENGTHS if n <= cols] or [8])
        assert np.isclose(d.est_lax_s, TABLE["gather.lax.s0"]
                          + table[f"gather.lax.row_ratio.{at}"] * loop[cols]), (cols, d)
    # where XLA's loop is as fast as the kernel's, the lax path is kept (NATIVE_MARGIN)
    table.update({f"gather.lax.row_ratio.{n}": 1.0 for n in ROW_LENGTHS})
    table["gather.lax.s0"] = table["gather.native.s0"]
    assert est(128, n=16384).impl == "lax"  # 8 MiB: no fresh mapping either side
    table["gather.lax.row_ratio.128"] = 3.0
    assert est(128, n=16384).impl == "native" and est(96, n=16384).impl == "lax"


def test_xla_reads_float_reductions_from_memory():
    """The finding auto.analysis._MEMORY_REDUCTIONS rests on: XLA:CPU does not fuse a select into a
    float32 sum or max (a loop fusion writes it, a YNNPACK fusion reduces it), while it
    fuses one into an int32 sum. Pinned on the jaxlib it was measured on."""
    m, h = np.ones((64, 32, 1), bool), np.ones((64, 32, 16), np.float32)

    def fusions(f, *a):
        t = jax.jit(f).lower(*a).compile().as_text()
        return t[t.index("\nENTRY"):]
    if jax.lib.__version__ != MEASURED_ON:
        pytest.skip("measured on jaxlib " + MEASURED_ON)
    for f in (lambda m, h: jnp.where(m, h, 0.0).sum(1), lambda m, h: jnp.where(m, h, 0.0).max(1)):
        assert "__ynn_fusion" in fusions(f, m, h)
    assert "__ynn_fusion" not in fusions(
        lambda m, h: jnp.where(m, h.astype(np.int32), 0).sum(1), m, h)


def test_materializing_is_a_cost_not_a_veto(table):
    """A fusing consumer adds one read of the result to the kernel's estimate and takes
    the result's write off the lax path's; where that is less than the kernel saves, the
    kernel still runs (issue 20, cause 2)."""
    rng = np.random.default_rng(5)
    tab = rng.standard_normal((5000, 64)).astype(np.float32)
    idx = rng.integers(0, 5000, 4096).astype(np.int32)
    out = 4096 * 64 * 4

    def g(t, i):
        return jax_ext.gather(t, [0], 0, i, align_bytes=None)
    (alone,) = jax_ext.explain(g, tab, idx)
    (fused,) = jax_ext.explain(lambda t, i: jnp.concatenate([g(t, i), g(t, i)[:1]]), tab, idx
                               )[:1]
    assert "result feeds concatenate" in fused.reason, fused
    assert np.isclose(fused.est_native_s - alone.est_native_s,
                      TABLE["materialize.s0"] + TABLE["materialize.s_per_byte"] * out)
    # ... and, fused, the lax op launches no loop of its own (no fixed cost).
    assert np.isclose(alone.est_lax_s - fused.est_lax_s,
                      TABLE["gather.lax.row_ratio.64"] * TABLE["gather.native.s_per_byte"] * out
                      + TABLE["gather.lax.s0"])
    assert fused.impl == "lax"
    table["materialize.s_per_byte"] = 1e-12
    (cheap,) = jax_ext.explain(lambda t, i: jnp.concatenate([g(t, i), g(t, i)[:1]]), tab, idx
                               )[:1]
    assert cheap.impl == "native" and "result feeds concatenate" in cheap.reason


def test_a_fusible_operand_costs_its_write_and_its_producers_reads(table):
    """cond = x > 0: the kernel needs the compare's loop first, which writes cond and reads
    x again (the fused lax loop reads x once for both); its constant 0 is computed there."""
    c, x = np.ones(BIG, bool), np.ones(BIG, np.float32)
    (arg,) = jax_ext.explain(lambda c, x, y: jax_ext.where(c, x, y), c, x, x)
    (cmp,) = jax_ext.explain(lambda c, x, y: jax_ext.where(x > 0, x, y), c, x, x)
    assert "cond comes from compare" in cmp.reason, cmp
    assert np.isclose(cmp.est_native_s - arg.est_native_s,
                      TABLE["materialize.s0"] + TABLE["materialize.s_per_byte"] * (BIG + 4 * BIG))
    # the lax path does not read cond from memory at all, and fused with the compare it
    # launches no loop of its own (no fixed cost)
    assert np.isclose(arg.est_lax_s - cmp.est_lax_s,
                      TABLE["select.lax.s_per_byte"] * BIG + TABLE["select.lax.s0"])


def test_scatter_add_is_judged_by_its_zero_filled_result(table):
    """Same cotangent (1 MiB), tables of 1 MiB and 36 MiB: the estimates grow with the
    result, and past glibc's mmap threshold by its fresh pages (dearer for XLA's 4 KiB
    pages than for the kernel's huge pages)."""
    ct = np.ones((8192, 32), np.float32)
    idx = np.arange(8192, dtype=np.int32)
    ds = {}
    for rows in (8192, 9 << 15):
        t = np.ones((rows, 32), np.float32)
        f = jax.grad(lambda t, i, c: jnp.sum(jax_ext.gather(t, [0], 0, i, align_bytes=None) * c))
        (ds[rows],) = [d for d in jax_ext.explain(f, t, idx, ct) if d.op == "scatter_add"]
    small, big = ds[8192], ds[9 << 15]
    extra = (big.est_lax_s - small.est_lax_s, big.est_native_s - small.est_native_s)
    grow = (9 << 15) * 128 - 8192 * 128
    assert np.isclose(extra[0], TABLE["scatter_add.lax.s_per_out_byte"] * grow
                      + TABLE["fresh.lax.s_per_byte"] * (9 << 15) * 128)
    assert np.isclose(extra[1], TABLE["scatter_add.native.s_per_out_byte"] * grow
                      + TABLE["fresh.native.s_per_byte"] * (9 << 15) * 128)
    assert "zero-filled result" in big.reason and big.impl == "native"


def test_update_rows_is_judged_by_its_indices_and_rows(table):
    """Per index (times log2 n on the lax side, which sorts) and per byte of the gradient
    rows and of the rows read and written (one table row each per leaf): the estimates
    are the table's terms, and the reason names the step's sizes."""
    import optax
    opt = optax.adagrad(0.1)
    t = np.ones((4096, 32), np.float32)
    for n in (64, 4096):
        i, g = np.arange(n, dtype=np.int32), np.ones((n, 32), np.float32)
        (d,) = [d for d in jax_ext.explain(
            lambda t, i, g: jax_ext.update_rows(opt, t, opt.init(t), [0], 0, i, g)[0], t, i, g)
            if d.op == "update_rows"]
        moved = n * 32 * 4 * (1 + 2 * 2)  # the gradient rows; the table's and one leaf's
        assert np.isclose(d.est_native_s, TABLE["update_rows.native.s0"] + TABLE[
            "update_rows.native.s_per_row"] * n + TABLE["update_rows.native.s_per_byte"] * moved)
        assert np.isclose(d.est_lax_s, TABLE["update_rows.lax.s0"] + TABLE[
            "update_rows.lax.s_per_row"] * n * np.log2(n) + TABLE["update_rows.lax.s_per_byte"]
            * moved)
        assert f"{n * 128} bytes of gradient rows into a {t.nbytes}-byte table" in d.reason
    assert d.impl == "native"


def test_explain_reports_requested_implementation_and_call_site(table):
    c, x = np.ones(BIG, bool), np.ones(BIG, np.float32)
    for impl in ("native", "lax"):
        with jax_ext.implementation(impl):
            ds = jax_ext.explain(lambda c, x: jax_ext.where(c, x * 2, x), c, x)
        assert [(d.impl, d.requested, d.reason) for d in ds] == [(impl, impl, "requested")]
        assert ds[0].est_native_s is None and ds[0].est_lax_s is None
        assert ds[0].where.startswith("test_auto.py:"), ds[0].where
    ds = jax_ext.explain(lambda c, x: jax_ext.where(c, x * 2, x), c, x)
    assert ds[0].requested == "auto" and "x comes from mul" in ds[0].reason, ds[0]
    assert re.search(r"select -> lax \(auto: est\. native [\d.]+ [um]s vs lax [\d.]+ [um]s; ",
                     str(ds[0])), str(ds[0])


def test_explain_takes_a_jitted_function_with_static_arguments(table):
    x = np.ones(BIG, np.float32)

    def f(x, n, *, mode):
        assert isinstance(n, int) and mode == "pos"  # static: Python values, not tracers
        return jax_ext.where(x > n, x, 0.0)
    jf = jax.jit(f, static_argnums=1, static_argnames="mode")
    jf(x, 3, mode="pos")  # a cached lowering must not hide the decisions
    for fn in (jf, f):
        (d,) = jax_ext.explain(fn, x, 3, mode="pos")
        assert d.op == "select" and d.requested == "auto", d
    (d,) = jax_ext.explain(jf, jax.ShapeDtypeStruct((BIG,), np.float32), 3, mode="pos")
    assert d.op == "select"


def test_the_jaxpr_walk_sees_the_equations_being_lowered(table, monkeypatch):
    """auto's producer/consumer analysis reads the jaxprs jax is lowering from the frames
    of jax's mlir.jaxpr_subcomp (_compat.enclosing_equations). On a jax that lowers some
    other way the walk finds nothing and auto would quietly call every consumer unknown:
    this test fails instead, on every jax CI runs."""
    from jax_ext import _compat, _select
    seen = []

    def spy(*args, **kwargs):
        out = _compat.enclosing_equations.__wrapped__(*args, **kwargs)
        seen.append([(j, e, set(env)) for j, e, env in out])  # env grows as lowering goes on
        return out
    spy.__wrapped__ = _compat.enclosing_equations
    monkeypatch.setattr(_compat, "enclosing_equations", spy)
    x, y = np.ones((2, BIG), np.float32)
    inner = jax.jit(lambda x, y: jax_ext.where(x > 0, x * 2, y))
    jax.jit(lambda x, y: inner(x, y) + 1).lower(x, y)  # a nested jit: two levels
    assert seen and all(seen), "the walk found no jaxpr being lowered on this jax"
    for stack in seen:
        assert len(stack) == 2, [e.primitive.name for _, e, _ in stack]
        (j0, e0, env0), (j1, e1, _) = stack
        assert e0.primitive is _select.select_p and any(e is e0 for e in j0.eqns)
        assert all(v in env0 for v in e0.invars if not hasattr(v, "val"))  # operands lowered
        assert any(e is e1 for e in j1.eqns) and e1.primitive.name in ("pjit", "jit")
        assert e0.outvars[0] not in env0  # the select's own result: not lowered yet

    (d,) = jax_ext.explain(lambda x, y: jax_ext.where(x > 0, x * 2, y), x, y)
    assert "cond comes from compare" in d.reason and "x comes from mul" in d.reason, d
    assert "y: argument" in d.reason and "result is a program output" in d.reason, d
    assert "unknown" not in d.reason, d


def test_corrections_learned_from_tuning(table):
    """The two corrections of the shipped table, each where it applies and nowhere else:
    a select reading one operand in full has its lax loop scaled, a gather of short rows
    feeding a fusing consumer has XLA's fused loop scaled; others keep their estimates."""
    c = np.zeros((4096, 1), bool)
    x, y = np.ones((4096, 1024), np.float32), np.ones((1, 1024), np.float32)
    before = {k: jax_ext.explain(jax_ext.where, *a)[0].est_lax_s
              for k, a in (("one", (c, x, y)), ("all", (c.repeat(1024, 1), x, x)))}
    table["corrections.select_lax_one_full_operand"] = 0.5
    after = {k: jax_ext.explain(jax_ext.where, *a)[0].est_lax_s
             for k, a in (("one", (c, x, y)), ("all", (c.repeat(1024, 1), x, x)))}
    assert after["all"] == before["all"] and after["one"] < 0.6 * before["one"]

    tab, idx = np.ones((50000, 32), np.float32), np.zeros(8192, np.int32)
    fused = lambda t, i: jnp.tanh(jax_ext.gather(t, [0], 0, i, align_bytes=None))  # noqa: E731
    alone = lambda t, i: jax_ext.gather(t, [0], 0, i, align_bytes=None)  # noqa: E731
    est = lambda f, t: jax_ext.explain(f, t, idx)[0].est_lax_s  # noqa: E731
    base = {k: est(f, tab) for k, f in (("fused", fused), ("alone", alone))}
    wide = est(fused, np.ones((50000, 64), np.float32))
    table["corrections.gather_lax_fused_short_rows"] = 3.0
    table["corrections.gather_fused_short_rows_below"] = 64
    assert est(fused, tab) == pytest.approx(3.0 * base["fused"])  # no fixed cost when fused
    assert est(alone, tab) == base["alone"]  # a program output: nothing fuses
    assert est(fused, np.ones((50000, 64), np.float32)) == wide  # 64-element rows


def test_shipped_corrections_are_documented():
    t = costs.shipped()
    assert 0 < t.corrections.select_lax_one_full_operand <= 1
    assert t.corrections.gather_lax_fused_short_rows >= 1
    for path in ("corrections.select_lax_one_full_operand",
                 "corrections.gather_lax_fused_short_rows"):
        assert "tuning" in t.about[path]


def test_auto_keeps_xla_in_place_for_a_donated_then(table):
    """A select whose `then` is donated and shaped like the result runs XLA's fused loop in
    place under auto (both sides update the same bytes; XLA's loop was the faster), while
    the same call without donation, or with a broadcast `then`, takes the kernel the table
    prefers. Bits equal the lax path's and numpy's either way; the donated buffer is
    reused."""
    rng = np.random.default_rng(4)
    c = rng.integers(0, 2, BIG).astype(bool)
    x, y = rng.standard_normal((2, BIG)).astype(np.float32)
    want = np.where(c, x, y)
    donated = jax.jit(jax_ext.select, donate_argnums=1)
    text = donated.lower(c, x, y).as_text()
    assert "jax_ext_select_v2" not in text
    assert "tf.aliasing_output" in text or "jax.buffer_donor" in text
    t = jnp.array(x)
    ptr = t.unsafe_buffer_pointer()
    out = donated(c, t, y)
    assert out.unsafe_buffer_pointer() == ptr and t.is_deleted()
    assert_bits_equal(out, want)
    # the same site without donation: the kernel, as the table says
    assert _choices(jax_ext.select, c, x, y) == [("select", "native")]
    assert "jax_ext_select_v2" in jax.jit(jax_ext.select).lower(c, x, y).as_text()
    # donated but broadcast (not shaped like the result): no in-place update to keep
    bcast = jax.jit(jax_ext.select, donate_argnums=1)
    c2 = rng.integers(0, 2, (256, BIG // 256)).astype(bool)
    assert "jax_ext_select_v2" in bcast.lower(c2, x[: BIG // 256], y.reshape(256, -1)).as_text()
    # explain sees the jitted function's donation, as its lowering does
    (d,) = jax_ext.explain(donated, c, x, y)
    assert d.impl == "lax" and "x: argument (donated)" in d.reason, d
    (d,) = jax_ext.explain(jax.jit(jax_ext.select), c, x, y)
    assert d.impl == "native" and "donated" not in d.reason, d


# --- jax's announced remat and custom_vjp implementations -------------------------------
# Under jax_remat3 / jax_custom_vjp3, checkpoint and custom_vjp bind `eval_jaxpr` (lowered
# as a function of its own) in place of remat2 and the custom_vjp calls, and remat3 pins
# the cotangents entering a rematerialized computation with optimization_barrier. auto's
# analysis looks through both, so its choices, estimates and consumers are the same
# either way.
REMAT_OPTIONS = [o for o in ("jax_remat3", "jax_custom_vjp3") if o in jax.config.values]


def _remat_programs():
    rng = np.random.default_rng(5)
    tab = rng.standard_normal((5000, 64)).astype(np.float32)
    idx = rng.integers(0, 5000, 4096).astype(np.int32)
    c, m = rng.random((5000, 64)) < 0.5, rng.random((4096, 64)) < 0.5

    def g(t, i):
        return jax_ext.gather(t, [0], 0, i, align_bytes=None)

    def select_in_checkpoint(t, i):  # its cotangent comes from the gather's scatter-add
        u = jax.checkpoint(lambda t: jax_ext.where(c, jnp.sin(t), 0.0))(t)
        return jnp.sum(jnp.tanh(g(u, i)))

    def gather_in_checkpoint(t, i):  # its cotangent comes from a select
        u = jax.checkpoint(lambda t: jnp.cos(g(t, i)))(t)
        return jnp.sum(jax_ext.where(m, u, 1.0) ** 2)

    def select_into_checkpoint(t, i):
        return jnp.sum(jax.checkpoint(lambda u: jnp.tanh(g(u, i)))(jax_ext.where(c, t, 0.0)))

    def custom_vjp_selects(t, i):
        @jax.custom_vjp
        def h(t):
            return jnp.sin(t)
        h.defvjp(lambda t: (jnp.sin(t), t), lambda r, ct: (jax_ext.where(m, ct, r),))
        return jnp.sum(h(g(t, i)))

    def custom_vjp_gathers(t, i):
        @jax.custom_vjp
        def h(t, i):
            return g(t, i)
        h.defvjp(lambda t, i: (g(t, i), i),
                 lambda i, ct: (jnp.zeros(tab.shape, jnp.float32).at[i].add(ct), None))
        return jnp.sum(jnp.tanh(h(jax_ext.where(c, t, 1.0), i)))

    fns = (select_in_checkpoint, gather_in_checkpoint, select_into_checkpoint,
           custom_vjp_selects, custom_vjp_gathers)
    return [(f"{f.__name__}{kind}", fn, (tab, idx)) for f in fns
            for kind, fn in (("", f), (":grad", jax.grad(f)))]


def _with_option(name, value, fn):
    old = jax.config.values[name]
    jax.config.update(name, value)
    try:
        return fn()
    finally:
        jax.config.update(name, old)


@pytest.mark.parametrize("option", REMAT_OPTIONS)
def test_choices_do_not_depend_on_the_remat_and_custom_vjp_implementation(table, option):
    changed = 0
    for name, fn, args in _remat_programs():
        def run():
            with jax_ext.implementation("auto"):
                # What each site chose, its estimates and its consumer; where a producer is
                # in memory, the reason may name the optimization_barrier remat3 pins it
                # with instead of what wrote it.
                return ([(d.op, d.impl, d.reason.split("; ")[0], d.reason.split(", ")[-1])
                         for d in jax_ext.explain(fn, *args)],
                        str(jax.make_jaxpr(fn)(*args)), jax.jit(fn)(*args))
        off, on = _with_option(option, False, run), _with_option(option, True, run)
        assert on[0] == off[0], (name, "\n".join(map(str, off[0])), "\n".join(map(str, on[0])))
        assert_bits_equal(on[2], off[2])
        changed += on[1] != off[1]
    # The option changed the programs jax traces (else this test tests nothing).
    assert changed, f"{option} changed no program"
