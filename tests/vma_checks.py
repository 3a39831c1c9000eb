"""The shard_map typing matrix of test_shard_map.py, run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (jax fixes the device count when its
backends start).

    python tests/vma_checks.py OUTDIR   # OUTDIR/vma.json: {case: error or null}

Each case runs one op inside ``jax.shard_map`` on a 1-D mesh ("x", 4 devices) or a 2x2 mesh
with only "x" manual, every operand replicated (P()) or sharded (P("x")), with check_vma on
and off, under native, lax and auto, and compares it with its jnp twin (jnp.where /
jnp.take) written in the same placement under the same transform: the forward value bit
for bit, a psum-ed forward, grad, jvp of grad, vmap inside the shard_map, and a lax.scan
body. A replicated operand's gradient must be summed over devices, as jnp's is.
"""
import itertools
import json
import os
import sys
import traceback

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ext

R = P()
S = P("x")


def _gather_twin(src, idx, num, pad):
    n = src.shape[0]
    valid = (jnp.arange(idx.shape[0]) < num) & (idx >= 0) & (idx < n)
    rows = jnp.take(src, jnp.clip(idx, 0, n - 1), axis=0)
    return jnp.where(valid[:, None], rows, pad)


def _ops():
    """name -> (jax_ext fn, jnp twin, example args, which args are differentiable)."""
    rng = np.random.default_rng(0)
    c = rng.random((8, 4)) < 0.5
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 4)).astype(np.float32)
    row = rng.standard_normal((1, 4)).astype(np.float32)
    src = rng.standard_normal((8, 4)).astype(np.float32)
    idx = np.array([1, 1, 2, 9, -1, 5, 6, 0], np.int32)  # 9 and -1 are out of range: padded
    return {
        "select_numpy": (lambda c, x, y: jax_ext.select(c, x, y),
                         lambda c, x, y: jnp.where(c, x, y), (c, x, row), (1, 2)),
        "select_none": (lambda c, x, y: jax_ext.select(c, x, y, auto_broadcast="none"),
                        lambda c, x, y: jnp.where(c, x, y), (c, x, y), (1, 2)),
        "where": (jax_ext.where, jnp.where, (c, x, y), (1, 2)),
        "where3_rows": (jax_ext.where3, lambda c, x, y: jnp.where(c[:, None], x, y),
                        (c[:, 0], x, y), (1, 2)),
        "where3_elementwise": (jax_ext.where3, jnp.where, (c, x, y), (1, 2)),
        "gather": (lambda s, i, n, p: jax_ext.gather(s, [0], 0, i, num_indices=n, pad_value=p,
                                                     align_bytes=None),
                   _gather_twin, (src, idx, np.int32(7), np.float32(0.5)), (0, 3)),
    }


def _placements(args):
    """Every operand replicated or sharded (a (1, 4) row or a scalar stays replicated)."""
    choices = [(R, S) if np.ndim(a) and np.shape(a)[0] == 8 else (R,) for a in args]
    return list(itertools.product(*choices))


def _transforms(fn, diff):
    w = jnp.linspace(0.5, 2.0, 4, dtype=jnp.float32)

    def loss(*a):
        return jax.lax.psum(jnp.sum(fn(*a) * w), "x")
    g = jax.grad(loss, argnums=diff)
    return {
        "forward": fn,
        "psum_forward": loss,
        "grad": g,
        "jvp_of_grad": lambda *a: jax.jvp(lambda *d: g(*_put_diff(a, diff, d)),
                                          tuple(a[k] for k in diff),
                                          tuple(jnp.ones_like(a[k]) for k in diff))[1],
        "vmap_grad": lambda *a: jax.vmap(
            lambda s: g(*_put_diff(a, diff, [a[k] * s for k in diff])))(
            jnp.array([1.0, 2.0], jnp.float32)),
        "scan_grad": lambda *a: jax.lax.scan(
            lambda carry, _: (carry, g(*a)), 0.0, None, length=2)[1],
    }


def _put_diff(args, diff, vals):
    out = list(args)
    for k, v in zip(diff, vals):
        out[k] = v
    return out


def _out_specs(name, specs, diff):
    """A forward result varies where any operand does; a gradient is placed like its primal."""
    fwd = S if any(s == S for s in specs) else R
    if name == "forward":
        return fwd
    if name == "psum_forward":
        return R
    per = tuple(specs[k] for k in diff)
    if name in ("vmap_grad", "scan_grad"):
        return tuple(P(None, *s) for s in per)
    return per


def run(mesh, manual, impls, vmas, results, prefix, ops=None, transforms=None):
    for (op, (fn, twin, args, diff)), impl, check_vma in itertools.product(
            _ops().items(), impls, vmas):
        if ops is not None and op not in ops:
            continue
        for specs in _placements(args):
            # A replicated operand has the local shape of a shard (the first rows),
            # except gather's table, which any row index may read.
            local = [a if s == S or op == "gather" or np.ndim(a) == 0 or np.shape(a)[0] != 8
                     else a[:8 // mesh.shape["x"]] for a, s in zip(args, specs)]
            placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(local, specs)]
            for tname in transforms or _transforms(fn, diff):
                case = (f"{prefix}{op}[{','.join('S' if s == S else 'R' for s in specs)}]"
                        f"[{tname}][{impl}][vma={check_vma}]")
                try:
                    outs = []
                    for f in (fn, twin):
                        body = _transforms(f, diff)[tname]
                        osp = _out_specs(tname, specs, diff)
                        kw = {} if manual is None else {"axis_names": manual}
                        sm = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(specs),
                                                   out_specs=osp, check_vma=check_vma, **kw))
                        with jax_ext.implementation(impl):
                            outs.append(jax.tree.map(np.asarray, sm(*placed)))
                    got, want = outs
                    for g_, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                        if tname == "forward":
                            assert g_.tobytes() == w_.tobytes(), (g_, w_)
                        else:
                            np.testing.assert_allclose(g_, w_, rtol=1e-6, atol=1e-6)
                    results[case] = None
                except Exception as e:  # recorded, asserted by the parent
                    results[case] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"


if __name__ == "__main__":
    outdir = sys.argv[1]
    assert len(jax.devices()) == 4, jax.devices()
    results = {}
    mesh1 = jax.make_mesh((4,), ("x",))
    run(mesh1, None, ["native", "lax", "auto"], [True], results, "")
    run(mesh1, None, ["lax"], [False], results, "")
    # Partial manual: "y" is left to the partitioner, on explicit and on auto axes.
    from jax.sharding import AxisType
    for kind, types in (("explicit", (AxisType.Explicit,) * 2), ("auto", (AxisType.Auto,) * 2)):
        mesh2 = jax.make_mesh((2, 2), ("x", "y"), axis_types=types)
        run(mesh2, {"x"}, ["native", "lax", "auto"], [True], results, f"2x2{kind}:",
            ops=("where", "gather"), transforms=("forward", "grad"))
    with open(os.path.join(outdir, "vma.json"), "w") as f:
        json.dump(results, f)
