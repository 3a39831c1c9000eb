"""Benchmark cases for gather, called from jax_ext.bench (same table/JSON/plot).

Each case: ``make()`` returns (ours, reference, args), both already ``jax.jit``-ed and
taking ``*args``; ``bytes`` counts the bytes read and written (index included), for GB/s.

* gather of random rows, about 1% of the indices past the end (so both sides pad them
  with 0), against ``jnp.take(src, index, axis=0, mode="fill", fill_value=0)``. The f32
  rows used (128, 64, 16, 8 elements) are multiples of 32 bytes, so the default
  ``align_bytes=32`` adds no columns and both results have one shape and equal bits.
  n = min(65536, src rows) indices (16384 with ``quick``).
* the gradient with respect to src of ``sum(gather(src) * ct)`` against the same for
  ``jnp.take`` (XLA's scatter-add): src 65536x128 with 65536 indices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._gather import gather


def _index(rng, rows, n):
    idx = rng.integers(0, rows, n).astype(np.int32)
    past = rng.choice(n, max(1, n // 100), replace=False)
    idx[past] = rows + rng.integers(0, 8, past.size)  # a few past the end: padded rows
    return idx


def _gather_case(rows, cols, n, seed=0):
    item = 4

    def make():
        rng = np.random.default_rng(seed)
        src = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
        idx = jnp.asarray(_index(rng, rows, n))
        ours = jax.jit(lambda s, i: gather(s, [0], 0, i))
        ref = jax.jit(lambda s, i: jnp.take(s, i, axis=0, mode="fill", fill_value=0))
        return ours, ref, (src, idx)

    return dict(name=f"gather f32 {rows}x{cols} n={n}", op="gather", dtype="float32",
                elements=n * cols, bytes=2 * n * cols * item + 4 * n, make=make, chain=False)


def _grad_case(rows, cols, n, seed=1):
    item = 4

    def make():
        rng = np.random.default_rng(seed)
        src = jnp.asarray(rng.standard_normal((rows, cols)).astype(np.float32))
        idx = jnp.asarray(_index(rng, rows, n))
        ct = jnp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
        ours = jax.jit(jax.grad(lambda s, i, c: jnp.sum(gather(s, [0], 0, i) * c)))
        ref = jax.jit(jax.grad(lambda s, i, c: jnp.sum(
            jnp.take(s, i, axis=0, mode="fill", fill_value=0) * c)))
        return ours, ref, (src, idx, ct)

    # reads the cotangent rows, writes (zeroes, then adds into) the src-shaped result
    return dict(name=f"gather grad f32 {rows}x{cols} n={n}", op="gather_grad", dtype="float32",
                elements=rows * cols, bytes=n * cols * item + 4 * n + 2 * rows * cols * item,
                make=make, chain=False)


def cases(quick: bool) -> list[dict]:
    if quick:
        shapes = [(65536, 128), (16384, 64), (262144, 16), (4096, 8)]
        n_max, grad = 16384, (16384, 128, 16384)
    else:
        shapes = [(262144, 128), (65536, 64), (1048576, 16), (4096, 8)]
        n_max, grad = 65536, (65536, 128, 65536)
    out = [_gather_case(r, c, min(n_max, r)) for r, c in shapes]
    out.append(_grad_case(*grad))
    return out
