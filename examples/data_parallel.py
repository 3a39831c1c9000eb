"""Data-parallel training with shard_map on 4 host devices: the batch is sharded along "x",
the parameters (an embedding table, a projection and the value of masked positions) are
replicated. Their gradients are summed over the devices, as with jnp.take / jnp.where:
the losses and the parameters follow the jnp twin of the same program step by step.
(JAX_EXT_IMPL=native or =lax python examples/data_parallel.py forces one path.)"""
import os

# Must happen before jax is imported: split the CPU into 4 devices.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_ext  # noqa: E402

Params = dict[str, jax.Array]
REPLICATED, SHARDED = P(), P("x")
VOCAB, DIM, BATCH, SEQ = 64, 8, 16, 12
mesh = jax.make_mesh((4,), ("x",))
rng = np.random.default_rng(0)
params0 = {"emb": rng.standard_normal((VOCAB, DIM)).astype(np.float32),
           "w": rng.standard_normal((DIM,)).astype(np.float32),
           "fill": np.array(0.5, np.float32)}  # what a padded position predicts
tokens = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
targets = rng.standard_normal((BATCH, SEQ)).astype(np.float32)
mask = rng.random((BATCH, SEQ)) < 0.8  # False: a padded position


def jax_ext_predict(p: Params, ids: jax.Array, m: jax.Array) -> jax.Array:
    rows = jax_ext.gather(p["emb"], [0], 0, ids.reshape(-1), align_bytes=None)
    return jax_ext.where(m, (rows @ p["w"]).reshape(ids.shape), p["fill"])


def jnp_predict(p: Params, ids: jax.Array, m: jax.Array) -> jax.Array:
    return jnp.where(m, jnp.take(p["emb"], ids, axis=0) @ p["w"], p["fill"])


def make_step(predict: Callable[[Params, jax.Array, jax.Array], jax.Array]
              ) -> Callable[..., tuple[Params, jax.Array]]:
    def local_loss(p: Params, ids: jax.Array, y: jax.Array, m: jax.Array) -> jax.Array:
        # The mean over the whole batch: each device's sum, summed over the devices.
        total: jax.Array = jax.lax.psum(jnp.sum((predict(p, ids, m) - y) ** 2), "x")
        return total / (BATCH * SEQ)

    def local_step(p: Params, ids: jax.Array, y: jax.Array,
                   m: jax.Array) -> tuple[Params, jax.Array]:
        value, grads = jax.value_and_grad(local_loss)(p, ids, y, m)
        return jax.tree.map(lambda a, g: a - 0.5 * g, p, grads), value

    return jax.jit(jax.shard_map(local_step, mesh=mesh,
                                 in_specs=(REPLICATED, SHARDED, SHARDED, SHARDED),
                                 out_specs=(REPLICATED, REPLICATED)))


def put(a: np.ndarray, spec: P) -> jax.Array:
    placed: jax.Array = jax.device_put(a, NamedSharding(mesh, spec))
    return placed


batch = [put(a, SHARDED) for a in (tokens, targets, mask)]
runs = {}
for name, predict in (("jax_ext", jax_ext_predict), ("jnp", jnp_predict)):
    step = make_step(predict)
    p = {k: put(v, REPLICATED) for k, v in params0.items()}
    history = []
    for _ in range(10):
        p, value = step(p, *batch)
        history.append((float(value), jax.tree.map(np.asarray, p)))
    runs[name] = history

for k, ((loss, p), (loss_ref, p_ref)) in enumerate(zip(runs["jax_ext"], runs["jnp"])):
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6, err_msg=f"step {k}")
    for name in p:
        np.testing.assert_allclose(p[name], p_ref[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {k}: {name}")
first, last = runs["jax_ext"][0][0], runs["jax_ext"][-1][0]
assert last < first, (first, last)
print(f"loss {first:.4f} -> {last:.4f} in 10 steps on {len(jax.devices())} devices, "
      "step by step equal to the jnp twin")
