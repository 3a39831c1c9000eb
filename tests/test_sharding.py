"""Sharded select and gather on forced host devices: partitioned without communication,
shard_map bodies, grad, donation per shard, GSPMD fallback, jax.export round trips, and
the matrix: every check under "native", "lax" and "auto", on auto mesh axes, explicit
ones under jax.set_mesh, and jax.make_mesh's default (explicit) axes with no mesh set,
evenly and unevenly sharded, on 4 and 8 devices, with jax_enable_x64 on and off.

The checks run in child processes (tests/sharding_checks.py) started with
XLA_FLAGS=--xla_force_host_platform_device_count=N, because jax fixes the device count
when its backends start and the rest of the suite runs on one device (and because a
program XLA cannot partition may abort its process, which must fail a test, not end the
run). One 4-device child runs every check, a second, fresh one deserializes the exports
(as a user's would), further children run the matrix on 8 devices and without x64."""
import json
import os
import subprocess
import sys

import jax
import pytest

import jax_ext
from jax_ext import _compat_sharding
from references import IMPLS, MESH_KINDS as KINDS, SHARDING_MATRIX as MATRIX

HERE = os.path.dirname(os.path.abspath(__file__))
NO_COLLECTIVES = [
    "select_rows_sharded[auto]", "select_rows_sharded[explicit]",
    "select_cols_sharded_broadcast_cond[auto]", "select_cols_sharded_broadcast_cond[explicit]",
    "gather_index_sharded[auto]", "gather_index_sharded[explicit]",
    "vmap_gather_batch_sharded[auto]", "vmap_gather_batch_sharded[explicit]",
    "gather_dim1_index_on_two_axes[2x2]", "select_rows_and_cols[2x2]",
    "shard_map_select_and_gather[auto]", "select_donated_sharded_in_place[auto]",
]
OTHER = [
    "gather_src_rows_sharded_communicates[auto]", "gather_src_rows_sharded_communicates[explicit]",
    "grad_select_and_gather_sharded[auto]", "single_device_jit_unchanged",
    "export_needs_export_checks",
    "explicit_conflicting_shardings_raise[explicit]",
    "export_serialize[1dev]", "export_serialize[4dev]",
]
# Only where jax has the option (jax 0.12+; sharding_checks.py's run_partitioning).
if "jax_partitioning" in jax.config.values:
    OTHER += [f"jax_partitioning_{c}[{i}]" for c in (
        "where_blocks", "where_rows", "gather_index_sharded", "grad_gather") for i in IMPLS]
# Only where jax can still select the GSPMD partitioner (sharding_checks.py's run_gspmd).
if _compat_sharding.GSPMD_SELECTABLE:
    OTHER.append("gspmd_partitioner_falls_back[auto]")
ROUNDTRIP = ["export_roundtrip_fresh_process[1dev]", "export_roundtrip_fresh_process[4dev]"]




def _child(mode, outdir, ndev=4, x64=True):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={ndev}").strip()
    env.pop("JAX_EXT_IMPL", None)  # each check sets its implementation itself
    # Run from the tests dir: the installed jax_ext, not the source tree, is imported.
    proc = subprocess.run([sys.executable, os.path.join(HERE, "sharding_checks.py"), mode,
                           str(outdir)] + ([] if x64 else ["nox64"]), env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=600)
    name = {"run": "results.json", "load": "load.json", "matrix": "matrix.json"}[mode]
    path = os.path.join(outdir, name)
    if proc.returncode != 0 or not os.path.exists(path):
        pytest.fail(f"sharding_checks.py {mode} failed (rc {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not jax_ext.native_available():
        pytest.skip("the compiled module is not installed: nothing to partition")
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers "
                        "(pip install '.[test]')")
    outdir = tmp_path_factory.mktemp("sharding")
    res = _child("run", outdir)
    res.update(_child("load", outdir))  # a fresh process, after the exports were written
    return res


@pytest.fixture(scope="module")
def results8(tmp_path_factory):
    return _child("matrix", tmp_path_factory.mktemp("sharding8"), ndev=8)


@pytest.fixture(scope="module")
def results4_nox64(tmp_path_factory):
    return _child("matrix", tmp_path_factory.mktemp("sharding4n"), ndev=4, x64=False)


@pytest.fixture(scope="module")
def results8_nox64(tmp_path_factory):
    return _child("matrix", tmp_path_factory.mktemp("sharding8n"), ndev=8, x64=False)


