"""No silent fallback: every place where jax_ext carries on in a degraded way when jax's
internals surprise it goes through jax_ext._compat.fallback, which logs a debug line and,
in strict mode (JAX_EXT_STRICT=1, which tests/conftest.py sets), raises. One test per
fallback breaks what it relies on and shows that strict mode raises where the fallback
would have hidden the change, and that without strict mode the fallback still holds."""
import ast
import logging
import os
import types

import jax
import numpy as np
import pytest

import jax_ext
from jax_ext import _compat, _compat_sharding
from jax_ext.auto import analysis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "jax_ext")

# Broad handlers that are not fallbacks: each reports what it caught where a user sees it.
REPORTED = {
    ("_native.py", "_load"): "the compiled module did not load or register: a warning at "
                             "import and native_error() give the cause and the cure",
    ("bench/timing.py", "_picked"): "the benchmark's report prints '? (the error)' in "
                                    "the column of what ran",
    ("onnx/_plugins.py", "_use_problems"): "jax_ext.onnx.interface_problems() reports the "
                                           "jax2onnx piece that moved, with what it raised",
}


def _broad(handler):
    t = handler.type
    names = [] if t is None else [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t])
                                  if isinstance(e, ast.Name)]
    return t is None or "Exception" in names or "BaseException" in names


def _calls_fallback_or_raises(handler):
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "fallback") or (
                    isinstance(f, ast.Name) and f.id == "fallback"):
                return True
    return False


