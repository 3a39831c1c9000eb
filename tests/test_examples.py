"""Every script in examples/ runs, and every ```python block in README.md runs as written
(each in a fresh process, importing the jax_ext under test)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

import jax_ext

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(jax_ext.__file__)))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECTED = {"quickstart", "openvino_onednn_select", "onnx_where", "tensorflow_where3",
            "ascend_gather", "training_step", "sharding", "export"}


def _run_python(args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PKG_PARENT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_EXT_IMPL", None)
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
    return r.stdout


def test_every_expected_example_exists():
    assert {p.stem for p in EXAMPLES} == EXPECTED


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    out = _run_python([str(path)], cwd=tmp_path)
    assert out.strip(), "an example prints what it showed"
    if path.stem == "quickstart":
        want = "True" if jax_ext.native_available() else "False"
        assert out.startswith(f"native module: {want}")


def readme_python_blocks():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    return blocks


BLOCKS = readme_python_blocks()


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_runs(i, tmp_path):
    _run_python(["-c", BLOCKS[i]], cwd=tmp_path)
