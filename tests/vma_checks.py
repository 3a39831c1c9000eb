"""The shard_map typing matrix of test_shard_map.py, run in a child process started with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (jax fixes the device count when its
backends start).

    python tests/vma_checks.py OUTDIR PART   # OUTDIR/PART.json: {case: error or null}

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

import future_defaults

R = P()
S = P("x")


def _gather_twin(src, idx, num, pad):
    n = src.shape[0]
    valid = (jnp.arange(idx.shape[0]) < num) & (idx >= 0) & (idx < n)
    rows = jnp.take(src, jnp.clip(idx, 0, n - 1), axis=0)
    return jnp.where(valid[:, None], rows, pad)


def _gather_fn(s, i, n, p):
    return jax_ext.gather(s, [0], 0, i, num_indices=n, pad_value=p, align_bytes=None)


def _ops(big=False):
    """name -> (jax_ext fn, jnp twin, example args, which args are differentiable).
    big: shards large enough that auto runs the kernels (the small ones run lax for select
    and the scatter-add)."""
    rng = np.random.default_rng(0)
    if big:
        c = rng.random((1 << 14, 64)) < 0.5
        x, y, src = (rng.standard_normal(s).astype(np.float32)
                     for s in ((1 << 14, 64), (1 << 14, 64), (1 << 12, 64)))
        idx = rng.integers(-8, (1 << 12) + 8, 1 << 14).astype(np.int32)
        return {"where_big": (jax_ext.where, jnp.where, (c, x, y), (1, 2)),
                "gather_big": (_gather_fn, _gather_twin,
                               (src, idx, np.int32(1 << 13), np.float32(0.5)), (0, 3))}
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
        "gather": (_gather_fn, _gather_twin, (src, idx, np.int32(7), np.float32(0.5)), (0, 3)),
    }


def _placements(args, rows):
    """Every operand replicated or sharded (a (1, 4) row or a scalar stays replicated)."""
    choices = [(R, S) if np.ndim(a) and np.shape(a)[0] == rows else (R,) for a in args]
    return list(itertools.product(*choices))


def _transforms(fn, diff):
    def loss(*a):  # squared, so that second derivatives run through the op again
        out = fn(*a)
        w = jnp.linspace(0.5, 2.0, out.shape[-1], dtype=jnp.float32)
        total = jnp.sum(out ** 2 * w)
        if not future_defaults.auto_pcast() and "x" not in jax.typeof(total).mat.varying:
            # psum takes a varying value: what jax_auto_pcast inserts, spelled out.
            total = jax.lax.pcast(total, "x", to="varying")
        return jax.lax.psum(total, "x")
    g = jax.grad(loss, argnums=diff)

    def along(*a):  # a direction per differentiable operand, typed like it
        return tuple(_like(jnp.ones_like(a[k]), a[k]) for k in diff)
    return {
        "forward": fn,
        "psum_forward": loss,
        "grad": g,
        "jvp_of_grad": lambda *a: jax.jvp(lambda *d: g(*_put_diff(a, diff, d)),
                                          tuple(a[k] for k in diff), along(*a))[1],
        "linearize": lambda *a: jax.linearize(lambda *d: fn(*_put_diff(a, diff, d)),
                                              *(a[k] for k in diff))[1](*along(*a)),
        "grad_of_grad": jax.grad(lambda *a: sum(jnp.sum(t * t) for t in g(*a)), argnums=diff),
        "vmap_grad": lambda *a: jax.vmap(
            lambda s: g(*_put_diff(a, diff, [a[k] * s for k in diff])))(
            jnp.array([1.0, 2.0], jnp.float32)),
        "scan_grad": lambda *a: jax.lax.scan(
            lambda carry, _: (carry, g(*a)), 0.0, None, length=2)[1],
        "grad_in_vmap": g,  # the shard_map itself vmapped (see run)
    }


def _like(t, a):
    """`t` varying over the mesh axes `a` varies over: what jax_auto_pcast inserts in
    jnp.ones_like, spelled out where it is off."""
    axes = tuple(sorted(jax.typeof(a).mat.varying - jax.typeof(t).mat.varying))
    return jax.lax.pcast(t, axes, to="varying") if axes and not future_defaults.auto_pcast() else t


def _put_diff(args, diff, vals):
    out = list(args)
    for k, v in zip(diff, vals):
        out[k] = v
    return out


def _out_specs(name, specs, diff):
    """A forward result varies where any operand does; a gradient is placed like its primal."""
    fwd = S if any(s == S for s in specs) else R
    if name in ("forward", "linearize"):
        return fwd
    if name == "psum_forward":
        return R
    per = tuple(specs[k] for k in diff)
    if name in ("vmap_grad", "scan_grad"):
        return tuple(P(None, *s) for s in per)
    return per


def _stacked(a, k, diff):
    """Two examples of operand k for a vmap over the shard_map: the differentiable ones
    scaled, the others repeated."""
    return np.stack([a, a * 2 if k in diff else a])


def _local(a, s, op, rows, nx):
    """A replicated operand has the local shape of a shard (its first rows), except
    gather's operands: any row index may read the table, and a replicated index vector
    gathers every row on every device."""
    if s == S or op.startswith("gather") or np.ndim(a) == 0 or np.shape(a)[0] != rows:
        return a
    return a[:rows // nx]


def _placement(mesh, s, a, cols_on_y):
    """Where an operand lives: its manual spec, and (cols_on_y) its columns sharded along
    the mesh's automatic axis "y" too."""
    if cols_on_y and np.ndim(a) == 2:
        return NamedSharding(mesh, P(s[0] if len(s) else None, "y"))
    return NamedSharding(mesh, s)


