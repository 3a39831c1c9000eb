"""Benchmark cases for update_rows: a training step of an embedding table (``train ...``
rows; on N host devices, ``shard train ...``).

A step: gather the rows of a 262144 x 64 float32 table (64 MiB) at n indices (about 1%
past the end: pad rows), gradient rows that depend on the rows read
(``sum(rows * w) + sum(rows**2) / 4``), then the optimizer (optax's sgd or adam) on the
table. The table and the optimizer's state are donated and each call's result is the next
call's table (a chain), as in a training loop. Ours is ``jax_ext.gather``, the gradient of
the rows, then ``jax_ext.update_rows``. Each configuration is set against three programs,
a row each:

* ``vs dense``: jnp's dense step, ``jax.grad`` of the loss through ``jnp.take`` with
  respect to the table, then ``optimizer.update`` and ``optax.apply_updates``;
* ``vs exact rows``: the exact row update written in jnp: ``jnp.unique`` of the ids,
  ``jax.ops.segment_sum`` of the gradient rows (index order), the optimizer on the
  unique rows, ``.at[unique].set``;
* ``vs naive add``: ``table.at[ids].add(-lr * grads)`` (sgd only), not exact where ids
  repeat.

And with as many indices as rows, against the dense step through ``jax_ext.gather``
(``vs jax_ext dense``). sgd matches the dense step bit for bit; adam updates the touched
rows only (lazily), so the two agree within rounding at the first step. Every row reports
each side's per-device temp memory (``memory_analysis``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from .._gather import gather
from .._update_rows import update_rows
from .records import Case, Made
from .kinds import SPARSE

ROWS, COLS, LR = 262144, 64, 0.05
Step = Callable[..., tuple[jax.Array, ...]]


def _optimizer(name: str) -> Any:
    import optax
    return optax.sgd(LR) if name == "sgd" else optax.adam(1e-3)


def _loss(rows: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(rows * w) + jnp.sum(rows * rows) / 4


def _take(t: jax.Array, i: jax.Array) -> jax.Array:
    return jnp.take(t, i, axis=0, mode="fill", fill_value=0)


def _ours_take(t: jax.Array, i: jax.Array) -> jax.Array:
    return gather(t, [0], 0, i)


def _apply(p: jax.Array, u: jax.Array) -> jax.Array:
    """optax.apply_updates on one array."""
    return jnp.asarray(p + u).astype(p.dtype)


# Every step takes (ids, table, *state leaves, w) and returns (table, *state leaves): the
# table and the state are the chain, donated.

def _ours(opt: Any, tree: Any) -> Step:
    def step(i: jax.Array, t: jax.Array, *rest: jax.Array) -> tuple[jax.Array, ...]:
        *leaves, w = rest
        g = jax.grad(_loss)(_ours_take(t, i), w)
        t, s = update_rows(opt, t, jax.tree.unflatten(tree, leaves), [0], 0, i, g)
        return (t, *jax.tree.leaves(s))
    return step


def _dense(opt: Any, tree: Any, take: Callable[[jax.Array, jax.Array], jax.Array]) -> Step:
    def step(i: jax.Array, t: jax.Array, *rest: jax.Array) -> tuple[jax.Array, ...]:
        *leaves, w = rest
        g = jax.grad(lambda t: _loss(take(t, i), w))(t)
        u, s = opt.update(g, jax.tree.unflatten(tree, leaves), t)
        return (_apply(t, u), *jax.tree.leaves(s))
    return step


def _exact(opt: Any, tree: Any) -> Step:
    """The exact row update in jnp: unique ids, index-order sums, the rows' update."""
    def step(i: jax.Array, t: jax.Array, *rest: jax.Array) -> tuple[jax.Array, ...]:
        *leaves, w = rest
        n = i.shape[0]
        g = jax.grad(_loss)(_take(t, i), w)
        u, inv = jnp.unique(i, size=n, fill_value=t.shape[0], return_inverse=True)
        sums = jax.ops.segment_sum(g, inv.reshape(-1), num_segments=n)

        def rows(x: jax.Array) -> jax.Array:
            return x.at[u].get(mode="fill", fill_value=0) if x.shape == t.shape else x

        def put(x: jax.Array, r: jax.Array) -> jax.Array:
            return x.at[u].set(r, mode="drop") if x.shape == t.shape else r
        upd, new = opt.update(sums, jax.tree.map(rows, jax.tree.unflatten(tree, leaves)),
                              rows(t))
        return (put(t, _apply(rows(t), upd)),
                *[put(x, r) for x, r in zip(leaves, jax.tree.leaves(new))])
    return step


