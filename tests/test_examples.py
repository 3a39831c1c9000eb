"""Every script in examples/ runs, every ```python block in README.md runs as written (each
in a fresh process), and the ```python blocks of each page under docs/ run in order, in one
fresh process per page (a page reads as one session: a later block may use an earlier one's
names). All of them import the jax_ext under test."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

import jax_ext
from references import need_imports

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(jax_ext.__file__)))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECTED = {"quickstart", "openvino_onednn_select", "onnx_where", "tensorflow_where3",
            "ascend_gather", "training_step", "sharding", "export", "data_parallel",
            "onnx_round_trip", "embedding_training"}
# Fragments included into pages (`{include}`), not pages: their blocks run with the page.
DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md")
                   if "_build" not in p.parts and "_generated" not in p.parts
                   and not p.name.startswith("_"))


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


def _expand_includes(path):
    """A Markdown file's text with each MyST ```{include} fragment``` replaced by the
    fragment's text."""
    def fragment(m):
        return _expand_includes((path.parent / m.group(1).strip()).resolve())
    return re.sub(r"^```\{include\} (.+?)\n```\n", fragment, path.read_text(), flags=re.M)


def python_blocks(path):
    """The ```python fenced blocks of a Markdown file, included fragments too (other
    fences, and MyST directives such as ```{literalinclude}, are not run)."""
    return re.findall(r"^```python\n(.*?)^```", _expand_includes(path), flags=re.S | re.M)


def test_every_expected_example_exists():
    assert {p.stem for p in EXAMPLES} == EXPECTED


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    need_imports(path.read_text())  # an optional dependency without a wheel here: skipped
    out = _run_python([str(path)], cwd=tmp_path)
    assert out.strip(), "an example prints what it showed"
    if path.stem == "quickstart":
        want = "True" if jax_ext.native_available() else "False"
        assert out.startswith(f"native module: {want}")


BLOCKS = python_blocks(ROOT / "README.md")


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_runs(i, tmp_path):
    need_imports(BLOCKS[i])
    _run_python(["-c", BLOCKS[i]], cwd=tmp_path)


def test_docs_pages_exist():
    names = {p.relative_to(ROOT / "docs").as_posix() for p in DOC_PAGES}
    assert {"index.md", "getting-started.md", "sharp-bits.md", "scaling-out.md",
            "performance.md", "design.md", "testing.md", "api.md"} <= names
    assert sum(len(python_blocks(p)) for p in DOC_PAGES) >= 10


@pytest.mark.parametrize("page", [p for p in DOC_PAGES if python_blocks(p)],
                         ids=lambda p: p.relative_to(ROOT / "docs").as_posix())
def test_docs_page_python_blocks_run(page, tmp_path):
    blocks = python_blocks(page)
    need_imports("\n".join(blocks))
    script = "\n".join(f"# --- block {k}\n{b}" for k, b in enumerate(blocks))
    _run_python(["-c", script], cwd=tmp_path)


def test_api_reference_covers_all():
    """Every public name has an autodoc entry (the reference is generated, so a name added
    to __all__ without one would silently be missing from it)."""
    text = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. auto(?:function|class):: jax_ext\.(\w+)", text,
                                flags=re.M))
    assert documented == set(jax_ext.__all__)


def test_no_machine_paths_or_run_stamps_in_user_docs():
    """User-facing text holds no absolute path of a machine, no run time stamp and no commit
    hash (the generated benchmark fragment included: its header names the machine, not the
    run)."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md",
             *(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
    bad = re.compile(r"/work/|/home/|/tmp/|/Users/|\b20\d\d-\d\d-\d\d\b|\b[0-2]\d:[0-5]\d\b"
                     r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
    # A changelog's release headings ("## [0.2.0] - <date>") carry dates by design.
    release = re.compile(r"^## \[.*$", flags=re.M)
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files
            for m in bad.finditer(release.sub("", p.read_text()))]
    assert not hits, hits


DOCTEST = """
import doctest, jax_ext
owned = {"select", "where", "where3", "gather", "update_rows", "implementation", "native_available",
         "native_error", "export_checks"}
finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(verbose=False)
for name in jax_ext.__all__:
    for t in finder.find(getattr(jax_ext, name), name, globs={}):
        runner.run(t)
    assert name not in owned or any(t.examples for t in finder.find(getattr(jax_ext, name))), (
        f"{name}'s docstring has no example")
res = runner.summarize(verbose=False)
assert res.failed == 0 and res.attempted > 0, res
print(res)
"""


def test_docstring_examples_run(tmp_path):
    """The Example sections of the public docstrings run as written (doctest, fresh process,
    default jax config: what a user who copies them gets)."""
    assert "attempted" in _run_python(["-c", DOCTEST], cwd=tmp_path)
