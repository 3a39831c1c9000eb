"""Issue 10, "a full JAX citizen": vmap over zero examples and Python scalar tangents
(PRNG keys and shape-polymorphic export have files of their own)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ext
from references import IMPLS, assert_bits_equal

# --- vmap over a batch of size 0 ------------------------------------------------------

_SRC = np.arange(4 * 3 * 5, dtype=np.float32).reshape(4, 3, 5)
_IDX = np.array([0, 3, 7, -1], np.int32)


def _gather_fn(src, off, index, num, pad):
    return jax_ext.gather(src, [off, 1], 1, index, num_indices=num, pad_value=pad)


def _gather_ref(src, off, index, num, pad):
    """The same rows with jnp indexing (every row is checked against src's bounds)."""
    src, r = jnp.asarray(src), 1 + index
    ok = (off >= 0) & (off < src.shape[0]) & (r >= 0) & (r < src.shape[1]) & (
        jnp.arange(index.shape[0]) < num)
    rows = src[jnp.clip(off, 0, src.shape[0] - 1)][jnp.clip(r, 0, src.shape[1] - 1)]
    rows = jnp.where(ok[:, None], rows, pad)
    return jnp.concatenate([rows, jnp.broadcast_to(pad, rows.shape[:-1] + (3,))], axis=-1)


_GATHER_ARGS = (_SRC, np.int32(0), _IDX, np.int32(3), np.float32(-1.0))


def _batched(args, axes, size):
    return [np.zeros((size,) + np.shape(a), np.asarray(a).dtype) + np.asarray(a)
            if ax is not None else a for a, ax in zip(args, axes)]


# Each operand alone, all of them, and mixed pairs (src, offsets, index, num, pad).
_GATHER_AXES = [tuple(0 if k == j else None for k in range(5)) for j in range(5)] + [
    (0,) * 5, (0, None, 0, None, None), (None, 0, 0, 0, None), (0, None, None, None, 0)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("axes", _GATHER_AXES, ids=str)
def test_gather_vmap_zero_batch_every_operand_pattern(axes, impl):
    with jax_ext.implementation(impl):
        for size in (0, 2):
            args = _batched(_GATHER_ARGS, axes, size)
            got = jax.vmap(_gather_fn, in_axes=axes)(*args)
            want = jax.vmap(_gather_ref, in_axes=axes)(*args)
            assert_bits_equal(got, want)
            assert got.shape == (size, 4, 8)
        # gradient for src and pad_value (their cotangent is a scatter-add / a sum)
        g = jax.vmap(jax.grad(lambda *a: _gather_fn(*a).sum(), argnums=(0, 4)),
                     in_axes=axes)(*args)
        gw = jax.vmap(jax.grad(lambda *a: _gather_ref(*a).sum(), argnums=(0, 4)),
                      in_axes=axes)(*args)
        for a, b in zip(g, gw):
            assert_bits_equal(a, b)
        args = _batched(_GATHER_ARGS, axes, 0)  # and jit of the vmap, of its grad too
        assert jax.jit(jax.vmap(_gather_fn, in_axes=axes))(*args).shape == (0, 4, 8)
        g = jax.jit(jax.vmap(jax.grad(lambda *a: _gather_fn(*a).sum(), argnums=(0, 4)),
                             in_axes=axes))(*args)
        assert [a.shape for a in g] == [(0, 4, 3, 5), (0,)]


@pytest.mark.parametrize("impl", IMPLS)
def test_gather_vmap_zero_batch_all_31_operand_patterns(impl):
    """Every subset of (src, offsets, index, num_indices, pad_value) batched over 0
    examples, forward and gradient (src, pad_value), all in one jitted program."""
    patterns = [a for a in itertools.product((0, None), repeat=5) if any(x == 0 for x in a)]
    assert len(patterns) == 31
    grad = jax.grad(lambda *a: _gather_fn(*a).sum(), argnums=(0, 4))
    gref = jax.grad(lambda *a: _gather_ref(*a).sum(), argnums=(0, 4))
    all_args = [_batched(_GATHER_ARGS, axes, 0) for axes in patterns]

    def run(all_args):
        return [(jax.vmap(_gather_fn, in_axes=ax)(*a), jax.vmap(grad, in_axes=ax)(*a))
                for ax, a in zip(patterns, all_args)]
    with jax_ext.implementation(impl):
        outs = jax.jit(run)(all_args)
        text = jax.jit(run).lower(all_args).as_text()
    if impl == "native" and jax_ext.native_available():
        assert "jax_ext_gather_v2" in text and "jax_ext_scatter_add_v2" in text
    for ax, a, (fwd, (gs, gp)) in zip(patterns, all_args, outs):
        want = jax.eval_shape(jax.vmap(_gather_ref, in_axes=ax), *a)
        gw = jax.eval_shape(jax.vmap(gref, in_axes=ax), *a)
        assert (fwd.shape, fwd.dtype) == (want.shape, want.dtype) == ((0, 4, 8), np.float32)
        assert (gs.shape, gp.shape) == (gw[0].shape, gw[1].shape) == ((0, 4, 3, 5), (0,))


@pytest.mark.parametrize("impl", IMPLS)
def test_issue_snippets_zero_batch_gather(impl):
    src, idx = jnp.ones((4, 3), jnp.float32), jnp.array([0, 5])
    with jax_ext.implementation(impl):
        a = jax.vmap(lambda i: jax_ext.gather(src, [0], 0, i))(jnp.zeros((0, 3), jnp.int32))
        b = jax.vmap(lambda s: jax_ext.gather(s, [0], 0, idx))(jnp.zeros((0, 4, 3), jnp.float32))
    assert a.shape == (0, 3, 8) and b.shape == (0, 2, 8)
    assert jax.vmap(lambda i: jnp.take(src, i, axis=0))(jnp.zeros((0, 3), jnp.int32)).shape[:2] \
        == a.shape[:2]


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_add_vmap_zero_batch(impl):
    """The transpose itself under vmap of size 0 (ct batched, index batched or both)."""
    src = jnp.asarray(_SRC)
    with jax_ext.implementation(impl):
        for axes in ((0, None), (None, 0), (0, 0)):
            ct = jnp.zeros((0, 4, 8), jnp.float32) if axes[0] == 0 else jnp.ones((4, 8), jnp.float32)
            idx = jnp.zeros((0, 4), jnp.int32) if axes[1] == 0 else jnp.asarray(_IDX)
            lin = lambda c, i: jax.linear_transpose(  # noqa: E731
                lambda s: jax_ext.gather(s, [0, 1], 1, i), src)(c)[0]
            got = jax.vmap(lin, in_axes=axes)(ct, idx)
            assert got.shape == (0, 4, 3, 5) and got.dtype == jnp.float32


_SELECTS = {
    "select": (jax_ext.select, ((3,), (2, 3), (2, 3))),
    "where": (jax_ext.where, ((2, 1), (3,), (2, 3))),
    "where3": (jax_ext.where3, ((2,), (2, 3), (2, 3))),
}


def _ref_where(c, x, y):
    """jnp.where, with where3's row mode (a vector condition picks rows) spelled out."""
    if c.ndim == 1 and x.ndim == 2 and x.shape == y.shape and c.shape[0] == x.shape[0]:
        c = c[:, None]
    return jnp.where(c, x, y)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(_SELECTS))
@pytest.mark.parametrize("axes", [a for a in itertools.product((0, None), repeat=3)
                                  if any(x is not None for x in a)] + [(1, 1, None), (None, 0, 1)])
def test_selects_vmap_zero_batch_every_operand_pattern(name, axes, impl):
    fn, shapes = _SELECTS[name]
    rng = np.random.default_rng(0)
    base = [rng.integers(0, 2, shapes[0]).astype(bool),
            rng.standard_normal(shapes[1]).astype(np.float32),
            rng.standard_normal(shapes[2]).astype(np.float32)]
    axes = tuple(None if ax is None or ax > len(s) else ax for ax, s in zip(axes, shapes))
    if all(a is None for a in axes):
        return
    with jax_ext.implementation(impl):
        for size in (0, 2):
            args = [np.moveaxis(np.stack([a] * size) if size else
                                np.zeros((0,) + a.shape, a.dtype), 0, ax) if ax is not None
                    else a for a, ax in zip(base, axes)]
            got = jax.vmap(fn, in_axes=axes)(*args)
            want = jax.vmap(_ref_where, in_axes=axes)(*args)
            assert_bits_equal(got, want)
            f = lambda c, x, y: fn(c, x, y).sum()  # noqa: E731
            for a, b in zip(jax.vmap(jax.grad(f, argnums=(1, 2)), in_axes=axes)(*args),
                            jax.vmap(jax.grad(lambda c, x, y: _ref_where(c, x, y).sum(),
                                              argnums=(1, 2)), in_axes=axes)(*args)):
                assert_bits_equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_selects_vmap_zero_batch_all_axes_patterns(impl):
    """Every in_axes pattern over (0, 1, None) for each select at 0 examples, forward and
    gradient, in one jitted program, against jnp.where's shapes."""
    calls = []
    for _name, (fn, shapes) in sorted(_SELECTS.items()):
        for axes in itertools.product((0, 1, None), repeat=3):
            axes = tuple(None if ax is None or ax > len(sh) else ax for ax, sh in zip(axes, shapes))
            if all(a is None for a in axes):
                continue
            args = [np.zeros(sh[:ax] + (0,) + sh[ax:], dt) if ax is not None else np.zeros(sh, dt)
                    for sh, ax, dt in zip(shapes, axes, (bool, np.float32, np.float32))]
            calls.append((fn, axes, args))

    def run(all_args):
        return [(jax.vmap(fn, in_axes=ax)(*a),
                 jax.vmap(jax.grad(lambda c, x, y, fn=fn: fn(c, x, y).sum(), argnums=(1, 2)),
                          in_axes=ax)(*a)) for (fn, ax, _), a in zip(calls, all_args)]
    with jax_ext.implementation(impl):
        outs = jax.jit(run)([c[2] for c in calls])
    for (_fn, ax, a), (fwd, g) in zip(calls, outs):
        want = jax.eval_shape(jax.vmap(_ref_where, in_axes=ax), *a)
        gw = jax.eval_shape(jax.vmap(jax.grad(lambda c, x, y: _ref_where(c, x, y).sum(),
                                              argnums=(1, 2)), in_axes=ax), *a)
        assert (fwd.shape, fwd.dtype) == (want.shape, want.dtype) and fwd.shape[0] == 0
        assert [t.shape for t in g] == [t.shape for t in gw]


# --- Python scalar tangents -------------------------------------------------------------

_SCALAR_FNS = {
    "where": (lambda x: jax_ext.where(True, x, x), lambda x: jnp.where(True, x, x)),
    "where_vec": (lambda x: jax_ext.where(jnp.array([True, False]), x, 2 * x),
                  lambda x: jnp.where(jnp.array([True, False]), x, 2 * x)),
    "select": (lambda x: jax_ext.select(False, x, 3 * x), lambda x: jnp.where(False, x, 3 * x)),
    "where3": (lambda x: jax_ext.where3(False, x, x * 3), lambda x: jnp.where(False, x, x * 3)),
    "gather": (lambda x: jax_ext.gather(jnp.ones((3, 2)) * x, [0], 0, jnp.array([0, 2, 5]),
                                        align_bytes=None),
               lambda x: jnp.take(jnp.ones((3, 2)) * x, jnp.array([0, 2, 5]), axis=0,
                                  mode="fill", fill_value=0)),
}


def _jvp_results(g, x, t):
    f = lambda x: jax.jvp(g, (x,), (t,))[1]  # noqa: E731
    lin = lambda x: jax.linearize(g, x)[1](t)  # noqa: E731
    jax.make_jaxpr(f)(x)
    jax.make_jaxpr(lin)(x)
    return [np.asarray(r) for r in (f(x), jax.jit(f)(x), lin(x), jax.jit(lin)(x))]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(_SCALAR_FNS))
