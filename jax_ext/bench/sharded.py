"""Sharded benchmark cases, run by ``python -m jax_ext.bench --devices N`` (N host devices,
a 1-D mesh over axis "x"): jax_ext against the jnp built-ins under the same shardings.

* select: rows sharded with a broadcast row condition; columns sharded with a broadcast
  condition; 1-D, all three operands sharded. Reference ``jnp.where``.
* gather: the index sharded with src replicated; vmap with the batch sharded; src
  sharded along the gathered dim (a row-sharded table), with as many indices as rows
  (jax_ext copies the table there, the cheaper way) and with few (the table stays
  sharded); a training step on a row-sharded table (loss on the gathered rows, SGD
  update, the table's sharding out). Reference ``jnp.take(..., mode="fill",
  fill_value=0)`` under the same shardings; rows are 64 f32 (256 bytes), so
  ``align_bytes=32`` adds no columns and both results agree bit for bit (the training
  step's within rounding: XLA sums jnp's duplicate rows in its own order). The
  row-sharded cases also report each side's per-device temp memory
  (``memory_analysis()``).

Every name starts with "shard", so ``--only shard`` picks exactly these.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._gather import gather
from .._select import where
from . import training
from .records import Case, Made, Shape
from .kinds import SINGLE

_FLAG = "--xla_force_host_platform_device_count"

def P(*axes: str | None) -> PartitionSpec:
    """PartitionSpec, whose constructor jax leaves unannotated."""
    return PartitionSpec(*axes)  # type: ignore[no-untyped-call]  # unannotated in jax


def force_host_devices(n: int, argv: Sequence[str] | None = None) -> None:
    """Makes jax start with `n` CPU devices. XLA reads the flag when jax's backends start;
    if they already have (or the flag did not take), re-executes this process with it."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if not f.startswith(_FLAG))
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={n}".strip()
    if jax.device_count() == n:
        return
    if os.environ.get("JAX_EXT_BENCH_REEXEC"):
        raise SystemExit(f"--devices {n}: jax started with {jax.device_count()} devices")
    os.environ["JAX_EXT_BENCH_REEXEC"] = "1"
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(sys.executable, [sys.executable, "-m", "jax_ext.bench", *args])


def _case(name: str, op: str, dtype: npt.DTypeLike, elements: int, nbytes: int,
          make: Callable[[], Made]) -> Case:
    return Case(name=name, op=op, dtype=np.dtype(dtype).name, elements=int(elements),
                bytes=int(nbytes), make=make, chain=False, kind=SINGLE)


def _put(mesh: Mesh, a: npt.NDArray[Any], spec: PartitionSpec) -> jax.Array:
    out: jax.Array = jax.device_put(a, NamedSharding(mesh, spec))  # typed Any by jax
    return out


def _select(mesh: Mesh, name: str, shapes: tuple[Shape, Shape, Shape],
            specs: tuple[PartitionSpec, ...], seed: int = 0) -> Case:
    (sc, sx, sy) = shapes

    def make() -> Made:
        rng = np.random.default_rng(seed)
        c = rng.integers(0, 2, sc).astype(bool)
        x = rng.standard_normal(sx).astype(np.float32)
        y = rng.standard_normal(sy).astype(np.float32)
        args = tuple(_put(mesh, a, s) for a, s in zip((c, x, y), specs))
        return jax.jit(where), jax.jit(jnp.where), args

    size = int(np.prod(np.broadcast_shapes(sc, sx, sy)))
    nbytes = int(np.prod(sc)) + 4 * (int(np.prod(sx)) + int(np.prod(sy)) + size)
    return _case(name, "select", np.float32, size, nbytes, make)


def _take(s: jax.Array, i: jax.Array) -> jax.Array:
    return jnp.take(s, i, axis=0, mode="fill", fill_value=0)


def _ours(s: jax.Array, i: jax.Array) -> jax.Array:
    return gather(s, [0], 0, i)


