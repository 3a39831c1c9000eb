"""One process of test_multiprocess.py: joins a 2-process jax.distributed job on loopback
(gloo CPU collectives, 2 host devices per process), then runs the sharding matrix of
sharding_checks.py over the 4 global devices, and a data-parallel training step under
shard_map (replicated parameters, the batch sharded over both processes' devices) against
its jnp twin, and a table sharded along its rows over both processes (forward and a
training step), and writes OUTDIR/process<ID>.json.

    python tests/multiprocess_child.py PORT PROCESS_ID OUTDIR
"""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


def training_step(sc, impl):
    """Three SGD steps of an embedding model with a where mask under shard_map: the
    replicated table, projection and mask value get their gradients summed over the 4
    devices of both processes; losses and parameters equal the jnp twin's at every step."""
    import jax_ext
    rng = np.random.default_rng(3)
    mesh = sc.MESHES["auto"]  # the 4 devices of both processes
    params = {"emb": rng.standard_normal((32, 8)).astype(np.float32),
              "w": rng.standard_normal((8,)).astype(np.float32),
              "fill": np.array(0.5, np.float32)}
    ids = rng.integers(0, 32, (8, 6)).astype(np.int32)
    y = rng.standard_normal((8, 6)).astype(np.float32)
    m = rng.random((8, 6)) < 0.75

    def ours(p, i, mk):
        rows = jax_ext.gather(p["emb"], [0], 0, i.reshape(-1), align_bytes=None)
        return jax_ext.where(mk, (rows @ p["w"]).reshape(i.shape), p["fill"])

    def twin(p, i, mk):
        return jnp.where(mk, jnp.take(p["emb"], i, axis=0) @ p["w"], p["fill"])

    def make(predict):
        def step(p, i, t, mk):
            loss = lambda q: jax.lax.psum(jnp.sum((predict(q, i, mk) - t) ** 2), "x")
            value, g = jax.value_and_grad(loss)(p)
            return jax.tree.map(lambda a, d: a - 0.01 * d, p, g), value
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x")),
                                     out_specs=(P(), P())))

    batch = [sc.global_array(a, NamedSharding(mesh, P("x"))) for a in (ids, y, m)]
    history = {}
    for name, predict in (("ours", ours), ("twin", twin)):
        p = {k: sc.global_array(v, NamedSharding(mesh, P())) for k, v in params.items()}
        step, history[name] = make(predict), []
        with jax_ext.implementation(impl):
            for _ in range(3):
                p, value = step(p, *batch)
                # replicated: every process holds the whole value
                history[name].append(jax.tree.map(lambda a: np.asarray(a.addressable_data(0)),
                                                  (value, p)))
    for k, (got, want) in enumerate(zip(history["ours"], history["twin"])):
        for g_, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(g_, w_, rtol=1e-6, atol=1e-6, err_msg=f"step {k}")
    losses = [float(v) for v, _ in history["ours"]]
    assert losses[-1] < losses[0], losses
    return {"losses": losses}

