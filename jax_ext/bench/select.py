"""Benchmark cases for select: sizes, dtypes, broadcasts, donation (see the cli module's docstring
for how a case is timed).

Each case: ``make()`` returns (ours, reference, args), both already ``jax.jit``-ed and
taking ``*args``; ``bytes`` counts the bytes read and written, for GB/s.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

import jax_ext

from .records import Case, JaxFn, Made, Shape
from .kinds import SINGLE


def _select_case(name: str, n_cond: Shape, n_x: Shape, n_y: Shape, dtype: npt.DTypeLike, *,
                 donate: bool = False, rng_seed: int = 0, fn: JaxFn | None = None) -> Case:
    """A select case over the broadcast of the three shapes."""
    def make() -> Made:
        rng = np.random.default_rng(rng_seed)
        c = jnp.asarray(rng.integers(0, 2, n_cond).astype(bool))
        x = jnp.asarray(rng.standard_normal(n_x).astype(np.float32).astype(dtype))
        y = jnp.asarray(rng.standard_normal(n_y).astype(np.float32).astype(dtype))
        ours_f = fn or jax_ext.select
        kw: dict[str, Any] = dict(donate_argnums=1) if donate else {}
        return jax.jit(ours_f, **kw), jax.jit(jnp.where, **kw), (c, x, y)

    out = np.broadcast_shapes(n_cond, n_x, n_y)
    item = np.dtype(dtype).itemsize
    size = int(np.prod(out))
    nbytes = int(np.prod(n_cond)) + item * (int(np.prod(n_x)) + int(np.prod(n_y)) + size)
    # 64-bit dtypes exist in jax only with x64 on; without it jnp.asarray would quietly
    # make float32 arrays, and the row would time (and count the bytes of) the wrong dtype.
    return Case(name=name, op="select", dtype=np.dtype(dtype).name, elements=size,
                bytes=nbytes, make=make, chain=donate, x64=item == 8, kind=SINGLE)


def _donated_sparse_case(n: int, p_true: float) -> Case:
    """In-place select the way a masked update is written: x donated, mostly kept."""
    def make() -> Made:
        rng = np.random.default_rng(7)
        c = jnp.asarray(rng.random(n) < p_true)
        x = jnp.asarray(rng.standard_normal(n).astype(np.float32))
        y = jnp.asarray(rng.standard_normal(n).astype(np.float32))
        return (jax.jit(jax_ext.select, donate_argnums=1),
                jax.jit(jnp.where, donate_argnums=1), (c, x, y))

    k = n.bit_length() - 1
    return Case(name=f"select donated {int(p_true * 100)}% true f32 2^{k}", op="select",
                dtype="float32", elements=n, bytes=n + 4 * 3 * n, make=make, chain=True,
                kind=SINGLE)


def select_cases(quick: bool, full: bool = True) -> list[Case]:
    """Every select case (`full`), or the default run's selection: the f32 select at the
    smallest and the largest size, and in place."""
    import ml_dtypes
    if full:
        sizes = [10, 14, 18, 22] if quick else [10, 14, 18, 22, 24]
    else:
        sizes = [10, 22]
    cases = [_select_case(f"select f32 2^{k}", (1 << k,), (1 << k,), (1 << k,), np.float32)
             for k in sizes]
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"
    if full:
        for dt in (ml_dtypes.bfloat16, np.float64, np.int8):
            cases.append(_select_case(f"select {np.dtype(dt).name} {tag}", (big,), (big,),
                                      (big,), dt))
        m, k = (1024, 1024) if quick else (4096, 1024)
        cases.append(_select_case(f"select bcast cond({m},1) x({m},{k}) y(1,{k}) f32",
                                  (m, 1), (m, k), (1, k), np.float32))
    cases.append(_select_case(f"select donated in place f32 {tag}", (big,), (big,), (big,),
                              np.float32, donate=True))
    if full:
        cases.append(_donated_sparse_case(big, 0.9))
        cases.append(_select_case("select 8 elements f32", (8,), (8,), (8,), np.float32))
    return cases
