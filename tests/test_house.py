"""The shape of the code, checked: jax_ext's modules import one way (no cycle; the layers of
docs/design.md), modules and functions are short enough to read at once and functions
shallowly nested, in Python and in C++, comments state rules rather than measurements, and
no test module imports another (shared references live in tests/references.py)."""
import ast
import io
import os
import re
import tokenize

import pytest

from jax_ext import _names
from references import import_base
from references import package_modules as _modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FFI = os.path.join(ROOT, "xla_ffi")
TESTS = os.path.join(ROOT, "tests")
MAX_PY_BODY, MAX_CC_BODY, MAX_DEPTH = 60, 70, 4
# Lines of a package module outside jax_ext/bench/ (the benchmark, a tool of its own), and
# tighter limits for single modules: _lowering.py, the floors every op goes down.
MAX_MODULE_LINES = 500
MAX_LINES = {"jax_ext._lowering": 400}

pytestmark = pytest.mark.skipif(not os.path.isdir(FFI), reason="needs the source tree")

# Layers, outermost first: a module may import its own layer's modules or lower ones.
LAYERS = [
    {"jax_ext", "jax_ext.bench", "jax_ext.bench.*", "jax_ext.onnx", "jax_ext.onnx.*"},
    # an op's front-end and rules (gather's partitioning split from its rules by role)
    {m for o in _names.OPS for m in (o.front_end, o.rules) if m} | {
        "jax_ext._gather_partition", "jax_ext._update_rows_partition"},
    {"jax_ext._rows", "jax_ext._lowering", "jax_ext._partition", "jax_ext._primitives",
     "jax_ext._gather_args", "jax_ext._eager", "jax_ext._shard_like"},
    {"jax_ext.auto", "jax_ext.auto.*", "jax_ext._native"},
    {"jax_ext._common", "jax_ext._config", "jax_ext._compat", "jax_ext._compat_sharding",
     "jax_ext._names", "jax_ext._types", "jax_ext._version", "jax_ext._jax_ext",
     "jax_ext._build_info"},
]


_BUILT = {"jax_ext._jax_ext", "jax_ext._build_info"}  # written by the build, not in the tree