def _index(rng: np.random.Generator, rows: int, shape: Shape) -> npt.NDArray[np.int32]:
    idx = rng.integers(0, rows, shape).astype(np.int32)
    flat = idx.reshape(-1)
    past = rng.choice(flat.size, max(1, flat.size // 100), replace=False)
    flat[past] = rows + 3  # a few past the end: padded rows on both sides
    return idx


def _gather(mesh: Mesh, name: str, src_shape: Shape, idx_shape: Shape,
            specs: tuple[PartitionSpec, PartitionSpec], *, batched: bool = False,
            seed: int = 0) -> Case:
    def make() -> Made:
        rng = np.random.default_rng(seed)
        src = rng.standard_normal(src_shape).astype(np.float32)
        idx = _index(rng, src_shape[-2], idx_shape)
        args = (_put(mesh, src, specs[0]), _put(mesh, idx, specs[1]))
        ours, ref = (jax.vmap(_ours), jax.vmap(_take)) if batched else (_ours, _take)
        return jax.jit(ours), jax.jit(ref), args

    n = int(np.prod(idx_shape))
    d = src_shape[-1]
    case = _case(name, "gather", np.float32, n * d, 4 * n + 2 * 4 * n * d, make)
    if specs[0] != P():
        case["device_memory"] = True
    return case


def _step(gather_rows: Callable[[jax.Array, jax.Array], jax.Array]
          ) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """One SGD step of a row-sharded table: a weighted sum of the gathered rows."""
    def step(t: jax.Array, i: jax.Array, w: jax.Array) -> jax.Array:
        g = jax.grad(lambda t: jnp.sum(gather_rows(t, i) * w))(t)
        out: jax.Array = t - 0.01 * g
        return out
    return step


def _train_step(mesh: Mesh, name: str, rows: int, d: int, n: int, seed: int = 0) -> Case:
    def make() -> Made:
        rng = np.random.default_rng(seed)
        t = rng.standard_normal((rows, d)).astype(np.float32)
        idx = _index(rng, rows, (n,))
        w = rng.standard_normal((n, d)).astype(np.float32)
        args = (_put(mesh, t, P("x", None)), _put(mesh, idx, P("x")),
                _put(mesh, w, P("x", None)))
        out = NamedSharding(mesh, P("x", None))
        return (jax.jit(_step(_ours), out_shardings=out),
                jax.jit(_step(_take), out_shardings=out), args)

    case = _case(name, "gather_grad", np.float32, n * d, 4 * (2 * rows * d + 3 * n * d), make)
    case["exact"], case["device_memory"] = False, True
    return case


def cases(quick: bool, devices: int) -> list[Case]:
    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
    tag = f"{devices}dev"
    m, k = (1024, 1024) if quick else (4096, 1024)
    big = 1 << (20 if quick else 22)
    rows, d, n = (65536, 64, 65536) if quick else (262144, 64, 262144)
    few = rows // 32  # a result far smaller than the table
    b = 2 * devices
    return [
        _select(mesh, f"shard select rows ({m},{k}) cond({m},1) {tag}",
                ((m, 1), (m, k), (1, k)), (P("x"), P("x"), P())),
        _select(mesh, f"shard select cols ({m},{k}) cond({m},1) {tag}",
                ((m, 1), (m, k), (1, k)), (P(), P(None, "x"), P(None, "x"))),
        _select(mesh, f"shard select 1-D 2^{big.bit_length() - 1} {tag}",
                ((big,), (big,), (big,)), (P("x"), P("x"), P("x"))),
        _gather(mesh, f"shard gather index ({rows},{d}) n={n} {tag}", (rows, d), (n,),
                (P(), P("x"))),
        _gather(mesh, f"shard vmap gather batch {b}x({rows // b},{d}) {tag}",
                (b, rows // b, d), (b, n // b), (P("x"), P("x")), batched=True),
        _gather(mesh, f"shard gather src rows sharded ({rows},{d}) {tag}", (rows, d), (n,),
                (P("x"), P())),
        _gather(mesh, f"shard gather src rows sharded ({rows},{d}) n={few} {tag}", (rows, d),
                (few,), (P("x"), P("x"))),
        _train_step(mesh, f"shard train step rows sharded ({rows},{d}) n={few} {tag}", rows, d,
                    few),
        _train_step(mesh, f"shard train step rows sharded ({rows},{d}) n={n} {tag}", rows, d, n),
    ] + training.sharded_cases(mesh, tag)
