"""Two processes, one mesh: jax.distributed on 127.0.0.1 with 2 processes x 2 host
devices (and, for a table sharded along its rows, 2 x 4) and gloo CPU collectives. Each
process runs the sharding matrix
(sharding_checks.MATRIX: select and gather, forward, grad and vmap, evenly and unevenly
sharded, under "native", "lax" and "auto", on auto mesh axes, explicit ones under
jax.set_mesh and jax.make_mesh's default axes with no mesh set) over the 4 global devices,
compares its own shards with numpy bit for bit and the compiled HLO's collectives with the
jnp program's."""
import json
import os
import socket
import subprocess
import sys

import pytest

from references import IMPLS
from references import MESH_KINDS as KINDS, SHARDING_MATRIX as MATRIX

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 420  # both processes together; they are killed past it


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def results_2x4(tmp_path_factory):
    """The row-sharded table alone, on 2 processes x 4 devices."""
    return _run(tmp_path_factory, 4, "rows")


def _run(tmp_path_factory, per_process, *what):
    outdir = tmp_path_factory.mktemp("multiprocess")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={per_process}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_EXT_IMPL", None)  # each check sets its implementation itself
    port = _free_port()
    logs = [open(outdir / f"process{k}.log", "w+") for k in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multiprocess_child.py"),
                               str(port), str(k), str(outdir), *what], env=env, cwd=HERE,
                              stdout=logs[k], stderr=subprocess.STDOUT) for k in range(2)]
    try:
        for p in procs:
            p.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:  # a process whose peer died waits on it: never leave one behind
            if p.poll() is None:
                p.kill()
                p.wait()
    out = []
    for k, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        text = log.read()
        log.close()
        path = outdir / f"process{k}.json"
        if p.returncode != 0 or not path.exists():
            pytest.fail(f"process {k} failed (rc {p.returncode}):\n{text[-4000:]}")
        out.append(json.loads(path.read_text()))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("check", MATRIX)
def test_two_processes(results, check, impl, kind):
    name = f"{check}[{impl},{kind}]"
    for k, res in enumerate(results):
        assert name in res, f"process {k}: {name} did not run"
        assert res[name]["ok"], f"process {k}: {res[name].get('error')}"


@pytest.mark.parametrize("impl", IMPLS)
def test_shard_map_training_step_across_processes(results, impl):
    """A data-parallel step under shard_map over both processes' devices (replicated
    parameters, the batch sharded): losses and parameters equal the jnp twin's at every
    step, in both processes."""
    name = f"shard_map_training_step[{impl}]"
    for k, res in enumerate(results):
        assert name in res, f"process {k}: {name} did not run"
        assert res[name]["ok"], f"process {k}: {res[name].get('error')}"
    assert results[0][name]["losses"] == results[1][name]["losses"]


@pytest.mark.parametrize("layout", ["2x2", "2x4"])
@pytest.mark.parametrize("impl", IMPLS)
def test_row_sharded_table_across_processes(request, impl, layout):
    """A table sharded along its rows over both processes' devices: the forward's bits
    equal numpy's and a training step's table one device's, in both processes; no
    collective carries the table or a bfloat16 (tests/multiprocess_child.py)."""
    name = f"row_sharded_table[{impl}]"
    results = request.getfixturevalue("results" if layout == "2x2" else "results_2x4")
    for k, res in enumerate(results):
        assert name in res, f"process {k}: {name} did not run"
        assert res[name]["ok"], f"process {k}: {res[name].get('error')}"


@pytest.mark.parametrize("layout", ["2x2", "2x4"])
@pytest.mark.parametrize("impl", IMPLS)
def test_update_rows_on_a_row_sharded_table_across_processes(request, impl, layout):
    """update_rows on a table and its state sharded along their rows over both processes'
    devices: each process holds its rows with one device's bits; no collective carries the
    table or a float (tests/multiprocess_child.py)."""
    name = f"update_rows[{impl}]"
    results = request.getfixturevalue("results" if layout == "2x2" else "results_2x4")
    for k, res in enumerate(results):
        assert name in res, f"process {k}: {name} did not run"
        assert res[name]["ok"], f"process {k}: {res[name].get('error')}"
