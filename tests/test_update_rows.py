"""update_rows, a training step on the rows a gather read, on one device: the gradient sums
and the rows the optimizer sees against a plain loop; the whole table and state against the
dense step (jax.grad through gather, then the optimizer) bit for bit for sgd and adagrad;
lazy optimizers against the optimizer applied to the touched rows; untouched rows' bits;
eager, jit, vmap, export, a scan of steps in place; errors. Every test runs every path."""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

import jax_ext
from references import (IMPL_PAIRS, IMPLS, assert_bits_equal, random_values, ref_touched,
                        special_values)

F32, BF16 = np.float32, ml_dtypes.bfloat16


def setup_module(module):
    assert jax_ext.native_available(), "the compiled module must be installed (pip install .)"


class Probe:
    """An optimizer that moves no parameter (its updates are -0.0, which leaves every value,
    -0.0 included, as it is) and records in its state what update_rows hands it: the
    gradient sums ("g"), the table's rows ("p"), the state's rows ("s") and each row's slot
    ("slot"). Leaves shaped like the table are read and written at the touched rows only."""

    def init(self, table):
        z = jnp.zeros(table.shape, table.dtype)
        return {"g": z, "p": z, "s": z, "slot": jnp.zeros(table.shape, np.float32),
                "count": jnp.zeros((), np.int32)}

    def update(self, g, state, params):
        slot = jnp.broadcast_to(jnp.arange(g.shape[0], dtype=np.float32).reshape(
            (-1,) + (1,) * (g.ndim - 1)), g.shape)
        new = {"g": g, "p": params, "s": state["p"], "slot": slot, "count": state["count"] + 1}
        return jnp.full_like(g, -0.0), new


PROBE = Probe()


def step_fn(opt, offsets, dim, **kw):
    """A jitted update_rows step, its table and state donated."""
    return jax.jit(lambda t, s, i, g: jax_ext.update_rows(opt, t, s, offsets, dim, i, g, **kw),
                   donate_argnums=(0, 1))


