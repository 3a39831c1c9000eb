"""The names jax_ext gives jax and XLA are written once (jax_ext/_names.py): the compiled
module registers exactly its targets, the primitives carry its names, and what users see
(explain, export_checks, implementation) uses them."""
import numpy as np
import pytest

import jax_ext
from jax_ext import _names


@pytest.mark.skipif(not jax_ext.native_available(), reason="needs the native module")
def test_compiled_module_registers_exactly_the_named_targets():
    from jax_ext import _jax_ext, _native
    assert sorted(_jax_ext.registrations()) == sorted(_names.TARGETS)
    assert sorted(_native.TARGETS) == sorted(_names.TARGETS)


def test_primitives_and_targets_carry_the_table_s_names():
    from jax_ext import _gather, _scatter_add, _select, _update_rows
    assert [_select.select_p.name, _gather.gather_p.name, _scatter_add.scatter_add_p.name,
            _update_rows.update_rows_p.name] == [o.primitive for o in _names.OPS]
    for o in _names.OPS:
        assert o.targets[-1] == o.target and all(t.startswith(o.primitive) for t in o.targets)
        assert {o.primitive, *o.shard_primitives} <= _names.PRIMITIVES
    checks = " ".join(map(str, jax_ext.export_checks()))
    assert all(t in checks for t in _names.TARGETS)


def test_explain_names_ops_and_implementations_from_the_table():
    x = np.ones(8, np.float32)
    ops = {d.op for d in jax_ext.explain(lambda x: jax_ext.where(x > 0, x, -x), x)}
    ops |= {d.op for d in jax_ext.explain(
        lambda t: jax_ext.gather(t, [0], 0, np.array([1, 0])).sum(), x.reshape(2, 4))}
    assert ops <= {o.op for o in _names.OPS}
    for name in _names.IMPLEMENTATIONS:
        with jax_ext.implementation(name):
            pass


def test_every_op_spec_names_its_files_and_its_estimator():
    """An op is its spec entry, its Python modules (front-end and rules), its C++ file
    and its estimator: each named in the spec exists, the rules module registers the
    primitive's rules, and nothing else is looked up by the op's name."""
    import importlib
    import os
    from jax_ext import _compat
    from jax_ext.auto import costs, model
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert sorted(model.ESTIMATORS) == sorted(o.op for o in _names.OPS)
    for o in _names.OPS:
        for name in filter(None, (o.front_end, o.rules)):
            assert importlib.import_module(name).__name__ == name
        prim = importlib.import_module("jax_ext._primitives")
        p = next(v for v in vars(prim).values() if getattr(v, "name", None) == o.primitive)
        rules = vars(importlib.import_module(o.rules)).values()
        assert _compat.ad.primitive_jvps[p] in rules or _compat.ad.primitive_transposes[p] \
            in rules, f"{o.rules} does not hold {o.primitive}'s rules"
        if os.path.isdir(os.path.join(root, "xla_ffi")):
            assert os.path.isfile(os.path.join(root, "xla_ffi", o.source)), o.source
        assert set(o.fused_operands) <= set(o.operands), o
        assert o.walk in ("collapsed", "batched")
        assert hasattr(costs.shipped(), o.op), f"costs.json has no section {o.op}"
        if o.native_dtypes is not None:
            import jax.numpy as jnp
            assert all(jnp.dtype(n).name == n for n in o.native_dtypes)
