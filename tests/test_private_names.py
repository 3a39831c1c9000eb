"""jax's private and unstable names, counted: every one that jax_ext's sources use (read
with ast, followed through jax_ext's own re-exports such as ``_compat.mlir``) is listed in
jax_ext._compat.PRIVATE_NAMES with why no public name serves, and every listed one is
used. A new private name fails here until it is listed with its reason."""
import ast
import os
import sys

import jax
import pytest

from jax_ext import _compat
from references import import_base, package_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# jax.extend, jax.ffi, jax.lax, jax.sharding, ... are public; these are not (jax.core is
# being thinned release by release, jax.experimental promises nothing).
PRIVATE = ("jax._src", "jax.interpreters", "jax.core", "jax.experimental")


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def _aliases(tree, name, is_pkg):
    """What each name bound by an import, or by a module-level `a = b.c`, stands for."""
    pkg = name if is_pkg else name.rsplit(".", 1)[0]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, pkg)
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and _dotted(node.value)):
            out.setdefault(node.targets[0].id, ("=", _dotted(node.value)))
    return out


class _Resolver:
    def __init__(self):
        self.mods = package_modules()
        self.aliases = {m: _aliases(ast.parse(open(p).read()), m, p.endswith("__init__.py"))
                        for m, p in self.mods.items()}

    def resolve(self, dotted, module, depth=0):
        """The full name `dotted` (as written in `module`) stands for."""
        head, _, rest = dotted.partition(".")
        full = self.aliases[module].get(head, head if head == "jax" else None)
        if isinstance(full, tuple):  # `head = value` in this module: what value stands for
            return (self.resolve(f"{full[1]}.{rest}" if rest else full[1], module, depth + 1)
                    if depth < 8 else None)
        if full is None:
            return None
        full = f"{full}.{rest}" if rest else full
        if full.startswith("jax_ext.") and depth < 8:
            parts = full.split(".")
            for k in range(len(parts) - 1, 0, -1):
                mod = ".".join(parts[:k])
                if mod in self.mods and parts[k] in self.aliases[mod] and depth < 8:
                    return self.resolve(".".join(parts[k:]), mod, depth + 1)
        return full


def _normalized(full):
    """A name as module + one attribute (jax.interpreters.mlir.ir.Value -> ...mlir.ir)."""
    parts = full.split(".")
    k = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in sys.modules)
    return ".".join(parts[:k + 1])


def used_private_names():
    r, found = _Resolver(), {}
    for m, path in r.mods.items():
        for node in ast.walk(ast.parse(open(path).read())):
            names = []
            if isinstance(node, (ast.Attribute, ast.Name)):
                names.append(_dotted(node))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and _dotted(node.args[0])):
                names.append(f"{_dotted(node.args[0])}.{node.args[1].value}")
            for d in filter(None, names):
                full = r.resolve(d, m)
                if full and full.startswith(PRIVATE):
                    where = f"{os.path.relpath(path, ROOT)}:{node.lineno}"
                    found.setdefault(_normalized(full), where)
    # a prefix of a longer name (the `jax._src.config` of `jax._src.config.enum_state`)
    return {n: w for n, w in found.items()
            if not any(o.startswith(n + ".") for o in found)}


@pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "xla_ffi")),
                    reason="needs the source tree")
def test_every_private_jax_name_is_listed_with_its_reason():
    used = used_private_names()
    unlisted = {n: w for n, w in used.items() if n not in _compat.PRIVATE_NAMES}
    assert not unlisted, ("private jax names outside _compat.PRIVATE_NAMES (use a public "
                          "one, or list it with why none serves):\n" + "\n".join(
                              f"{n} ({w})" for n, w in sorted(unlisted.items())))
    stale = set(_compat.PRIVATE_NAMES) - set(used)
    assert not stale, f"listed but no longer used: {sorted(stale)}"
    assert all(len(why) > 20 for why in _compat.PRIVATE_NAMES.values())


def _gone(names):
    """What is wrong with each of `names` ({name: why jax_ext uses it}) that this jax
    lacks, one line each, naming it."""
    import importlib
    missing = []
    for name, why in names.items():
        mod, _, attr = name.rpartition(".")
        try:
            getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name} is gone from jax {jax.__version__} ({e}); jax_ext uses "
                           f"it for: {why}")
    return missing


def test_every_listed_name_exists_in_this_jax():
    """Each listed name resolves in the jax under test (both ends of the window run it);
    a failure names each one that is gone, with what jax_ext uses it for."""
    missing = _gone(_compat.PRIVATE_NAMES)
    assert not missing, "\n".join(missing)


def test_the_names_were_checked_on_this_jax_release():
    """PRIVATE_NAMES_CHECKED_ON lists the releases the names were resolved and used on:
    both ends of the window, the newest being the one the version warning allows."""
    checked = [_compat._version_tuple(v) for v in _compat.PRIVATE_NAMES_CHECKED_ON]
    assert checked[0][:3] == _compat.MIN_JAX, checked
    assert checked[-1][:2] == _compat.NEWEST_TESTED, checked
    assert _compat.JAX_VERSION[:2] in {c[:2] for c in checked} or (
        checked[0] < _compat.JAX_VERSION < checked[-1]), (
        f"jax {jax.__version__}: the private names were checked on "
        f"{_compat.PRIVATE_NAMES_CHECKED_ON} only; once this test file passes here, add it")


def test_a_missing_name_is_named():
    """The resolution check names a name jax does not have, and a module it lacks."""
    gone = _gone({"jax._src.core.no_such_name": "a test", "jax._src.no_such_module.x": "b",
                  "jax._src.core.Tracer": "exists"})
    assert len(gone) == 2 and gone[0].startswith("jax._src.core.no_such_name is gone")
    assert gone[1].startswith("jax._src.no_such_module.x is gone"), gone
