"""jax_ext inside ``jax.shard_map`` is typed like jax's own primitives: a result varies over
every mesh axis an operand varies over, and an invariant (replicated) operand meeting a
varying one is made varying (``pvary``), so its gradient is summed over devices, as with
``jnp.where`` / ``jnp.take``. The matrix (tests/vma_checks.py) runs in a 4-device child
process and compares every case with its jnp twin under the same transform."""
import json
import os
import subprocess
import sys

import pytest

import future_defaults

HERE = os.path.dirname(os.path.abspath(__file__))


TRANSFORMS = ("forward", "psum_forward", "grad", "jvp_of_grad", "linearize", "grad_of_grad",
              "vmap_grad", "grad_in_vmap", "scan_grad")
SMALL_OPS = {"select_numpy", "select_none", "where", "where3_rows", "where3_elementwise",
             "gather"}
IMPLS = ("native", "lax", "auto")
# What each part of the matrix must hold: (prefix, ops, transforms, impl, check_vma), and
# the implementations auto must have chosen in it, per primitive.
EXPECTED = {
    "select": [("", {"select_numpy", "select_none"}, TRANSFORMS, i, True) for i in IMPLS],
    "where": [("", {"where", "where3_rows", "where3_elementwise"}, TRANSFORMS, i, True)
              for i in IMPLS],
    "gather": [("", {"gather"}, TRANSFORMS, i, True) for i in IMPLS],
    "vma_off": [("", SMALL_OPS, ("forward", "grad"), i, False) for i in IMPLS],
    "auto_big": [("big:", {"where_big", "gather_big"}, ("forward", "grad"), "auto", True)],
    "partial_manual": [(f"2x2{kind}:", {"where", "gather"}, ("forward", "grad"), i, True)
                       for kind in ("explicit", "explicit+y", "auto", "auto+y")
                       for i in IMPLS],
    "no_auto_pcast": [("", {"select_numpy", "where", "where3_rows", "gather"},
                       ("forward", "grad", "linearize", "grad_in_vmap"), i, True)
                      for i in IMPLS],
}
# Cases where jax_auto_pcast=False makes jnp raise "requires varying manual axes to match"
# (a replicated float operand beside a sharded one, forward; any sharded operand under grad,
# whose transpose meets an invariant zero), and where it does not (every operand
# replicated; where's condition replicated beside sharded values on a jax that pvarys bool
# operands, forward and linearized): jax_ext must raise in the first, equal jnp in the
# second, on every implementation.
NO_AUTO_PCAST_RAISES = {"where[S,R,R][forward]", "where[R,S,R][forward]",
                        "gather[S,R,R,R][forward]", "gather[R,S,R,R][forward]",
                        "where[S,S,S][grad]", "where3_rows[S,S,S][grad_in_vmap]"}
NO_AUTO_PCAST_RUNS = {"where[R,R,R][grad]", "where[S,S,S][forward]", "where[S,S,S][linearize]",
                      "gather[R,R,R,R][grad]", "select_numpy[R,R,R][grad_in_vmap]",
                      "where3_rows[S,S,S][forward]"}
# What auto chose, at least: small shards whose producers fuse run lax; big shards read
# from the arguments run the kernels. The matrix checks both sides of auto's thresholds
# against the jnp twins.
AUTO_SIDES = {"where": {"select": {"lax"}},
              "gather": {"gather": {"native", "lax"}, "scatter_add": {"lax"}},
              "auto_big": {"select": {"native"}, "gather": {"native"}, "scatter_add": {"native"}}}