def _handlers_in(node, fn):
    """(innermost enclosing function, handler) for every except clause under `node`."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
        if isinstance(child, ast.ExceptHandler) and _broad(child):
            yield fn, child
        yield from _handlers_in(child, inner)


def _handlers():
    for d, _, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                for fn, h in _handlers_in(ast.parse(open(path).read()), "<module>"):
                    yield os.path.relpath(path, PKG), fn, h


def test_every_broad_except_is_a_recorded_fallback_or_a_reported_failure():
    bad, reported = [], set()
    for rel, fn, h in _handlers():
        key = (rel.replace(os.sep, "/"), fn)
        if key in REPORTED:
            reported.add(key)
        elif not _calls_fallback_or_raises(h):
            bad.append(f"jax_ext/{rel}:{h.lineno} in {fn}")
    assert not bad, ("broad except without _compat.fallback (narrow it to what it means, or "
                     "record it):\n" + "\n".join(sorted(set(bad))))
    assert reported == set(REPORTED), "a listed handler is gone: drop it from REPORTED"


def test_fallback_logs_and_strict_mode_raises(monkeypatch, caplog):
    assert _compat.strict()  # the suite runs strict
    with pytest.raises(_compat.FallbackError, match="doing the other thing.*KeyError"):
        _compat.fallback("doing the other thing", KeyError("gone"))
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    with caplog.at_level(logging.DEBUG, logger="jax_ext"):
        _compat.fallback("doing the other thing", KeyError("gone"))
    assert "jax_ext falls back: doing the other thing (KeyError" in caplog.text


def test_a_per_site_rule_raises_in_strict_mode_without_cacheable(monkeypatch):
    """A jax whose register_lowering has dropped its cacheable flag (documented as
    temporary) would lower each (avals, params) once: auto would decide once for all such
    sites, and explain would miss the repeats."""
    got = []

    # no cacheable keyword (jax 0.12's shard_map_collective_rule stays)
    def register_lowering(prim, rule, platform=None, *, shard_map_collective_rule=None):
        got.append((prim, rule, platform))
    monkeypatch.setattr(_compat.mlir, "register_lowering", register_lowering)
    prim, rule = types.SimpleNamespace(name="fake_p"), (lambda ctx: [])
    with pytest.raises(_compat.FallbackError, match="fake_p is lowered once"):
        _compat.register_lowering(prim, rule, per_site=True)
    assert got == []
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    _compat.register_lowering(prim, rule, per_site=True)
    assert got == [(prim, rule, None)]  # registered as jax's cached kind


def _where_lowered(**jit):
    c, x = np.array([True, False, True]), np.arange(3, dtype=np.float32)
    with jax_ext.implementation("native"):
        return jax.jit(jax_ext.where, **jit).lower(c, x, -x).as_text()


@pytest.mark.skipif(not jax_ext.native_available(), reason="the kernel's lowering only")
def test_spmd_mesh_shape_raises_in_strict_mode_where_it_would_replicate(monkeypatch):
    """A jax without mlir.ShardingContext (a moved name) would lower every sharded native
    call unpartitioned, all-gathered."""
    monkeypatch.setattr(_compat_sharding, "ShardingContext", None)
    with pytest.raises(_compat.FallbackError, match="unpartitioned"):
        _where_lowered()
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert "jax_ext_select_v2" in _where_lowered()  # unpartitioned, still the kernel


class _FakeBlockArgument:
    """An IR block argument whose owner moved (IR bindings of another shape)."""


def test_donation_read_raises_in_strict_mode_where_it_would_copy(monkeypatch):
    """An IR whose block arguments are laid out otherwise would make every donated operand
    a copy, never an update in place."""
    monkeypatch.setattr(_compat, "ir", types.SimpleNamespace(BlockArgument=_FakeBlockArgument))
    with pytest.raises(_compat.FallbackError, match="not donated"):
        _compat.is_donated_block_argument(_FakeBlockArgument())
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert _compat.is_donated_block_argument(_FakeBlockArgument()) is False


def test_enclosing_equations_raise_in_strict_mode_without_jaxpr_subcomp(monkeypatch):
    """A jax that lowers jaxprs through another function would leave auto blind to every
    producer and consumer (it would pick as if nothing fused)."""
    monkeypatch.delattr(_compat.mlir, "jaxpr_subcomp")
    with pytest.raises(_compat.FallbackError, match="jaxpr_subcomp"):
        _compat.enclosing_equations()
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert _compat.enclosing_equations() == []


def test_enclosing_equations_raise_in_strict_mode_when_its_locals_move(monkeypatch):
    """A jaxpr_subcomp whose locals are named otherwise: the same blindness."""
    def jaxpr_subcomp():  # the frame enclosing_equations looks for, without its locals
        return _compat.enclosing_equations()
    monkeypatch.setattr(_compat.mlir, "jaxpr_subcomp", jaxpr_subcomp)
    with pytest.raises(_compat.FallbackError, match="locals"):
        jaxpr_subcomp()
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert jaxpr_subcomp() == []


def test_producer_raises_in_strict_mode_where_it_would_assume_fusion(monkeypatch):
    """An MLIR value of another shape: auto would assume every producer fuses."""
    with pytest.raises(_compat.FallbackError, match="would fuse"):
        analysis.producer(object())
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert analysis.producer(object()) == (False, "unknown (AttributeError)")


def test_producer_reads_raise_in_strict_mode_where_they_would_count_nothing(monkeypatch):
    """An op of another shape: auto would count no re-read bytes for a materialized
    operand."""
    with pytest.raises(_compat.FallbackError, match="counts nothing extra"):
        analysis.producer_reads(object())
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert analysis.producer_reads(object()) == 0


@pytest.mark.parametrize("name", ["stablehlo.broadcast_in_dim", "stablehlo.transpose"])
def test_free_view_raises_in_strict_mode_where_it_would_stop_looking(monkeypatch, name):
    """A broadcast or transpose op whose operands or attributes moved: auto would stop
    looking through free views and see a fusing producer."""
    with pytest.raises(_compat.FallbackError, match="not a free view"):
        analysis._free_view(object(), name)
    monkeypatch.setenv(_compat.STRICT_ENV, "0")
    assert analysis._free_view(object(), name) is False
    assert analysis._free_view(object(), "stablehlo.add") is False  # not a view: no fallback
