"""The recipes of docs/design.md ("Extending jax_ext") stay true: every file they name
exists, and every code name they give is found in a file named in the same step."""
import glob
import os
import re

import pytest

from jax_ext import _names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESIGN = os.path.join(ROOT, "docs", "design.md")

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "xla_ffi")),
                                reason="needs the source tree")
_PATH = re.compile(r"^(\.ci/|docs/|examples/|jax_ext/|tests/|xla_ffi/)\S*$|"
                   r"^[\w.]+\.(toml|txt|md)$")
_NAME = re.compile(r"^[A-Za-z_][\w.]*(\(\))?$")


def _section():
    text = open(DESIGN).read()
    start = text.index("## Extending jax_ext")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _steps():
    """The recipes' steps: each bullet, numbered item or paragraph."""
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:\*|\d+\.) )", _section()):
        if block.strip():
            yield " ".join(block.split())


def _files(path):
    """The files a path in a recipe stands for (`<op>`: each op's)."""
    paths = ([path.replace("<op>", o.op) for o in _names.OPS] if "<op>" in path else [path])
    out = []
    for p in paths:
        full = os.path.join(ROOT, p)
        if os.path.isdir(full):
            out += [f for f in glob.glob(os.path.join(full, "**", "*"), recursive=True)
                    if os.path.isfile(f)]
        elif os.path.isfile(full):
            out.append(full)
    return out


def test_every_file_a_recipe_names_exists():
    missing = []
    for step in _steps():
        for token in re.findall(r"`([^`]+)`", step):
            if _PATH.match(token) and not _files(token):
                missing.append(token)
    assert not missing, f"named in docs/design.md's recipes, not in the tree: {missing}"


def test_every_name_a_recipe_gives_is_in_a_file_of_its_step():
    """`SUB_BYTE` in `jax_ext/_lowering.py`: the name must be in that file (or in another
    file the same step names)."""
    bad, checked = [], 0
    for step in _steps():
        tokens = re.findall(r"`([^`]+)`", step)
        files = [f for t in tokens if _PATH.match(t) for f in _files(t)]
        texts = "\n".join(open(f, errors="replace").read() for f in files)
        for t in tokens:
            if _PATH.match(t) or not _NAME.match(t) or not files:
                continue
            name = t.removesuffix("()").rsplit(".", 1)[-1]
            if not (re.search(r"[A-Z_]", name)):
                continue  # a plain word (select, vmap), not a code name
            checked += 1
            if not re.search(rf"\b{re.escape(name)}\b", texts):
                bad.append(f"{t} (step: {step[:70]}...)")
    assert checked > 30
    assert not bad, "names the recipes give that their files lack:\n" + "\n".join(bad)


def test_the_op_recipe_names_every_field_of_the_spec():
    """A field added to OpSpec is a step of the op recipe."""
    import dataclasses
    section = _section()
    for f in dataclasses.fields(_names.OpSpec):
        assert f"`{f.name}`" in section or f.name in ("op", "primitive", "operands",
                                                      "targets", "module", "source"), f.name


def test_the_wheel_names_in_the_docs_carry_the_version():
    """Getting started names the wheels the release build makes, with this version; the
    README names none (no wheel is published: it says where wheels come from)."""
    import jax_ext
    names = re.findall(r"jax_ext-(\d[\w.]*?)-cp\d",
                       open(os.path.join(ROOT, "docs", "getting-started.md")).read())
    assert names and set(names) == {jax_ext.__version__}, names
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert not re.findall(r"jax_ext-\d[\w.]*?-cp\d", readme)
    assert ".ci/build-wheel.sh" in readme