def _run_part(part, out):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=4").strip()
    env.pop("JAX_EXT_IMPL", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "vma_checks.py"), str(out), part],
                          env=env, cwd=HERE, capture_output=True, text=True, timeout=900)
    path = out / f"{part}.json"
    if proc.returncode != 0 or not path.exists():
        pytest.fail(f"vma_checks.py {part} failed (rc {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(path.read_text())


def _parse(case):
    """'2x2auto:where[R,S][grad][lax][vma=True]' -> ('2x2auto:', 'where', 'grad', 'lax', True)"""
    head, *fields = case.split("[")
    prefix, _, op = head.rpartition(":")
    placement, tname, impl, vma = (f.rstrip("]") for f in fields)
    return (prefix + ":" if prefix else ""), op, tname, impl, vma == "vma=True"


@pytest.mark.parametrize("part", sorted(EXPECTED))
def test_matrix_part_matches_the_jnp_twins(part, tmp_path):
    """Every case of the part equals its jnp twin, and the part holds every op under every
    transform, placement and implementation it is meant to (nothing silently dropped)."""
    matrix = _run_part(part, tmp_path)
    cases = matrix["cases"]
    bad = {k: v for k, v in cases.items() if v is not None}
    assert not bad, f"{len(bad)} of {len(cases)} cases differ from jnp:\n" + "\n".join(
        f"{k}: {v[:400]}" for k, v in list(bad.items())[:10])
    seen = {}
    for case in cases:
        prefix, op, tname, impl, vma = _parse(case)
        seen.setdefault((prefix, impl, vma), set()).add((op, tname))
    first_order = {"select_none", "where3_elementwise"}
    want = {}
    for prefix, ops, transforms, impl, vma in EXPECTED[part]:
        want[(prefix, impl, vma)] = {(op, t) for op in ops for t in transforms
                                     if op not in first_order or
                                     t in ("forward", "psum_forward", "grad")}
    assert seen == want
    # Each op ran replicated and with sharded operands (vma_checks.py's _placements makes
    # every combination).
    placements = {}
    for case in cases:
        op, spec = case.split("[")[:2]
        placements.setdefault(op, set()).add(spec.rstrip("]"))
    for op, specs in placements.items():
        assert len(specs) >= 2 and any("S" not in s for s in specs), (op, specs)
    if part == "no_auto_pcast":
        raised = {c.rsplit("[", 2)[0] for c in matrix["raised"]}
        ran = {c.rsplit("[", 2)[0] for c in cases} - raised
        assert NO_AUTO_PCAST_RAISES <= raised and NO_AUTO_PCAST_RUNS <= ran, (raised, ran)
    # With jax_auto_pcast=False (tests/future_defaults.py) the programs that reach auto's
    # big-shard side raise, as their jnp twins do (checked above), so what auto would
    # choose there is checked by the default run only.
    if part in AUTO_SIDES and matrix["auto_pcast"]:
        sides = {}
        for decisions in matrix["auto"].values():
            for op, impl in decisions:
                sides.setdefault(op, set()).add(impl)
        for op, want in AUTO_SIDES[part].items():
            assert want <= sides.get(op, set()), (op, sides)


# --- on one device, in this process (the GPU check runs these on the GPU) -----------------
def _one_device_programs(where, take):
    """A forward select of a gather and the gradient of a psum-ed loss through both, on a
    1-device mesh: the table replicated, the rest sharded (of one shard)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, PartitionSpec as P
    # jax's default device: the GPU on a GPU. Auto: numpy arguments are placed by in_specs.
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))

    def loss(t, c, x, i):
        return jax.lax.psum(jnp.sum(where(c, take(t, i), x) ** 2), "x")

    def f(t, c, x, i):
        return where(c, x, take(t, i)), jax.grad(loss, argnums=(0, 2))(t, c, x, i)
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x")),
                                 out_specs=(P("x"), (P(), P("x")))))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
def test_on_one_device_forward_bits_and_gradients_match_the_jnp_twin(impl):
    import jax.numpy as jnp
    import numpy as np

    import jax_ext
    rng = np.random.default_rng(11)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    idx = np.array([1, 1, 2, 3, -1, 12, 6, 7], np.int32)  # a duplicate, out-of-range rows
    c = rng.integers(0, 2, (8, 4)).astype(bool)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    x[0, :3] = [-0.0, np.uint32(0x7fc00005).view(np.float32), np.inf]  # a NaN payload

    def take(t, i):
        ok = (i >= 0) & (i < t.shape[0])
        return jnp.where(ok[:, None], jnp.take(t, jnp.clip(i, 0, t.shape[0] - 1), axis=0), 0.0)
    ours = _one_device_programs(
        jax_ext.where, lambda t, i: jax_ext.gather(t, [0], 0, i, pad_value=0.0,
                                                   align_bytes=None))
    if not future_defaults.auto_pcast():
        # jax_auto_pcast=False: the replicated table beside the sharded index is an error
        # to jnp, and so to jax_ext, on every path.
        for fn, impl_ in ((_one_device_programs(jnp.where, take), "lax"), (ours, impl)):
            with jax_ext.implementation(impl_), pytest.raises(
                    ValueError, match="requires varying manual axes to match"):
                fn(table, c, x, idx)
        return
    want = _one_device_programs(jnp.where, take)(table, c, x, idx)
    with jax_ext.implementation(impl):
        got = ours(table, c, x, idx)
    assert np.asarray(got[0]).tobytes() == np.asarray(want[0]).tobytes()
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=0)
    # The replicated table's gradient, by a loop: the duplicate row counted twice.
    ref = np.zeros_like(table)
    for k, r in enumerate(idx):
        if 0 <= r < len(table):
            ref[r] += np.where(c[k], 2 * table[r], np.float32(0))
    np.testing.assert_allclose(np.asarray(got[1][0]), ref, rtol=1e-6, atol=0)