def _naive(opt: Any, tree: Any) -> Step:
    """sgd by a scatter-add of the gradient rows: not exact where ids repeat."""
    def step(i: jax.Array, t: jax.Array, *rest: jax.Array) -> tuple[jax.Array, ...]:
        *leaves, w = rest
        g = jax.grad(_loss)(_take(t, i), w)
        return (t.at[i].add(-LR * g, mode="drop"), *leaves)
    return step


def _index(rng: np.random.Generator, n: int) -> npt.NDArray[np.int32]:
    idx = rng.integers(0, ROWS, n).astype(np.int32)
    past = rng.choice(n, max(1, n // 100), replace=False)
    idx[past] = ROWS + 3  # a few past the end: pad rows on every side
    return idx


def _case(name: str, opt_name: str, n: int, versus: str,
          put: Callable[[npt.NDArray[Any], bool], jax.Array] | None = None,
          out: Callable[[jax.Array], Any] | None = None) -> Case:
    """`put(array, table_shaped)` places an argument (sharded cases), `out(table)` the
    results' shardings."""
    def make() -> Made:
        rng = np.random.default_rng(0)
        opt = _optimizer(opt_name)
        t = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        leaves = [np.asarray(x) for x in jax.tree.leaves(opt.init(t))]
        tree = jax.tree.structure(opt.init(t))
        host = (_index(rng, n), t, *leaves, rng.standard_normal((n, COLS)).astype(np.float32))
        place = put or (lambda a, _: jnp.asarray(a))
        args = tuple(place(a, a.shape == t.shape) for a in host)
        ref = {"dense": lambda: _dense(opt, tree, _take),
               "jax_ext dense": lambda: _dense(opt, tree, _ours_take),
               "exact rows": lambda: _exact(opt, tree),
               "naive add": lambda: _naive(opt, tree)}[versus]()
        chain = tuple(range(1, 2 + len(leaves)))
        kw: dict[str, Any] = {"donate_argnums": chain}
        if out is not None:
            kw["out_shardings"] = tuple(out(a) for a in args[1:2 + len(leaves)])
        return jax.jit(_ours(opt, tree), **kw), jax.jit(ref, **kw), args

    return Case(name=name, op="program", dtype="float32", elements=n * COLS,
                bytes=3 * n * COLS * 4, make=make, chain=True, kind=SPARSE, exact=False,
                device_memory=True)


def cases(quick: bool, full: bool = True) -> list[Case]:
    """One device: sgd at 2048 and 65536 indices and adam at 2048, each against the dense
    step, the exact rows in jnp and (sgd) the naive add; sgd with as many indices as rows
    against the dense step through jax_ext.gather. The default run: sgd at 2048 against
    the dense step and the naive add."""
    table = f"({ROWS},{COLS})"
    configs = [("sgd", 2048, ("dense", "exact rows", "naive add")),
               ("sgd", 65536, ("dense", "exact rows", "naive add")),
               ("adam", 2048, ("dense", "exact rows")),
               ("sgd", ROWS, ("jax_ext dense",))]
    if not full:
        configs = [("sgd", 2048, ("dense", "naive add"))]
    return [_case(f"train {opt} {table} n={n} vs {v}", opt, n, v)
            for opt, n, versus in configs for v in versus]


def sharded_cases(mesh: jax.sharding.Mesh, tag: str) -> list[Case]:
    """On the mesh's axis "x": the table and its state sharded along the rows, 8192
    indices and their weights sharded along the batch; sgd and adam, against the dense
    step and the exact rows in jnp (sgd: and the naive add)."""
    from jax.sharding import NamedSharding, PartitionSpec

    def put(a: npt.NDArray[Any], table_shaped: bool) -> jax.Array:
        """Every argument but the scalar step count along its first dim."""
        axes = ("x",) + (None,) * (a.ndim - 1) if a.ndim else ()
        spec = PartitionSpec(*axes)  # type: ignore[no-untyped-call]  # unannotated in jax
        out: jax.Array = jax.device_put(a, NamedSharding(mesh, spec))
        return out
    n, table = 8192, f"({ROWS},{COLS})"
    return [_case(f"shard train rows sharded {opt} {table} n={n} vs {v} {tag}", opt, n, v,
                  put, lambda a: a.sharding)
            for opt, versus in (("sgd", ("dense", "exact rows", "naive add")),
                                ("adam", ("dense", "exact rows")))
            for v in versus]