# The front-ends that only validate differently from one that is kept (select without
# broadcasting, where3 element-wise: both are where) run forward and first derivatives only.
_FIRST_ORDER_ONLY = {"select_none", "where3_elementwise"}
_FIRST_ORDER = ("forward", "psum_forward", "grad")


def _case(fn, tname, diff, mesh, manual, specs, check_vma, vm, placed):
    """The shard_map of fn under transform tname, jitted, run on the placed operands."""
    body = _transforms(fn, diff)[tname]
    kw = {} if manual is None else {"axis_names": manual}
    sm = jax.shard_map(body, mesh=mesh, in_specs=tuple(specs),
                       out_specs=_out_specs(tname, specs, diff), check_vma=check_vma, **kw)
    return jax.tree.map(np.asarray, jax.jit(jax.vmap(sm) if vm else sm)(*placed))


# The error jax's primitives raise where shard_map operands' varying axes differ and
# jax_auto_pcast=False leaves them so (jax._src.core.standard_vma_rule).
VMA_MISMATCH = "requires varying manual axes to match"


def _raises_like(twin_error, fn, tname, diff, mesh, manual, specs, check_vma, vm, placed,
                 impl):
    """None when jax_ext raises what the jnp twin raised (`twin_error`) in the same case,
    and raises it while tracing, as jnp does; else what differs. Only a twin that
    rejects varying axes (jax_auto_pcast=False) may fail: any other failure of the twin
    is a broken case."""
    if VMA_MISMATCH not in str(twin_error):
        return f"the jnp twin failed: {type(twin_error).__name__}: {twin_error}"
    body = _transforms(fn, diff)[tname]
    kw = {} if manual is None else {"axis_names": manual}
    sm = jax.shard_map(body, mesh=mesh, in_specs=tuple(specs),
                       out_specs=_out_specs(tname, specs, diff), check_vma=check_vma, **kw)
    try:
        with jax_ext.implementation(impl):
            jax.jit(jax.vmap(sm) if vm else sm).trace(*placed)  # tracing only
    except type(twin_error) as e:
        if VMA_MISMATCH in str(e):
            return None
        return f"jnp raised {twin_error!r}; jax_ext raised {e!r}"
    except Exception as e:
        return f"jnp raised {twin_error!r}; jax_ext raised {e!r}"
    return f"jnp raised {twin_error!r} while tracing; jax_ext traced"


