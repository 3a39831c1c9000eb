"""Training an embedding table at the cost of the rows it touches: jax_ext.gather looks the
rows up, jax.grad gives the gradient of the rows (not of the table), and
jax_ext.update_rows applies the optimizer to the rows the gather read, in place. The other
parameters take the usual dense step, with an optimizer of their own: the table stays out
of that pytree, since a dense optimizer applied to it (even one that zeroes its updates,
optax.set_to_zero) would add to every row.

With optax.adagrad the table and its state after each step equal the dense step's
(jax.grad with respect to the whole table, then the optimizer over it) bit for bit: checked
here at every step."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_ext

VOCAB, DIM, BATCH, SEQ = 1000, 16, 8, 12
rng = np.random.default_rng(0)
true_emb = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
true_w = rng.standard_normal(DIM).astype(np.float32)
table = jnp.asarray(rng.standard_normal((VOCAB, DIM)) * 0.1, jnp.float32)
dense = {"w": jnp.asarray(rng.standard_normal(DIM), jnp.float32)}
table_opt = optax.adagrad(1.0)  # row-separable: exact (see the training guide)
dense_opt = optax.adam(0.05)


def loss(rows: jax.Array, dense: dict[str, jax.Array], y: jax.Array) -> jax.Array:
    """A regression on the mean of each sequence's embeddings."""
    h = rows.reshape(BATCH, SEQ, DIM).mean(axis=1)
    return jnp.mean((h @ dense["w"] - y) ** 2)


@functools.partial(jax.jit, donate_argnums=(0, 1, 2, 3))
def step(table: jax.Array, table_state: optax.OptState, dense: dict[str, jax.Array],
         dense_state: optax.OptState, ids: jax.Array, y: jax.Array
         ) -> tuple[jax.Array, optax.OptState, dict[str, jax.Array], optax.OptState, jax.Array]:
    flat = ids.reshape(-1)
    rows = jax_ext.gather(table, [0], 0, flat, align_bytes=None)
    value, (g_rows, g_dense) = jax.value_and_grad(loss, argnums=(0, 1))(rows, dense, y)
    table, table_state = jax_ext.update_rows(table_opt, table, table_state, [0], 0, flat,
                                             g_rows)
    updates, dense_state = dense_opt.update(g_dense, dense_state, dense)
    return table, table_state, optax.apply_updates(dense, updates), dense_state, value


@jax.jit
def dense_table_step(table: jax.Array, state: optax.OptState, dense: dict[str, jax.Array],
                     ids: jax.Array, y: jax.Array) -> tuple[jax.Array, optax.OptState]:
    """The reference: the gradient of the whole table, then adagrad over all of it."""
    flat = ids.reshape(-1)
    g = jax.grad(lambda t: loss(jax_ext.gather(t, [0], 0, flat, align_bytes=None), dense,
                                y))(table)
    u, state = table_opt.update(g, state, table)
    return optax.apply_updates(table, u), state


table_state, dense_state = table_opt.init(table), dense_opt.init(dense)
ref_table, ref_state = jnp.array(table, copy=True), table_opt.init(table)
losses = []
for k in range(50):
    ids_np = rng.integers(0, VOCAB, (BATCH, SEQ))
    ids = jnp.asarray(ids_np, jnp.int32)
    y = jnp.asarray(true_emb[ids_np].mean(axis=1) @ true_w)
    ref_table, ref_state = dense_table_step(ref_table, ref_state, dense, ids, y)
    table, table_state, dense, dense_state, value = step(table, table_state, dense,
                                                         dense_state, ids, y)
    losses.append(float(value))
    assert np.array_equal(np.asarray(table).view(np.uint32),
                          np.asarray(ref_table).view(np.uint32)), f"step {k}: table differs"
    for a, b in zip(jax.tree.leaves(table_state), jax.tree.leaves(ref_state)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"step {k}: state differs"
first, last = np.mean(losses[:5]), np.mean(losses[-5:])
assert last < first, losses
print(f"50 steps: the table and its adagrad state equal the dense step's bit for bit; "
      f"loss {first:.3f} -> {last:.3f} (mean of 5 steps)")
