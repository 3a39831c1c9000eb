"""The exported select's speed in onnxruntime: ``python -m jax_ext.bench.onnx_export``.

Needs the ``onnx`` extra (jax2onnx, onnxruntime). Each program is exported three times with
jax2onnx and run in onnxruntime's CPU provider on the same numpy inputs:

* ``exact``: jax_ext's program as ``jax_ext.onnx`` exports it by default (the select a
  ``GatherElements`` over the stacked operands: jax_ext's bits);
* ``plain``: the same program exported under ``jax_ext.onnx.plain_where()`` (the select
  onnxruntime's own ``Where``: its bits);
* ``twin``: the program written with ``jnp.where`` and ``jnp.take``, exported by jax2onnx's
  own plugins (a ``Where``).

Calls alternate between the three in every round (so a slow moment of the machine falls on
all three), and the table gives each one's median and its ratio to the twin's. Before
timing, every side's outputs are checked against jax_ext's: the exact export's bits, the
others' values. The programs: a where over 2**20 elements (the condition and ``x`` full,
``y`` a row broadcast along the first dim), in float32 and float16, and an embedding lookup
(rows of a table gathered by ids, then a where with a row mask), 2**20 result elements.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_ext

Program = tuple[str, Callable[..., Any], Callable[..., Any], list[np.ndarray[Any, Any]]]


def programs(quick: bool) -> list[Program]:
    """(name, jax_ext's function, the jnp twin, the inputs) for every program."""
    rng = np.random.default_rng(0)
    rows, cols = (64, 64) if quick else (1024, 1024)
    out: list[Program] = []
    for dt in (np.float32, np.float16):
        c = rng.integers(0, 2, (rows, cols)).astype(bool)
        x = rng.standard_normal((rows, cols)).astype(dt)
        y = rng.standard_normal((1, cols)).astype(dt)
        out.append((f"where {rows * cols} elements {np.dtype(dt).name}",
                    lambda c, x, y: jax_ext.where(c, x, y),
                    lambda c, x, y: jnp.where(c, x, y), [c, x, y]))
    vocab, dim, n = (512, 16, 256) if quick else (32768, 64, 16384)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = rng.integers(0, vocab, n).astype(np.int32)
    mask = rng.integers(0, 2, n).astype(bool)
    out.append((f"embedding {n}x{dim} + where float32",
                lambda t, i, m: jax_ext.where(
                    m[:, None], jax_ext.gather(t, [0], 0, i, align_bytes=None), np.float32(0)),
                lambda t, i, m: jnp.where(m[:, None], jnp.take(t, i, axis=0), np.float32(0)),
                [table, ids, mask]))
    return out


def _session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _export(fn: Callable[..., Any], args: Sequence[np.ndarray[Any, Any]], plain: bool) -> Any:
    from jax2onnx import to_onnx

    import jax_ext.onnx

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype)  # type: ignore[no-untyped-call]
             for a in args]
    with jax_ext.onnx.plain_where() if plain else contextlib.nullcontext():
        return to_onnx(fn, specs)


def measure(prog: Program, rounds: int, threads: int) -> dict[str, Any]:
    """Medians (seconds) of the three sides, alternating, after checking their outputs."""
    name, fn, twin, args = prog
    sessions = {"exact": _session(_export(fn, args, False), threads),
                "plain": _session(_export(fn, args, True), threads),
                "twin": _session(_export(twin, args, False), threads)}
    want = np.asarray(fn(*args))
    for side, sess in sessions.items():
        feed = dict(zip([i.name for i in sess.get_inputs()], args))
        (got,) = sess.run(None, feed)
        if side == "exact" and got.tobytes() != want.tobytes():
            raise AssertionError(f"{name}: the exact export's bits differ from jax_ext's")
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: {side}")
    feeds = {side: dict(zip([i.name for i in s.get_inputs()], args))
             for side, s in sessions.items()}
    times: dict[str, list[float]] = {side: [] for side in sessions}
    for _ in range(rounds):
        for side, sess in sessions.items():
            t = time.perf_counter()
            sess.run(None, feeds[side])
            times[side].append(time.perf_counter() - t)
    return {"name": name} | {side: statistics.median(t) for side, t in times.items()}


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| program | twin `Where` (ms) | exact (ms) | exact / twin | plain_where (ms) "
             "| plain / twin |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['twin'] * 1e3:.2f} | {r['exact'] * 1e3:.2f} | "
                     f"{r['exact'] / r['twin']:.2f}x | {r['plain'] * 1e3:.2f} | "
                     f"{r['plain'] / r['twin']:.2f}x |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jax_ext.bench.onnx_export",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=41, help="calls per side (default 41)")
    p.add_argument("--threads", type=int, default=1,
                   help="onnxruntime's intra-op threads (default 1; 0: its own default)")
    p.add_argument("--quick", action="store_true", help="small arrays, for a smoke test")
    a = p.parse_args(argv)
    import onnxruntime

    rows = [measure(prog, a.rounds, a.threads) for prog in programs(a.quick)]
    print(f"onnxruntime {onnxruntime.__version__}, CPU provider, {a.threads or 'default'} "
          f"intra-op thread(s); medians of {a.rounds} alternating calls per side")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