def row_sharded(sc, impl):
    """A table sharded along its rows over both processes' devices: the forward (random
    bfloat16 bits, pad rows) equals numpy's, a training step's updated table and a bare
    gradient (sharded as the table) equal one device's, and no program moves the table or
    a float between devices."""
    import jax_ext
    import ml_dtypes
    rng = np.random.default_rng(5)
    mesh = sc.MESHES["auto"]
    R, C, N = 2048, 32, 64
    t = rng.integers(0, 2 ** 16, (R, C), dtype=np.uint16).view(ml_dtypes.bfloat16)
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    ok = (idx >= 0) & (idx < R)
    want = np.where(ok[:, None], t[np.clip(idx, 0, R - 1)], np.zeros((), t.dtype))
    rows, ids = (sc.global_array(t, NamedSharding(mesh, P("x", None))),
                 sc.global_array(idx, NamedSharding(mesh, P("x"))))
    f = jax.jit(lambda t, i: jax_ext.gather(t, [0], 0, i, pad_value=0))
    with jax_ext.implementation(impl):
        text = f.lower(rows, ids).compile().as_text()
        sc.same_bits(f(rows, ids), want)
    tf = rng.standard_normal((R, C)).astype(np.float32)
    w = rng.standard_normal((N, C)).astype(np.float32)

    def step(t, i, w):
        g = jax.grad(lambda t: jnp.sum(jax_ext.gather(t, [0], 0, i, pad_value=0.0) * w))(t)
        return t - 0.01 * g
    local = jax.local_devices()[0]
    with jax_ext.implementation(impl):
        one = np.asarray(jax.jit(step)(*(jax.device_put(a, local) for a in (tf, idx, w))))
        js = jax.jit(step, out_shardings=NamedSharding(mesh, P("x", None)))
        args = (sc.global_array(tf, NamedSharding(mesh, P("x", None))), ids,
                sc.global_array(w, NamedSharding(mesh, P("x", None))))
        text += js.lower(*args).compile().as_text()
        sc.same_bits(js(*args), one)
        # A bare grad, no out_shardings: the gradient comes back sharded as the table,
        # each process holding its devices' rows, with one device's bits.
        grad = jax.jit(jax.grad(
            lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i, pad_value=0.0) * w)))
        one_g = np.asarray(grad(*(jax.device_put(a, local) for a in (tf, idx))))
        text += grad.lower(args[0], ids).compile().as_text()
        g = grad(args[0], ids)
    assert tuple(g.sharding.spec)[:1] == ("x",), g.sharding.spec
    for s in g.addressable_shards:
        assert s.data.shape == (R // len(sc.DEV), C), s.data.shape
        sc.same_bits(s.data, one_g[s.index])
    colls = [ln for ln in text.splitlines() if sc.COLL.search(ln)]
    assert not [ln for ln in colls if f"[{R},{C}]" in ln], colls  # never the table
    assert not [ln for ln in colls if " bf16[" in ln], colls
    return {"collectives": len(colls)}


def update_rows_step(sc, impl):
    """update_rows on a table and an adagrad state sharded along their rows over both
    processes' devices, the index and gradient rows sharded along the batch (ids repeated
    across processes' blocks): each process holds its devices' rows of the table and the
    state, with one device's bits, and no collective carries the table or a float."""
    import jax_ext
    import optax
    rng = np.random.default_rng(6)
    mesh = sc.MESHES["auto"]
    R, C, N = 2048, 32, 64
    t = rng.standard_normal((R, C)).astype(np.float32)
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    idx[N - 8:] = idx[:8]  # the same rows in the first and the last device's blocks
    w = rng.standard_normal((N, C)).astype(np.float32)
    opt = optax.adagrad(0.1)

    def step(t, s, i, w):
        rows = jax_ext.gather(t, [0], 0, i)
        g = jax.grad(lambda r: jnp.sum(r * w) + jnp.sum(r * r))(rows)
        return jax_ext.update_rows(opt, t, s, [0], 0, i, g)
    local = jax.local_devices()[0]
    rows_spec = NamedSharding(mesh, P("x", None))
    with jax_ext.implementation(impl):
        want = jax.jit(step)(*(jax.device_put(a, local) for a in (t, opt.init(t), idx, w)))
        args = (sc.global_array(t, rows_spec),
                jax.tree.map(lambda a: sc.global_array(np.asarray(a), rows_spec if a.ndim == 2
                                                       else NamedSharding(mesh, P())),
                             opt.init(t)),
                sc.global_array(idx, NamedSharding(mesh, P("x"))),
                sc.global_array(w, rows_spec))
        f = jax.jit(step, donate_argnums=(0, 1))
        text = f.lower(*args).compile().as_text()
        out = f(*args)
    for got, ref in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
        ref = np.asarray(ref)
        if got.ndim == 2:
            assert tuple(got.sharding.spec)[:1] == ("x",), got.sharding.spec
        for s in got.addressable_shards:
            sc.same_bits(np.asarray(s.data), ref[s.index] if ref.ndim else ref)
    colls = [ln for ln in text.splitlines() if sc.COLL.search(ln)]
    assert not [ln for ln in colls if f"[{R},{C}]" in ln], colls  # never the table
    assert not [ln for ln in colls if " f32[" in ln or " bf16[" in ln], colls
    return {"collectives": len(colls)}


if __name__ == "__main__":
    # "rows": only the row-sharded table, on however many devices each process has
    port, pid, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rows_only = sys.argv[4:] == ["rows"]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid, initialization_timeout=120)
    # Only now: the checks build their meshes from the global devices at import.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sharding_checks as sc

    per = 4 if rows_only else 2
    assert jax.process_count() == 2 and len(sc.DEV) == 2 * per and \
        jax.local_device_count() == per, (jax.process_count(), len(sc.DEV),
                                          jax.local_device_count())
    if not rows_only:
        sc.run_matrix()
    for impl in sc.IMPLS:
        if not rows_only:
            sc.check(f"shard_map_training_step[{impl}]")(lambda: training_step(sc, impl))
        sc.check(f"row_sharded_table[{impl}]")(lambda: row_sharded(sc, impl))
        sc.check(f"update_rows[{impl}]")(lambda: update_rows_step(sc, impl))
    with open(os.path.join(outdir, f"process{pid}.json"), "w") as f:
        json.dump(sc.RESULTS, f, indent=1)
    jax.distributed.shutdown()