def _imports(name, path, mods):
    """Every jax_ext module `name` imports, at any depth of its code: `from . import x`
    imports the module x (where it is one), not the package."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = import_base(node, pkg)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in mods or sub in _BUILT else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("jax_ext")}


def _graph():
    mods = _modules()
    known = set(mods) | _BUILT
    return {m: sorted(i for i in _imports(m, p, mods) if i in known and i != m)
            for m, p in mods.items()}


def _layer(m):
    for k, layer in enumerate(LAYERS):
        if m in layer or any(p.endswith("*") and m.startswith(p[:-1]) for p in layer):
            return k
    raise AssertionError(f"{m} is in no layer of test_house.LAYERS")


def test_modules_import_one_way():
    graph = _graph()
    bad = [(m, i) for m, deps in graph.items() for i in deps
           if _layer(i) < _layer(m) and not (m.startswith("jax_ext.bench") and i == "jax_ext")]
    assert not bad, "imports against the layers (outer <- inner): " + ", ".join(
        f"{m} -> {i}" for m, i in bad)


def test_no_import_cycle():
    graph, state, stack = _graph(), {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for i in graph.get(m, []):
            if i.startswith("jax_ext.bench") or m == "jax_ext" or i == "jax_ext":
                continue  # the package's __init__ re-exports; bench sits outside
            if state.get(i) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(i):] + [i]))
            if i not in state:
                visit(i)
        stack.pop()
        state[m] = "done"
    for m in graph:
        if m not in state:
            visit(m)


def _depth(node, level=0):
    nested = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)
    deepest = level
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        deepest = max(deepest, _depth(child, level + isinstance(child, nested)))
    return deepest


def _python_functions():
    for _, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = (body[-1].end_lineno - body[0].lineno + 1) if body else 0
                where = f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}"
                yield where, lines, _depth(node)


def test_python_functions_are_short_and_shallow():
    long = [f"{w} ({n} lines)" for w, n, _ in _python_functions() if n > MAX_PY_BODY]
    deep = [f"{w} (depth {d})" for w, _, d in _python_functions() if d > MAX_DEPTH]
    assert not long and not deep, "\n".join(long + deep)


def _cc_functions(path):
    """(name, body lines, deepest brace nesting inside the body) of each function defined
    at namespace level: a '{' that follows ')' (a parameter list, maybe with const or a
    return type) opens a body."""
    text = open(path).read()
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '""', text)
    depth, out, cur, sig = 0, [], None, ""
    for ln, line in enumerate(text.split("\n"), 1):
        for ch in line:
            if ch == "{":
                head = sig.strip()
                if (cur is None and re.search(r"\)\s*(const|noexcept|override|->[^;]*)*$", head)
                        and not re.match(r"(if|for|while|switch)\b", head)):
                    name = re.match(r"(?:[\w:<>,*&\s]+?\s)?([\w:~]+)\s*\(", head)
                    cur = [name.group(1) if name else head[:40], ln, depth, depth]
                depth += 1
                if cur is not None:
                    cur[3] = max(cur[3], depth)
                sig = ""
            elif ch == "}":
                depth -= 1
                if cur is not None and depth == cur[2]:
                    out.append((cur[0], ln - cur[1] - 1, cur[3] - cur[2] - 1))
                    cur = None
                sig = ""
            elif ch == ";":
                sig = ""
            else:
                sig += ch
        sig += " "
    return out


def test_cpp_functions_are_short_and_shallow():
    bad = []
    for f in sorted(os.listdir(FFI)):
        if f.endswith((".cc", ".h")):
            for name, lines, depth in _cc_functions(os.path.join(FFI, f)):
                if lines > MAX_CC_BODY or depth > MAX_DEPTH:
                    bad.append(f"xla_ffi/{f} {name}: {lines} lines, depth {depth}")
    assert not bad, "\n".join(bad)


def test_modules_are_short():
    """A module is one thing a reader can hold at once: split by role past the limit."""
    long = []
    for m, path in sorted(_modules().items()):
        if m == "jax_ext.bench" or m.startswith("jax_ext.bench."):
            continue
        limit = MAX_LINES.get(m, MAX_MODULE_LINES)
        n = len(open(path).read().splitlines())
        if n > limit:
            long.append(f"{os.path.relpath(path, ROOT)}: {n} lines (at most {limit})")
    assert not long, "\n".join(long)


# A measurement in a comment: a time in milliseconds or microseconds, a range of ratios
# (two numbers and an x), a bandwidth, or a call's duration reported in numbers. Its
# numbers, with the machine they came from, belong in docs/performance.md, which the
# comment names by section.
MEASURED = re.compile(r"\d\s?(ms|us|µs|ns)\b|\d(\.\d+)?-\d+(\.\d+)?x\b|\d\s?[GM]B/s"
                      r"|\bran at\b|\btook \d")


def _comments():
    """(where, text) of every comment of the package, the tests and the C++ sources."""
    paths = list(_modules().values()) + [
        os.path.join(TESTS, f) for f in sorted(os.listdir(TESTS)) if f.endswith(".py")]
    for path in paths:
        tokens = tokenize.generate_tokens(io.StringIO(open(path).read()).readline)
        for t in tokens:
            if t.type == tokenize.COMMENT:
                yield f"{os.path.relpath(path, ROOT)}:{t.start[0]}", t.string
    for f in sorted(os.listdir(FFI)):
        if f.endswith((".cc", ".h")):
            for ln, line in enumerate(open(os.path.join(FFI, f)), 1):
                if "//" in line:
                    yield f"xla_ffi/{f}:{ln}", line[line.index("//"):]


def test_comments_state_rules_not_measurements():
    bad = [f"{where}: {text.strip()}" for where, text in _comments() if MEASURED.search(text)]
    assert not bad, "\n".join(bad)


def test_no_test_module_imports_another():
    tests = {f[:-3] for f in os.listdir(TESTS) if f.startswith("test_") and f.endswith(".py")}
    bad = []
    for t in sorted(tests):
        tree = ast.parse(open(os.path.join(TESTS, t + ".py")).read())
        for node in ast.walk(tree):
            names = ([node.module] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bad += [f"{t} imports {n}" for n in names if n in tests and n != t]
    assert not bad, "\n".join(bad)