@pytest.mark.parametrize("x,t", [(1.5, 1.0), (1.5, 2.0), (1 + 1j, 1 + 2j), (3, 1),
                                 (np.float32(1.0), 2.0)], ids=repr)
def test_python_scalar_tangent_jit_make_jaxpr_jvp_linearize(name, x, t, impl):
    fn, ref = _SCALAR_FNS[name]
    with jax_ext.implementation(impl):
        try:
            got = _jvp_results(fn, x, t)
        except TypeError as e:  # jax itself refuses some pairs (int primal, int tangent)
            with pytest.raises(TypeError):
                _jvp_results(ref, x, t)
            assert "jvp" in str(e)
            return
    want = _jvp_results(ref, x, t)
    for a, b in zip(got, want):
        assert_bits_equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_python_scalar_tangent_for_pad_value(impl):
    fn = lambda x: jax_ext.gather(jnp.ones((3, 2)), [0], 0, jnp.array([0, 5]),  # noqa: E731
                                  pad_value=x, align_bytes=None)
    ref = lambda x: jnp.where(jnp.array([[False], [True]]), x, jnp.ones((2, 2)))  # noqa: E731
    with jax_ext.implementation(impl):
        got = _jvp_results(fn, 1.5, 2.0)
    for a, b in zip(got, _jvp_results(ref, 1.5, 2.0)):
        assert_bits_equal(a, b)


def test_issue_snippet_scalar_tangent():
    f = lambda x: jax.jvp(lambda x: jax_ext.where(True, x, x), (x,), (1.,))  # noqa: E731
    p, t = jax.jit(f)(1.)
    assert float(p) == 1.0 and float(t) == 1.0
    assert "jax_ext_select" in str(jax.make_jaxpr(f)(1.))