def copy(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def cases():
    """(table shape, offsets, dim, index, num_indices, check_bounds, grads' L)."""
    rng = np.random.default_rng(1)
    ids = rng.integers(-3, 40, 64)
    ids[10:20] = ids[0:10]  # repeats
    return [
        ((37, 5), [0], 0, ids, None, True, 8),           # padding columns, out of range
        ((37, 8), [2], 0, ids - 2, 50, True, 8),         # an offset, num_indices
        ((4, 37, 3, 6), [2, 1], 1, ids, None, True, 8),  # a dim before dim, middle dims
        ((37, 5), [0], 0, ids, 33, False, 5),            # check_bounds=False, no padding
        ((4, 37, 6), [9, 0], 1, ids, None, True, 6),     # the outer offset out of range
    ]


def grads_for(shape, dim, n, L, dtype, rng):
    return rng.standard_normal((n,) + tuple(shape[dim + 1:-1]) + (L,)).astype(dtype)


# --- what the optimizer sees ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16, np.float16, np.float64])
@pytest.mark.parametrize("impl", IMPLS)
def test_the_optimizer_sees_each_row_s_gradient_sum_and_its_rows(impl, dtype):
    """Per distinct row read: the sum of its gradient rows in index order (the dense
    gradient's row), the table's and the state's rows bit for bit, in order of first
    occurrence; untouched rows of every leaf keep their bits; a scalar leaf is passed
    whole. Out-of-range and negative rows, num_indices and check_bounds=False rows
    update nothing."""
    rng = np.random.default_rng(0)
    for shape, offsets, dim, ids, num, cb, L in cases():
        table = random_values(rng, shape, dtype)
        state = {k: jnp.asarray(random_values(rng, shape, np.float32 if k == "slot" else dtype))
                 for k in ("g", "p", "s", "slot")}
        state["count"] = jnp.asarray(3, np.int32)
        grads = grads_for(shape, dim, len(ids), L, dtype, rng)
        with jax_ext.implementation(impl):
            t, s = step_fn(PROBE, offsets, dim, num_indices=num, check_bounds=cb)(
                jnp.asarray(table), copy(state), jnp.asarray(ids), jnp.asarray(grads))
        order, sums = ref_touched(shape, offsets, dim, ids, grads, num)
        s = jax.tree.map(np.asarray, s)
        want = {k: np.array(v) for k, v in state.items()}
        for k, pos in enumerate(order):
            want["g"][pos] = sums[pos]
            want["p"][pos] = table[pos]
            want["s"][pos] = np.asarray(state["p"])[pos]
            want["slot"][pos] = k
        want["count"] = np.asarray(4, np.int32)
        assert_bits_equal(t, table)  # -0.0 updates: every bit stays, NaNs too
        for k in want:
            assert_bits_equal(s[k], want[k])


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_the_sums_and_rows_match_a_loop_for_random_geometry(data):
    """Random tables, index dtypes, repeats and ranges: each pair of paths against the
    loop."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 31)))
    rows = data.draw(st.integers(1, 40))
    last = data.draw(st.integers(1, 9))
    n = data.draw(st.integers(0, 60))
    idt = data.draw(st.sampled_from([np.int8, np.uint8, np.int32, np.int64, np.uint32]))
    lo = 0 if np.dtype(idt).kind == "u" else -4
    ids = rng.integers(lo, rows + 4, n).astype(idt)
    shape = (rows, last)
    table = random_values(rng, shape, F32)
    grads = rng.standard_normal((n, last + data.draw(st.integers(0, 3)))).astype(F32)
    num = data.draw(st.one_of(st.none(), st.integers(0, n)))
    order, sums = ref_touched(shape, [0], 0, ids, grads, num)
    for impl in next(IMPL_PAIRS):
        with jax_ext.implementation(impl):
            _, s = jax_ext.update_rows(PROBE, table, PROBE.init(table), [0], 0, ids, grads,
                                       num_indices=num)
        g = np.array(PROBE.init(table)["g"])
        for pos in order:
            g[pos] = sums[pos]
        assert_bits_equal(s["g"], g)


# --- against the dense step ------------------------------------------------------------

def dense_step(opt, offsets, dim, ids, loss, **kw):
    """The dense step: jax.grad of the loss through gather with respect to the table, then
    the optimizer over the whole table, in one jitted program."""
    @jax.jit
    def step(t, s, w):
        g = jax.grad(lambda t: loss(jax_ext.gather(t, offsets, dim, ids, **kw), w))(t)
        u, s = opt.update(g, s, t)
        return optax.apply_updates(t, u), s
    return step


def sparse_step(opt, offsets, dim, ids, loss, **kw):
    """The same step with update_rows: the gather's cotangent, then the touched rows."""
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(t, s, w):
        rows = jax_ext.gather(t, offsets, dim, ids, **kw)
        g = jax.grad(loss)(rows, w)
        return jax_ext.update_rows(opt, t, s, offsets, dim, ids, g, **kw)
    return step


def loss(rows, w):
    """Gradient rows that depend on the rows looked up."""
    return jnp.sum(rows * w) + jnp.sum(rows.astype(np.float32) ** 2) / 4


OPTS = {"sgd": lambda: optax.sgd(0.05), "adagrad": lambda: optax.adagrad(0.1),
        "adam": lambda: optax.adam(0.01), "momentum": lambda: optax.sgd(0.05, momentum=0.9)}


def _contracts_by_position():
    """Does this XLA:CPU fuse a multiply-add into an FMA for some elements of one
    elementwise program and not for others, by their position in the array? (jax 0.12's
    does; jax 0.10's contracts every element alike.) Then the same arithmetic on the same
    values gives other bits in a table of another shape, the dense step's own included."""
    rng = np.random.default_rng(0)
    t, x = (rng.standard_normal(185).astype(F32) for _ in range(2))
    a = x * x  # adagrad's last step: t + (x * rsqrt(a + eps)) * -lr
    f = jax.jit(lambda t, x, a: t + (x * jax.lax.rsqrt(a + F32(1e-7))) * F32(-0.1))
    flat = np.asarray(f(t, x, a)).view(np.uint32)
    rows = np.asarray(f(*(v.reshape(37, 5) for v in (t, x, a)))).reshape(-1).view(np.uint32)
    return bool((flat != rows).any())


CONTRACTS_BY_POSITION = _contracts_by_position()


def assert_one_contraction_apart(got, want, table, g, state, name, lr):
    """Where XLA contracts by position: the last operation of sgd's and adagrad's step is
    ``table + x * -lr`` (x: the gradient, times adagrad's rsqrt of its new sum of squares);
    each element of `got` and of `want` is that multiply-add rounded once (an FMA) or
    twice, and equal to `want` wherever the two roundings agree."""
    x = np.asarray(g, F32)
    if name == "adagrad":
        acc = jax.tree.leaves(state)[0]
        x = x * np.asarray(jax.jit(lambda a: jnp.where(a > 0, jax.lax.rsqrt(a + F32(1e-7)),
                                                       0))(acc))
    c = F32(-lr)
    t = np.asarray(table, F32)
    twice = (t + x * c).view(np.uint32)
    once = (t.astype(np.float64) + x.astype(np.float64) * np.float64(c)).astype(F32)
    once = once.view(np.uint32)
    got, want = (np.asarray(a).view(np.uint32) for a in (got, want))
    for a in (got, want):
        assert ((a == twice) | (a == once)).all(), "not the step's multiply-add"
    assert (got[twice == once] == want[twice == once]).all()


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("impl", IMPLS)
def test_sgd_and_adagrad_equal_the_dense_step_bit_for_bit(impl, name, dtype):
    """The whole table and state after each of two steps, from the same table and state
    (repeated, out-of-range and negative ids, num_indices, padding columns, dims before
    dim). Where XLA contracts multiply-adds by an element's position
    (CONTRACTS_BY_POSITION: the dense step's float32 bits then depend on the table's
    shape), the float32 table's elements are its step's multiply-add rounded once or
    twice, and the dense step's wherever those agree; the state stays bit for bit."""
    rng = np.random.default_rng(2)
    opt = OPTS[name]()
    lr = {"sgd": 0.05, "adagrad": 0.1}[name]
    for shape, offsets, dim, ids, num, _, _ in cases()[:3]:
        table = jnp.asarray(rng.standard_normal(shape).astype(dtype))
        n, row = len(ids), jax_ext.gather(table, offsets, dim, ids).shape[1:]
        w = jnp.asarray(rng.standard_normal((n,) + row).astype(dtype))
        dense = dense_step(opt, offsets, dim, ids, loss, num_indices=num)
        grad = jax.jit(jax.grad(lambda t, w: loss(
            jax_ext.gather(t, offsets, dim, ids, num_indices=num), w)))
        with jax_ext.implementation(impl):
            sparse = sparse_step(opt, offsets, dim, ids, loss, num_indices=num)
            td, sd = table, opt.init(table)
            for _ in range(2):
                ts, ss = sparse(copy(td), copy(sd), w)
                g = grad(td, w)
                t_in, (td, sd) = td, dense(td, sd, w)
                for a, b in zip(jax.tree.leaves(ss), jax.tree.leaves(sd)):
                    assert_bits_equal(a, b)
                if CONTRACTS_BY_POSITION and dtype == F32:
                    assert_one_contraction_apart(ts, td, t_in, g, sd, name, lr)
                else:
                    assert_bits_equal(ts, td)


@pytest.mark.parametrize("name", ["adam", "momentum"])
@pytest.mark.parametrize("impl", IMPLS)
def test_lazy_optimizers_update_the_touched_rows_only(impl, name):
    """Adam and momentum move rows whose gradient is zero in the dense step; here
    untouched rows and their state keep their bits, the step count advances once per
    call, and touched rows get the optimizer applied to them alone."""
    rng = np.random.default_rng(3)
    opt = OPTS[name]()
    shape = (50, 6)
    table = rng.standard_normal(shape).astype(F32)
    state = opt.init(jnp.asarray(table))
    for _ in range(3):
        ids = rng.integers(0, 50, 30)
        grads = rng.standard_normal((30, 8)).astype(F32)
        order, sums = ref_touched(shape, [0], 0, ids, grads)
        u = [p[0] for p in order]
        # The reference: the optimizer on the touched rows alone (a table of |U| rows).
        sub_state = jax.tree.map(lambda x: x[np.array(u)] if x.shape == shape else x, state)
        up, new_sub = jax.jit(opt.update)(jnp.stack([sums[p] for p in order]), sub_state,
                                          jnp.asarray(table[u]))
        want_t = table.copy()
        want_t[u] = np.asarray(optax.apply_updates(jnp.asarray(table[u]), up))
        with jax_ext.implementation(impl):
            t, s = step_fn(opt, [0], 0)(jnp.asarray(table), copy(state), jnp.asarray(ids),
                                        jnp.asarray(grads))
        untouched = np.setdiff1d(np.arange(50), u)
        assert_bits_equal(np.asarray(t)[untouched], table[untouched])
        np.testing.assert_allclose(np.asarray(t)[u], want_t[u], rtol=1e-6, atol=1e-7)
        for got, old, sub in zip(jax.tree.leaves(s), jax.tree.leaves(state),
                                 jax.tree.leaves(new_sub)):
            got, old, sub = map(np.asarray, (got, old, sub))
            if got.shape == shape:
                assert_bits_equal(got[untouched], old[untouched])
                np.testing.assert_allclose(got[u], sub, rtol=1e-6, atol=1e-7)
            else:
                assert_bits_equal(got, sub)  # the count: advanced once
        table, state = np.asarray(t), s


@pytest.mark.parametrize("dtype", [F32, BF16, np.float16])
@pytest.mark.parametrize("impl", IMPLS)
def test_untouched_rows_keep_signalling_nans_negative_zeros_and_payloads(impl, dtype):
    """A table and an adagrad state full of special values: every row the step does not
    touch keeps its bits (the dense step quiets a signalling NaN where it adds -0.0)."""
    rng = np.random.default_rng(4)
    shape = (40, 5)
    table = special_values(dtype, 200).reshape(shape)
    opt = optax.adagrad(0.1)
    state = opt.init(jnp.asarray(table))
    acc = special_values(dtype, 200).reshape(shape)
    state = (state[0]._replace(sum_of_squares=jnp.asarray(acc)),) + tuple(state[1:])
    ids = np.array([3, 7, 3, 11])
    grads = rng.standard_normal((4, 16 // np.dtype(dtype).itemsize * 2)).astype(dtype)
    with jax_ext.implementation(impl):
        t, s = step_fn(opt, [0], 0)(jnp.asarray(table), copy(state), jnp.asarray(ids),
                                    jnp.asarray(grads))
    keep = np.setdiff1d(np.arange(40), ids)
    assert_bits_equal(np.asarray(t)[keep], table[keep])
    assert_bits_equal(np.asarray(s[0].sum_of_squares)[keep], acc[keep])


# --- eager, vmap, export, scan ---------------------------------------------------------

def small(rng, rows=30, last=4, n=20):
    table = rng.standard_normal((rows, last)).astype(F32)
    ids = rng.integers(-2, rows + 2, n)
    grads = rng.standard_normal((n, 8)).astype(F32)
    return table, ids, grads


@pytest.mark.parametrize("impl", IMPLS)
def test_an_eager_call_equals_jit_bit_for_bit(impl):
    rng = np.random.default_rng(5)
    table, ids, grads = small(rng)
    opt = optax.adagrad(0.1)
    with jax_ext.implementation(impl):
        eager = jax_ext.update_rows(opt, table, opt.init(table), [0], 0, ids, grads)
        jitted = jax.jit(lambda *a: jax_ext.update_rows(opt, *a[:2], [0], 0, *a[2:]))(
            table, opt.init(table), ids, grads)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        assert_bits_equal(a, b)


def test_eager_calls_reuse_one_program_per_optimizer_and_the_cache_is_bounded():
    from jax_ext import _update_rows
    rng = np.random.default_rng(6)
    table, ids, grads = small(rng)
    opt = optax.sgd(0.1)
    f = _update_rows._jitted(opt)
    assert _update_rows._jitted(opt) is f
    for _ in range(_update_rows._CACHE_SIZE + 5):
        _update_rows._jitted(optax.sgd(0.1))
    assert len(_update_rows._CACHE) == _update_rows._CACHE_SIZE
    assert _update_rows._jitted(opt) is not f  # evicted: a new program


@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_over_stacked_tables_equals_a_loop(impl):
    rng = np.random.default_rng(7)
    tables = rng.standard_normal((3, 30, 4)).astype(F32)
    ids = rng.integers(-2, 32, (3, 20))
    grads = rng.standard_normal((3, 20, 8)).astype(F32)
    opt = optax.adam(0.01)
    states = jax.vmap(opt.init)(tables)
    with jax_ext.implementation(impl):
        f = jax.jit(jax.vmap(lambda t, s, i, g: jax_ext.update_rows(opt, t, s, [0], 0, i, g)))
        t, s = f(tables, states, ids, grads)
        for b in range(3):
            tb, sb = jax_ext.update_rows(opt, tables[b], opt.init(tables[b]), [0], 0, ids[b],
                                         grads[b])
            assert_bits_equal(np.asarray(t)[b], tb)
            for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(sb)):
                assert_bits_equal(np.asarray(x)[b], y)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_export_round_trip_keeps_the_bits(impl):
    rng = np.random.default_rng(8)
    table, ids, grads = small(rng)
    opt = optax.adagrad(0.1)
    treedef = jax.tree.structure(opt.init(table))

    def step(t, leaves, i, g):  # optax's states are not serializable pytrees: flat leaves
        t, s = jax_ext.update_rows(opt, t, jax.tree.unflatten(treedef, leaves), [0], 0, i, g)
        return t, jax.tree.leaves(s)
    args = (table, jax.tree.leaves(opt.init(table)), ids, grads)
    with jax_ext.implementation(impl):
        exp = jax.export.export(jax.jit(step), disabled_checks=jax_ext.export_checks())(*args)
        direct = jax.jit(step)(*args)
    text = exp.mlir_module()
    if impl == "native":
        assert "jax_ext_update_rows_read_v1" in text and "jax_ext_update_rows_write_v1" in text
    back = jax.export.deserialize(exp.serialize())
    for a, b in zip(jax.tree.leaves(back.call(*args)), jax.tree.leaves(direct)):
        assert_bits_equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_scan_of_steps_stays_in_place(impl):
    """Ten steps in a lax.scan, the table in its carry: the bits of ten single steps, and
    no table-sized buffer beyond the table."""
    rng = np.random.default_rng(9)
    table = rng.standard_normal((16384, 64)).astype(F32)  # 4 MiB
    ids = rng.integers(0, 16384, (10, 256))
    grads = rng.standard_normal((10, 256, 64)).astype(F32)
    opt = optax.sgd(0.1)
    s0 = opt.init(table)

    def steps(t, ids, grads):
        body = lambda t, x: (jax_ext.update_rows(opt, t, s0, [0], 0, *x)[0], None)  # noqa: E731
        return jax.lax.scan(body, t, (ids, grads))[0]
    with jax_ext.implementation(impl):
        f = jax.jit(steps, donate_argnums=0)
        temp = f.lower(table, ids, grads).compile().memory_analysis().temp_size_in_bytes
        got = f(jnp.asarray(table), ids, grads)
        want = jnp.asarray(table)
        one = jax.jit(lambda t, i, g: jax_ext.update_rows(opt, t, s0, [0], 0, i, g)[0])
        for k in range(10):
            want = one(want, ids[k], grads[k])
    assert_bits_equal(got, want)
    assert temp < table.nbytes // 2, temp


@pytest.mark.parametrize("impl", IMPLS)
def test_a_donated_step_s_temp_memory_is_a_few_times_its_grads(impl):
    rng = np.random.default_rng(10)
    table = jax.ShapeDtypeStruct((65536, 64), F32)  # 16 MiB
    ids = jax.ShapeDtypeStruct((2048,), np.int32)
    grads = jax.ShapeDtypeStruct((2048, 64), F32)
    opt = optax.adagrad(0.1)
    state = jax.eval_shape(opt.init, table)
    del rng
    with jax_ext.implementation(impl):
        c = step_fn(opt, [0], 0).lower(table, state, ids, grads).compile()
    m = c.memory_analysis()
    limit = min(8 * 2048 * 64 * 4 + (1 << 20), 65536 * 64 * 4 // 2)
    assert m.temp_size_in_bytes <= limit, m
    assert m.alias_size_in_bytes >= 2 * 65536 * 64 * 4, m  # the table and its accumulator


# --- errors --------------------------------------------------------------------------------

def test_errors_name_the_function_the_argument_shapes_and_dtypes():
    t = np.zeros((10, 4), F32)
    g = np.zeros((3, 8), F32)
    i = np.array([1, 2, 3])
    opt = optax.sgd(0.1)
    s = opt.init(t)
    cases = [
        (TypeError, "optimizer must have an update", (object(), t, s, [0], 0, i, g), {}),
        (TypeError, r"table must have a floating-point dtype, got table \(10, 4\) \(int32\)",
         (opt, t.astype(np.int32), s, [0], 0, i, g.astype(np.int32)), {}),
        (TypeError, "index must have an integer dtype", (opt, t, s, [0], 0, i * 1.0, g), {}),
        (TypeError, r"grads \(3, 8\) \(float16\) must have the table's dtype float32",
         (opt, t, s, [0], 0, i, g.astype(np.float16)), {}),
        (ValueError, r"grads \(3, 2\) must have shape \(3, L\) with L >= 4",
         (opt, t, s, [0], 0, i, g[:, :2]), {}),
        (ValueError, r"grads \(2, 8\) must have shape \(3, L\)", (opt, t, s, [0], 0, i, g[:2]),
         {}),
        (ValueError, r"state leaf \['w'\] \(3,\) \(float32\) is neither shaped like the table",
         (opt, t, {"w": np.zeros(3, F32)}, [0], 0, i, g), {}),
        (ValueError, "offsets must hold dim \\+ 1 = 1 values", (opt, t, s, [0, 0], 0, i, g), {}),
        (NotImplementedError, "dim=1 is the last dimension", (opt, t, s, [0, 0], 1, i, g), {}),
        (ValueError, r"num_indices=4 must lie in \[0, n\]", (opt, t, s, [0], 0, i, g),
         {"num_indices": 4}),
    ]
    jitted = jax.jit(jax_ext.update_rows, static_argnums=(0, 4))
    for exc, msg, args, kw in cases:
        # Under jit too, where the arrays are traced: but a traced num_indices is clamped,
        # as gather's is, and an optimizer jit cannot hash is no static argument.
        calls = [jax_ext.update_rows] + ([jitted] if not kw and hasattr(args[0], "update")
                                         else [])
        for call in calls:
            with pytest.raises(exc, match=msg) as e:
                call(*args, **kw)
            assert "update_rows" in str(e.value)


def test_an_optimizer_that_changes_a_leaf_s_dtype_is_refused():
    class Widening:
        def update(self, g, s, p):
            return g, jax.tree.map(lambda x: x.astype(np.float64), s)
    t = np.zeros((10, 4), F32)
    with pytest.raises(TypeError, match=r"update_rows: the optimizer's update turns the state "
                                        r"leaf \['m'\] \(float32, .*\) into float64"):
        jax_ext.update_rows(Widening(), t, {"m": t}, [0], 0, np.array([1]), np.zeros((1, 8), F32))


@pytest.mark.parametrize("impl", IMPLS)
def test_grad_through_update_rows_raises_a_type_error_naming_it(impl):
    t = np.ones((10, 4), F32)
    opt = optax.sgd(0.1)
    f = lambda t: jax_ext.update_rows(opt, t, opt.init(t), [0], 0, np.array([1]),  # noqa: E731
                                      np.ones((1, 8), F32))[0].sum()
    with jax_ext.implementation(impl), pytest.raises(TypeError, match="update_rows"):
        jax.grad(f)(t)


def test_auto_explains_its_choice_at_an_update_rows_call_site():
    rng = np.random.default_rng(11)
    table, ids, grads = small(rng)
    opt = optax.sgd(0.1)
    ds = jax_ext.explain(lambda t, i, g: jax_ext.update_rows(opt, t, opt.init(t), [0], 0, i, g)[0],
                         table, ids, grads)
    d = [d for d in ds if d.op == "update_rows"]
    assert len(d) == 1 and d[0].impl in ("native", "lax") and "gradient rows" in d[0].reason


@pytest.mark.parametrize("impl", IMPLS)
def test_a_window_of_slots_at_a_time_gives_the_same_step(impl):
    """On a mesh a device steps on its distinct rows a window of slots at a time (its
    memory stays a fraction of the gradient rows'): windows of 16 slots, in a loop, give
    the bits of one window of all of them, and a step count advances once."""
    from jax_ext import _compat, _config, _update_rows_rules as rules
    from jax_ext._primitives import update_rows_p
    rng = np.random.default_rng(12)
    table, ids, grads = small(rng, rows=60, n=50)
    ids[40:] = ids[:10]
    opt = optax.adam(0.01)
    leaves, tree = jax.tree.flatten(opt.init(table))
    rows_at = tuple(i for i, x in enumerate(leaves) if x.shape == table.shape)

    def step(window):
        def f(t, i, g, *leaves):
            row = [leaves[j] for j in rows_at]
            other = [x for j, x in enumerate(leaves) if j not in rows_at]
            return _compat.bind(update_rows_p, t, jnp.zeros((1,), np.int32), i,
                                jnp.asarray(i.shape[0], np.int32), g[:, :4], *row, *other,
                                opt=rules.Optimizer(opt), treedef=tree, rows_at=rows_at,
                                dim=0, nbatch=0, window=window, impl=_config.current())
        return jax.jit(f)(table, ids.astype(np.int32), grads, *leaves)
    with jax_ext.implementation(impl):
        whole, windows = step(0), step(16)
    for a, b in zip(windows, whole):
        assert_bits_equal(a, b)
    assert int(windows[-1]) == 1  # adam's count, advanced once
