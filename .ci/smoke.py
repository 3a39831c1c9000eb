"""A smoke test of an installed wheel: every op on every path equals numpy bit for bit.

Run with ``python -P .ci/smoke.py`` (``-P``: import the installed package, not a source
folder). It needs only jax_ext, jax and numpy, so it runs where the test suite's tools are
not installed, for example under emulation on another architecture (.ci/aarch64-smoke.sh).
It fails unless the native module loaded and registered (``native_available()``), and on
the native path it checks that the lowered program calls the native kernel, so that a
silent fall back to lax cannot pass for the kernel.
"""
from __future__ import annotations

import platform
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp
import jax_ext

PATHS = ("native", "lax", "auto")


def same_bits(got: object, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    if want.dtype == np.bool_:
        ok = np.array_equal(got, want)
    else:
        v = np.dtype(f"u{want.dtype.itemsize}") if want.dtype.itemsize in (1, 2, 4, 8) else None
        ok = np.array_equal(got.view(v), want.view(v)) if v else got.tobytes() == want.tobytes()
    assert ok, f"{what}: the bits differ from numpy's"


def calls_native(fn, *args) -> bool:
    """Whether fn, lowered for CPU, calls one of jax_ext's native targets."""
    text = jax.jit(fn).lower(*args).as_text()
    return any(t in text for t in jax_ext._TARGETS)


def floats(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values with the bit patterns a select must not touch: NaN payloads, -0.0."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = -0.0
    flat[3::11] = np.uint32(0x7FC00123).view(np.float32)  # a quiet NaN with a payload
    flat[5::13] = np.uint32(0xFFA00001).view(np.float32)  # a signalling NaN, sign set
    return x


def ref_gather(src: np.ndarray, start: int, index: np.ndarray, pad: float, L: int,
               num: int | None = None) -> np.ndarray:
    """Rows start + index[i] of a 2-D src, padded to L columns; out-of-range rows are pad."""
    n = len(index)
    k = n if num is None else num
    out = np.full((n, L), pad, src.dtype)
    for i in range(k):
        r = start + int(index[i])
        if 0 <= r < src.shape[0]:
            out[i, :src.shape[1]] = src[r]
    return out


def main() -> None:
    t0 = time.perf_counter()
    print(f"smoke: {platform.machine()}, Python {sys.version.split()[0]}, jax {jax.__version__}, "
          f"jax_ext {jax_ext.__version__} from {jax_ext.__file__}")
    assert jax_ext.native_available(), jax_ext.native_error()
    rng = np.random.default_rng(0)
    checks = 0

    # Small shapes (one thread, the kernels' edges) and a 16 MiB one (threads, big stores).
    for shape in [(7, 5), (1024, 4096)]:
        x, y = floats(rng, shape), floats(rng, shape)
        c = rng.random(shape) < 0.5
        row = rng.random((shape[0], 1)) < 0.5
        rowvec = row[:, 0]
        ops = [
            ("select elementwise", lambda c, x, y: jax_ext.select(c, x, y), (c, x, y),
             np.where(c, x, y)),
            ("select row-broadcast", lambda c, x, y: jax_ext.select(c, x, y), (row, x, y),
             np.where(row, x, y)),
            ("where scalar y", lambda c, x: jax_ext.where(c, x, np.float32(-0.0)), (c, x),
             np.where(c, x, np.float32(-0.0))),
            ("where3 elementwise", lambda c, x, y: jax_ext.where3(c, x, y), (c, x, y),
             np.where(c, x, y)),
            ("where3 rows", lambda c, x, y: jax_ext.where3(c, x, y), (rowvec, x, y),
             np.where(rowvec[:, None], x, y)),
        ]
        for name, fn, args, want in ops:
            for p in PATHS:
                with jax_ext.implementation(p):
                    same_bits(jax.jit(fn)(*args), want, f"{name} {shape} [{p}]")
                    if p == "native":
                        assert calls_native(fn, *args), f"{name} {shape}: no native call"
                checks += 1

    # gather: 5 columns padded to 8 (32 bytes of float32), rows out of range on both sides,
    # num_indices cutting the tail, a large table for the threaded path; and its gradient.
    for rows, cols, n in [(10, 5, 6), (4096, 300, 3000)]:
        src = floats(rng, (rows, cols))
        index = rng.integers(-3, rows + 3, n).astype(np.int32)
        index[:2] = [-1, rows]  # one row before, one past the end
        L = -(-cols // 8) * 8
        for num in (None, n - 2):
            want = ref_gather(src, 1, index, -1.5, L, num)
            fn = lambda s, i: jax_ext.gather(s, [1], 0, i, num_indices=num, pad_value=-1.5)
            for p in PATHS:
                with jax_ext.implementation(p):
                    same_bits(jax.jit(fn)(src, index), want, f"gather {rows}x{cols} [{p}]")
                    if p == "native":
                        assert calls_native(fn, src, index), "gather: no native call"
                checks += 1
        # The gradient: a scatter-add of the cotangent rows into src (duplicates add in
        # index order), against numpy's np.add.at in the same order.
        ct = floats(rng, (n, L))
        ct[~np.isfinite(ct)] = 0.25
        ok = (index + 1 >= 0) & (index + 1 < rows)
        want = np.zeros_like(src)
        np.add.at(want, index[ok] + 1, ct[ok, :cols])
        grad = jax.grad(lambda s: jnp.sum(jax_ext.gather(s, [1], 0, index) * ct))
        for p in PATHS:
            with jax_ext.implementation(p):
                same_bits(jax.jit(grad)(src), want, f"grad gather {rows}x{cols} [{p}]")
            checks += 1
    print(f"smoke: {checks} checks passed (native, lax, auto) in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
