"""A training step that uses gather (an embedding lookup) and where (a masked loss) under
jit, grad and vmap, and checks the gradient against jnp.take / jnp.where."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_ext

VOCAB, DIM, BATCH, SEQ = 50, 16, 4, 6
rng = np.random.default_rng(0)
params = {"emb": jnp.asarray(rng.standard_normal((VOCAB, DIM)), jnp.float32),
          "w": jnp.asarray(rng.standard_normal((DIM,)), jnp.float32)}
tokens = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
targets = jnp.asarray(rng.standard_normal((BATCH, SEQ)), jnp.float32)
mask = jnp.asarray(rng.random((BATCH, SEQ)) < 0.8)  # padding positions are False


def embed(emb: jax.Array, ids: jax.Array) -> jax.Array:
    return jax_ext.gather(emb, [0], 0, ids, align_bytes=None)  # (SEQ, DIM)


def loss(p: dict[str, jax.Array], ids: jax.Array, y: jax.Array, m: jax.Array) -> jax.Array:
    h = jax.vmap(embed, in_axes=(None, 0))(p["emb"], ids)  # one native call for the batch
    err = (h @ p["w"] - y) ** 2
    return jnp.sum(jax_ext.where(m, err, 0.0)) / jnp.sum(m)  # padded positions count 0


def reference_loss(p: dict[str, jax.Array], ids: jax.Array, y: jax.Array,
                   m: jax.Array) -> jax.Array:
    err = (jnp.take(p["emb"], ids, axis=0) @ p["w"] - y) ** 2
    return jnp.sum(jnp.where(m, err, 0.0)) / jnp.sum(m)


@jax.jit
def step(p: dict[str, jax.Array], ids: jax.Array, y: jax.Array,
         m: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    value, grads = jax.value_and_grad(loss)(p, ids, y, m)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


g = jax.grad(loss)(params, tokens, targets, mask)
g_ref = jax.grad(reference_loss)(params, tokens, targets, mask)
for k in params:
    np.testing.assert_allclose(g[k], g_ref[k], rtol=1e-5, atol=1e-6)

losses = []
for _ in range(20):
    params, value = step(params, tokens, targets, mask)
    losses.append(float(value))
assert losses[-1] < losses[0], losses
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in 20 steps")