def run(mesh, manual, impls, vmas, results, decisions, prefix, ops=None, transforms=None,
        big=False, cols_on_y=False, raised=None):
    """Every case of ops x placements x transforms x check_vma: the jnp twin run once, then
    jax_ext under each implementation compared with it. Where the twin raises, jax_ext
    must raise the same while tracing (_raises_like); those cases are listed in
    `raised`."""
    raised = RAISED if raised is None else raised
    from jax_ext.auto import explain
    for (op, (fn, twin, args, diff)), check_vma in itertools.product(_ops(big).items(), vmas):
        if ops is not None and op not in ops:
            continue
        rows = np.shape(args[0])[0] if not op.startswith("gather") else None
        for specs in _placements(args, np.shape(args[1 if op.startswith("gather") else 0])[0]):
            local = [_local(a, s, op, rows, mesh.shape["x"]) for a, s in zip(args, specs)]
            for tname in transforms or _transforms(fn, diff):
                if op in _FIRST_ORDER_ONLY and tname not in _FIRST_ORDER:
                    continue
                name = f"{prefix}{op}[{','.join('S' if s == S else 'R' for s in specs)}][{tname}]"
                vm = tname == "grad_in_vmap"
                vals = [_stacked(a, k, diff) for k, a in enumerate(local)] if vm else local
                placed = [jax.device_put(a, _placement(mesh, P(None, *s) if vm else s, a[0]
                                                       if vm else a, cols_on_y))
                          for a, s in zip(vals, specs)]
                try:
                    want = _case(twin, tname, diff, mesh, manual, specs, check_vma, vm, placed)
                    twin_error = None
                except Exception as e:
                    twin_error = e
                for impl in impls:
                    case = f"{name}[{impl}][vma={check_vma}]"
                    if twin_error is not None:
                        results[case] = _raises_like(twin_error, fn, tname, diff, mesh, manual,
                                                     specs, check_vma, vm, placed, impl)
                        raised.append(case)
                        continue
                    try:
                        with jax_ext.implementation(impl), explain.recording() as rec:
                            got = _case(fn, tname, diff, mesh, manual, specs, check_vma, vm,
                                        placed)
                        if impl == "auto":
                            decisions[case] = sorted({(d.op, d.impl) for d in rec})
                        for g_, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                            if tname == "forward":
                                assert g_.tobytes() == w_.tobytes(), (g_, w_)
                            else:
                                np.testing.assert_allclose(g_, w_, rtol=1e-6, atol=1e-6)
                        results[case] = None
                    except Exception as e:  # recorded, asserted by the parent
                        results[case] = (f"{type(e).__name__}: {e}\n"
                                         f"{traceback.format_exc()[-1500:]}")


ALL = ["native", "lax", "auto"]


def _partial_manual(results, decisions):
    """Partial manual: "y" is left to the partitioner, on explicit and on auto axes, with
    the operands' columns sharded along it or not."""
    from jax.sharding import AxisType
    for kind, types in (("explicit", (AxisType.Explicit,) * 2), ("auto", (AxisType.Auto,) * 2)):
        mesh2 = jax.make_mesh((2, 2), ("x", "y"), axis_types=types)
        for on_y in (False, True):
            run(mesh2, {"x"}, ALL, [True], results, decisions,
                f"2x2{kind}{'+y' if on_y else ''}:", ops=("where", "gather"),
                transforms=("forward", "grad"), cols_on_y=on_y)


# The matrix in parts, each its own child process (so that a parallel test run spreads
# them): every op under every transform and implementation, check_vma off, auto with shards
# big enough for the kernels, partial manual.
PARTS = {
    "select": lambda r, d, m: run(m, None, ALL, [True], r, d, "",
                                  ops=("select_numpy", "select_none")),
    "where": lambda r, d, m: run(m, None, ALL, [True], r, d, "",
                                 ops=("where", "where3_rows", "where3_elementwise")),
    "gather": lambda r, d, m: run(m, None, ALL, [True], r, d, "", ops=("gather",)),
    "vma_off": lambda r, d, m: run(m, None, ALL, [False], r, d, "",
                                   transforms=("forward", "grad")),
    "auto_big": lambda r, d, m: run(m, None, ["auto"], [True], r, d, "big:", big=True,
                                    transforms=("forward", "grad")),
    "partial_manual": lambda r, d, m: _partial_manual(r, d),
    # jax_auto_pcast=False (jax's announced default): an invariant float operand beside a
    # varying one is an error, which jax_ext raises where jnp.where / jnp.take do.
    "no_auto_pcast": lambda r, d, m: _no_auto_pcast(r, d, m),
}


def _no_auto_pcast(results, decisions, mesh):
    with _config_state("jax_auto_pcast", False):
        run(mesh, None, ALL, [True], results, decisions, "",
            ops=("select_numpy", "where", "where3_rows", "gather"),
            transforms=("forward", "grad", "linearize", "grad_in_vmap"))


def _config_state(name, value):
    """A context that sets jax config option `name` to `value` for a block."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        old = jax.config.values[name]
        jax.config.update(name, value)
        try:
            yield
        finally:
            jax.config.update(name, old)
    return ctx()


RAISED = []  # the cases where the twin and jax_ext raised alike


if __name__ == "__main__":
    outdir, part = sys.argv[1], sys.argv[2]
    assert len(jax.devices()) == 4, jax.devices()
    future_defaults.apply()
    results, decisions = {}, {}
    PARTS[part](results, decisions, jax.make_mesh((4,), ("x",)))
    with open(os.path.join(outdir, f"{part}.json"), "w") as f:
        json.dump({"cases": results, "auto": decisions, "raised": RAISED,
                   "auto_pcast": future_defaults.auto_pcast()}, f)
