"""Sharding on 4 host devices: jax_ext operations under jit with sharded operands run on
each device's block, without communication -- as XLA's own partitioned ops under the default
implementation("auto"), and as the native kernel per block under implementation("native")
(JAX_EXT_IMPL=native python examples/sharding.py)."""
import os

# Must happen before jax is imported: split the CPU into 4 devices.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_ext  # noqa: E402

assert len(jax.devices()) == 4, jax.devices()
mesh = jax.make_mesh((4,), ("x",))


def put(a: np.ndarray, spec: P) -> jax.Array:
    out: jax.Array = jax.device_put(a, NamedSharding(mesh, spec))
    return out


rng = np.random.default_rng(0)
cond = rng.random((8, 16)) < 0.5
then = rng.standard_normal((8, 16)).astype(np.float32)
else_row = rng.standard_normal((1, 16)).astype(np.float32)

c, x = put(cond, P("x", None)), put(then, P("x", None))  # rows sharded
f = jax.jit(jax_ext.where)
out = f(c, x, else_row)
assert (np.asarray(out) == np.where(cond, then, else_row)).all()
hlo = f.lower(c, x, else_row).compile().as_text()
assert hlo is not None
assert "all-gather" not in hlo and "all-reduce" not in hlo  # each device works alone
print("where:", out.sharding.spec, "shards:", [s.data.shape for s in out.addressable_shards])

table = put(rng.standard_normal((100, 32)).astype(np.float32), P())  # replicated
index = rng.integers(0, 100, 64).astype(np.int32)
idx = put(index, P("x"))  # the index sharded
rows = jax.jit(lambda t, i: jax_ext.gather(t, [0], 0, i))(table, idx)
assert (np.asarray(rows) == np.asarray(table)[index]).all()
print("gather:", rows.sharding.spec)

# shard_map: every array is local; jax_ext runs the plain native call per block.
g = jax.shard_map(lambda c, x, y: jax_ext.where(c, x, y), mesh=mesh,
                  in_specs=(P("x"), P("x"), P()), out_specs=P("x"))
out = g(c, x, else_row)
assert (np.asarray(out) == np.where(cond, then, else_row)).all()
print("shard_map: ok")
