"""Typed PRNG key arrays (every implementation) in the four functions, under jit, vmap
and scan, against jnp.where and indexing; other extended dtypes raise TypeError."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_ext
from references import IMPLS

KEY_IMPLS = ["threefry2x32", "rbg", "unsafe_rbg"]


def _keys(impl, shape, seed=0):
    n = int(np.prod(shape))
    return jax.random.split(jax.random.key(seed, impl=impl), n).reshape(shape)


def _same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)),
                                  np.asarray(jax.random.key_data(want)))


def _row_cond(c, x):
    return c.reshape(c.shape + (1,) * (x.ndim - c.ndim))


_SELECTS = {
    "select": (lambda c, x, y: jax_ext.select(c, x, y), lambda c, x, y: jnp.where(c, x, y)),
    "where": (jax_ext.where, jnp.where),
    "where3": (jax_ext.where3, lambda c, x, y: jnp.where(_row_cond(c, x), x, y)),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_impl", KEY_IMPLS)
@pytest.mark.parametrize("name", sorted(_SELECTS))
def test_selects_of_keys_jit_vmap_scan(name, key_impl, impl):
    fn, ref = _SELECTS[name]
    x, y = _keys(key_impl, (4, 3), 1), _keys(key_impl, (4, 3), 2)
    rng = np.random.default_rng(0)
    conds = {"select": [rng.integers(0, 2, (3,)).astype(bool), np.bool_(True)],
             "where": [rng.integers(0, 2, (4, 1)).astype(bool), rng.integers(0, 2, (4, 3)).astype(bool)],
             "where3": [rng.integers(0, 2, (4,)).astype(bool), rng.integers(0, 2, (4, 3)).astype(bool),
                        np.bool_(False)]}[name]
    with jax_ext.implementation(impl):
        for c in conds:
            c = jnp.asarray(c)
            want = ref(c, x, y)
            _same(fn(c, x, y), want)
            _same(jax.jit(fn)(c, x, y), want)
            # vmap over the keys' leading dim (per-example keys), the condition too
            cb = c if name == "where3" and c.ndim == 1 else jnp.broadcast_to(c, (4, 3))
            _same(jax.vmap(fn)(cb, x, y), jax.vmap(ref)(cb, x, y))
        # unbatched condition, keys batched along dim 1, result along dim 1
        c0 = jnp.asarray(rng.integers(0, 2, (4,)).astype(bool))
        f = lambda g: jax.jit(jax.vmap(g, in_axes=(None, 1, 1), out_axes=1))  # noqa: E731
        _same(f(fn)(c0, x, y), f(ref)(c0, x, y))

        # scan: reset the keys of finished episodes each step
        def step(keys, done):
            fresh = jax.vmap(lambda k: jax.random.fold_in(k, 7))(keys.reshape(-1)).reshape(keys.shape)
            keys = fn(done, fresh, keys)
            return keys, jax.random.key_data(keys)[..., 0]

        def step_ref(keys, done):
            fresh = jax.vmap(lambda k: jax.random.fold_in(k, 7))(keys.reshape(-1)).reshape(keys.shape)
            d = _row_cond(done, keys) if name == "where3" else done
            keys = jnp.where(d, fresh, keys)
            return keys, jax.random.key_data(keys)[..., 0]

        xs = jnp.asarray(rng.integers(0, 2, (5, 4)).astype(bool))
        k0 = x[:, 0] if name != "where3" else x
        if name == "where3":
            got = lax.scan(step, k0, xs)
            want = lax.scan(step_ref, k0, xs)
        else:
            got = jax.jit(lambda k, d: lax.scan(step, k, d))(k0, xs)
            want = lax.scan(step_ref, k0, xs)
        _same(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_impl", KEY_IMPLS)
def test_gather_of_keys_jit_vmap_scan(key_impl, impl):
    table = _keys(key_impl, (5, 2, 3), 3)
    data = np.asarray(jax.random.key_data(table))
    k = data.shape[-1]
    idx = jnp.array([0, 4, -1, 2, 9, 1], jnp.int32)

    def ref(idx, off=0, align_bytes=None, num=None):
        r = np.asarray(idx) + off
        ok = (r >= 0) & (r < 5)
        if num is not None:
            ok &= np.arange(len(r)) < num
        out = np.where(ok[:, None, None, None], data[np.clip(r, 0, 4)], 0).astype(np.uint32)
        if align_bytes:
            per = align_bytes // (4 * k)
            L = -(-3 // per) * per
            out = np.concatenate([out, np.zeros(out.shape[:2] + (L - 3, k), np.uint32)], axis=2)
        return jax.random.wrap_key_data(jnp.asarray(out), impl=key_impl)

    with jax_ext.implementation(impl):
        for ab in (None, 16, 32, 64):
            _same(jax_ext.gather(table, [0], 0, idx, align_bytes=ab), ref(idx, align_bytes=ab))
        _same(jax.jit(lambda t, i, o: jax_ext.gather(t, [o], 0, i, num_indices=4))(
            table, idx, 1), ref(idx, off=1, align_bytes=32, num=4))
        # the key table indexed per example (vmap over index), and a batch of tables
        ib = jnp.stack([idx, idx[::-1]])
        got = jax.vmap(lambda i: jax_ext.gather(table, [0], 0, i, align_bytes=None))(ib)
        want = jnp.stack([ref(idx), ref(idx[::-1])])
        _same(got, want)
        tb = jnp.stack([table, table[::-1]])
        got = jax.jit(jax.vmap(lambda t: jax_ext.gather(t, [1, 0], 1, jnp.array([1, 0]),
                                                        align_bytes=None)))(tb)
        _same(got, jnp.stack([table[1][jnp.array([1, 0])], table[::-1][1][jnp.array([1, 0])]]))
        # inside scan: look up a key per step, as jnp indexing does
        steps = jnp.array([[1], [3], [0]], jnp.int32)
        got = lax.scan(lambda c, i: (c, jax_ext.gather(table, [0], 0, i, align_bytes=None)),
                       0, steps)[1]
        _same(got, jnp.stack([table[i] for i in steps]))
        # a 2-d table, dim 0: rows of keys, exactly jnp.take
        t2 = table[:, 0]
        _same(jax_ext.gather(t2, [0], 0, jnp.array([3, 1]), align_bytes=None),
              jnp.take(t2, jnp.array([3, 1]), axis=0))


def test_key_errors_in_jax_ext_words():
    ks = _keys("threefry2x32", (3,))
    c = jnp.array([True, False, True])
    with pytest.raises(TypeError, match="where: x and y must both be PRNG key arrays"):
        jax_ext.where(c, ks, jnp.zeros(3, jnp.uint32))
    with pytest.raises(TypeError, match="one implementation"):
        jax_ext.where(c, ks, _keys("rbg", (3,)))
    with pytest.raises(TypeError, match="select: .* PRNG key"):
        jax_ext.select(c, 0, ks)
    with pytest.raises(TypeError, match="must have dtype bool, got key"):
        jax_ext.where(ks, ks, ks)
    f0 = np.zeros((3,), jax.dtypes.float0)
    for fn in (jax_ext.where, jax_ext.where3, jax_ext.select):
        with pytest.raises(TypeError, match="which jax_ext does not support"):
            fn(c, f0, f0)
    with pytest.raises(TypeError, match="gather: src has dtype .*float0.* does not support"):
        jax_ext.gather(np.zeros((3, 2), jax.dtypes.float0), [0], 0, jnp.array([0]))
    t = _keys("rbg", (4, 2))
    with pytest.raises(ValueError, match="one key's size 16 bytes"):
        jax_ext.gather(t, [0], 0, jnp.array([0]), align_bytes=8)
    with pytest.raises(TypeError, match="pad_value must be None for a key array"):
        jax_ext.gather(t, [0], 0, jnp.array([0]), pad_value=0)
    with pytest.raises(NotImplementedError, match="dim=1 is the last dimension"):
        jax_ext.gather(t, [0, 0], 1, jnp.array([0]))
    with pytest.raises(NotImplementedError, match=r"last dimension of src \(4,\) \(key<rbg>\)"):
        jax_ext.gather(_keys("rbg", (4,)), [0], 0, jnp.array([0]))
    with pytest.raises(ValueError, match=r"dim must satisfy .* src \(\) \(key<rbg>\)"):
        jax_ext.gather(jax.random.key(0, impl="rbg"), [0], 0, jnp.array([0]))


def test_keys_move_natively_as_words():
    ks = _keys("rbg", (8, 3))
    c = jnp.arange(8)[:, None] % 2 == 0
    with jax_ext.implementation("native"):
        text = jax.jit(jax_ext.where).lower(c, ks, ks[::-1]).as_text()
        gtext = jax.jit(lambda t: jax_ext.gather(t, [0], 0, jnp.array([1]))).lower(ks).as_text()
    if jax_ext.native_available():
        assert "jax_ext_select_v" in text and "jax_ext_gather_v" in gtext
