"""The persistent compilation cache child of test_compilation_cache.py: runs sharded jax_ext
programs (under jit with sharded operands, and under shard_map) on 4 host devices with
jax's persistent compilation cache in CACHE_DIR, and writes OUT (JSON): each program's
result bits, whether it equals its jnp twin, and the cache hits jax recorded.

    python tests/cache_checks.py CACHE_DIR OUT on|off all|shard_map

on: jax_remove_custom_partitioning_ptr_from_cache_key set (docs/scaling-out.md says why
a program whose jax_ext calls jax_ext partitions itself needs it); all: every program,
shard_map: the shard_map programs only.
"""
import hashlib
import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

cache_dir, out_path, setting, which = sys.argv[1:5]
jax.config.update("jax_compilation_cache_dir", cache_dir)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.config.update("jax_remove_custom_partitioning_ptr_from_cache_key", setting == "on")

import jax_ext  # noqa: E402

hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
c = put(rng.random((64, 8)) < 0.5, P("x"))
x = put(rng.standard_normal((64, 8)).astype(np.float32), P("x"))
table = put(rng.standard_normal((32, 8)).astype(np.float32), P())
idx = put(rng.integers(-2, 34, 64).astype(np.int32), P("x"))


def gather(t, i):
    return jax_ext.gather(t, [0], 0, i, pad_value=0.0, align_bytes=None)


def take(t, i):
    ok = (i >= 0) & (i < t.shape[0])
    return jnp.where(ok[:, None], jnp.take(t, jnp.clip(i, 0, t.shape[0] - 1), axis=0), 0.0)


def program(where, gather):
    """A forward and a gradient through where and gather."""
    def loss(t, c, x, i):
        return jnp.sum(where(c, gather(t, i), x) ** 2)
    return lambda t, c, x, i: (where(c, x * 2, x), jax.grad(loss)(t, c, x, i))


def in_shard_map(f):  # the replicated table's gradient is summed over the devices
    return jax.shard_map(f, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x")),
                         out_specs=(P("x"), P()))


ours, twin = program(jax_ext.where, gather), program(jnp.where, take)
PROGRAMS = {  # name: (implementation, jax_ext program, jnp twin)
    f"{kind}[{impl}]": (impl, wrap(ours), wrap(twin))
    for impl in ("native", "lax", "auto")
    for kind, wrap in (("jit_sharded", lambda f: f),
                       ("shard_map", lambda f: in_shard_map(f)))}
SELECTED = [n for n in PROGRAMS if which == "all" or n.startswith("shard_map")]

results = {}
for name in SELECTED:
    impl, f, g = PROGRAMS[name]
    with jax_ext.implementation(impl):
        got = jax.tree.map(np.asarray, jax.jit(f)(table, c, x, idx))
    want = jax.tree.map(np.asarray, jax.jit(g)(table, c, x, idx))
    results[name] = {
        "bits": hashlib.sha256(b"".join(a.tobytes() for a in jax.tree.leaves(got))).hexdigest(),
        "forward_exact": got[0].tobytes() == want[0].tobytes(),
        "grad_close": bool(np.allclose(got[1], want[1], rtol=1e-6, atol=1e-6))}
with open(out_path, "w") as fh:
    json.dump({"results": results, "hits": len(hits)}, fh)
