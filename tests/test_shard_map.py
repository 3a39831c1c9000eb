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

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("vma")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=4").strip()
    env.pop("JAX_EXT_IMPL", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "vma_checks.py"), str(out)],
                          env=env, cwd=HERE, capture_output=True, text=True, timeout=900)
    path = out / "vma.json"
    if proc.returncode != 0 or not path.exists():
        pytest.fail(f"vma_checks.py failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n"
                    f"{proc.stderr[-4000:]}")
    return json.loads(path.read_text())


def _known_gap(case):
    """Partial-manual shard_map on explicit axes: the lax formulation of gather is refused by
    jax ("Going from Manual AxisType to Auto or Explicit AxisType is not allowed"). Asserted
    as a failure so that the day it runs, this list must shrink."""
    return case.startswith("2x2explicit:gather") and ("[lax]" in case or "[auto]" in case)


def test_matrix_covers_every_op_and_transform(matrix):
    ops = {k.split("[")[0].split(":")[-1] for k in matrix}
    assert ops == {"select_numpy", "select_none", "where", "where3_rows",
                   "where3_elementwise", "gather"}
    for t in ("forward", "psum_forward", "grad", "jvp_of_grad", "vmap_grad", "scan_grad"):
        assert any(f"[{t}]" in k for k in matrix), t
    assert any("[vma=False]" in k for k in matrix) and any(k.startswith("2x2auto:") for k in matrix)
    assert len(matrix) > 1000


def test_every_case_matches_the_jnp_twin(matrix):
    bad = {k: v for k, v in matrix.items() if v is not None and not _known_gap(k)}
    assert not bad, f"{len(bad)} of {len(matrix)} cases differ from jnp:\n" + "\n".join(
        f"{k}: {v[:400]}" for k, v in list(bad.items())[:10])


def test_known_gap_still_fails_loudly(matrix):
    gap = {k: v for k, v in matrix.items() if _known_gap(k)}
    assert gap and all(v is not None and "NotImplementedError" in v for v in gap.values()), {
        k: v for k, v in gap.items() if v is None}