def _get(results, name):
    assert name in results, f"check {name} did not run; ran: {sorted(results)}"
    rec = results[name]
    assert rec["ok"], rec.get("error")
    return rec


@pytest.mark.parametrize("name", NO_COLLECTIVES)
def test_partitioned_without_communication(results, name):
    rec = _get(results, name)
    assert rec["collectives"] == [], rec
    assert any(t.startswith("jax_ext_") for t in rec["targets"]), rec  # still native


def test_src_sharded_along_gathered_dim_stays_sharded_and_exact(results):
    # The index is replicated, so is the result: each device gathers the rows it holds and
    # one all-reduce (of integers) combines them; src is never all-gathered.
    for mesh in ("auto", "explicit"):
        rec = _get(results, f"gather_src_rows_sharded_communicates[{mesh}]")
        assert rec["collectives"] == ["all-reduce"] and "jax_ext_gather_v2" in rec["targets"]


def test_grad_of_sharded_select_and_gather(results):
    rec = _get(results, "grad_select_and_gather_sharded[auto]")
    # The scatter-add gathers the index-sharded cotangent rows (exact, deterministic).
    assert set(rec["collectives"]) <= {"all-gather"}, rec


@pytest.mark.parametrize("name", [n for n in OTHER if "communicates" not in n
                                  and not n.startswith("grad_")])
def test_other_checks(results, name):
    _get(results, name)


MATRIX_FIXTURES = {(4, "x64"): "results", (8, "x64"): "results8",
                   (4, "nox64"): "results4_nox64", (8, "nox64"): "results8_nox64"}


# Each (devices, x64) pair reads one child process's results; the module's tests share a
# worker under pytest-xdist (pyproject.toml's --dist loadfile), so that each child runs once.
@pytest.mark.parametrize("ndev,x64", [pytest.param(n, x, id=f"{n}-{x}")
                                      for (n, x) in MATRIX_FIXTURES])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("check", MATRIX)
def test_matrix(request, check, impl, kind, ndev, x64):
    """Exact on every implementation and mesh kind; no collective where the check says."""
    _get(request.getfixturevalue(MATRIX_FIXTURES[ndev, x64]), f"{check}[{impl},{kind}]")


# The program, as a user wrote it: the gradient of a gather whose index is sharded
# 9 rows over 8 devices. With x64 on, the lax scatter-add handed XLA int64 indices, and its
# SPMD partitioner aborted the process. Run in a child, so an abort fails this test only.
REPRO = """
import sys
import numpy as np, jax, jax_ext
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_enable_x64", sys.argv[2] == "x64")
sh = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
f = lambda s, i: jax_ext.gather(s, [0], 0, jax.lax.with_sharding_constraint(i, sh)).sum()
with jax_ext.implementation(sys.argv[1]):
    g = jax.jit(jax.grad(f))(np.ones((4, 8), np.float32), np.zeros(9, np.int32))
want = np.zeros((4, 8), np.float32)
want[0] = 9
assert np.asarray(g).tobytes() == want.tobytes(), np.asarray(g)
print("ok")
"""


@pytest.mark.parametrize("x64", ["x64", "nox64"])
@pytest.mark.parametrize("impl", IMPLS)
def test_uneven_index_gradient_does_not_abort(impl, x64):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip()
    proc = subprocess.run([sys.executable, "-c", REPRO, impl, x64], env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (
        f"rc {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


@pytest.mark.parametrize("name", ROUNDTRIP)
def test_export_roundtrip_in_fresh_process(results, name):
    rec = _get(results, name)
    if name.endswith("[4dev]"):
        # Exported on auto mesh axes for 4 devices: the lax path, partitioned by XLA when
        # the deserialized program compiles, with no communication (the bits: the child).
        assert not [t for t in rec["targets"] if t.startswith("jax_ext_")], rec
        assert rec["collectives"] == [], rec
    else:
        assert {"jax_ext_select_v2", "jax_ext_gather_v2"} <= set(rec["targets"])


def test_export_checks_lists_versioned_targets():
    import jax
    checks = jax_ext.export_checks()
    names = {str(c) for c in checks}
    for t in ("jax_ext_select_v2", "jax_ext_gather_v2", "jax_ext_scatter_add_v2"):
        assert any(t in n for n in names), names
    assert all(isinstance(c, jax.export.DisabledSafetyCheck) for c in checks)
