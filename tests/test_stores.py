"""The kernels' two ways of writing a large result, each reached on purpose and checked bit
for bit: regular stores into a result the kernel has just mapped as huge pages (a fresh
mapping, glibc's default for 32 MiB and more), streaming stores into a result the
allocator reuses (select and gather from 64 MiB, scatter-add from 16 MiB). Each regime runs
in a child process whose glibc settings force it, and the child's page faults show that
the regime was the one intended."""
import os
import subprocess
import sys

import pytest

import jax_ext

CHILD = r"""
import resource, sys
import numpy as np, jax, jax.numpy as jnp, jax_ext

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def run(f, want, *args):
    # A first call compiles, and leaves a freed result of the same size: under the
    # "reused" settings glibc hands such memory to later calls (not always: the heap can
    # grow instead), by default it unmaps it and every result is a fresh mapping. Every
    # call's bits are checked; the faults of each are returned.
    jax.block_until_ready(args)
    jax.block_until_ready(f(*args))
    fls = []
    for _ in range(3):
        f0 = faults()
        out = jax.block_until_ready(f(*args))
        fls.append(faults() - f0)
        assert np.asarray(out).tobytes() == want.tobytes()
        del out
    return fls

rng = np.random.default_rng(5)

def bits(shape, dtype):
    # Random bytes (NaN payloads included: a select only moves them); drawing normals for
    # tens of millions of elements would take most of the test's time.
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)

with jax_ext.implementation("native"):
    for dtype in (np.int8, np.float16, np.float32, np.complex64):  # widths 1, 2, 4, 8
        # a length that leaves a partial 4 KiB tile; dense, broadcast, scalar and
        # row-wise conditions
        n = (65 << 20) // np.dtype(dtype).itemsize + 13
        m = n // 1000
        fls = []
        for sc, sx, sy in [((n,), (n,), (n,)), ((m, 1), (m, 1000), (1, 1000)),
                           ((), (n,), (n,)), ((m, 1000), (m, 1000), (1000,))]:
            c = rng.integers(0, 2, sc, dtype=np.uint8).view(bool)
            x, y = bits(sx, dtype), bits(sy, dtype)
            args = tuple(jnp.asarray(a) for a in (c, x, y))
            fls += run(jax.jit(jax_ext.select), np.where(c, x, y), *args)
            del args
        print("select", np.dtype(dtype).name, min(fls), max(fls))

    src = bits((4096, 1024), np.float32)                        # 4 KiB rows
    idx = rng.integers(-3, 4100, 16640).astype(np.int32)         # 65 MiB of result
    f = jax.jit(lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=-0.0, align_bytes=None))
    ok = (idx >= 0) & (idx < 4096)
    want = np.where(ok[:, None], src[np.clip(idx, 0, 4095)], np.float32(-0.0))
    fls = run(f, want, jnp.asarray(src), jnp.asarray(idx))
    print("gather float32", min(fls), max(fls))

    rows, cols = 33 << 10, 256                  # a 33 MiB scatter-add result
    perm = rng.permutation(rows)[: rows // 2].astype(np.int32)  # each row reached once
    ct = rng.standard_normal((perm.size, cols)).astype(np.float32)
    t = jnp.zeros((rows, cols), jnp.float32)
    f = jax.jit(lambda t, i, c: jax.vjp(
        lambda s: jax_ext.gather(s, [0], 0, i, align_bytes=None), t)[1](c)[0])
    want = np.zeros((rows, cols), np.float32)
    want[perm] = ct
    fls = run(f, want, t, jnp.asarray(perm), jnp.asarray(ct))
    print("scatter_add float32", min(fls), max(fls))
"""


@pytest.mark.skipif(not jax_ext.native_available(), reason="the kernels' stores")
@pytest.mark.parametrize("regime", ["fresh", "reused"])
def test_large_results_are_exact_with_either_store(regime, tmp_path):
    # (conftest puts this jax_ext first on the children's PYTHONPATH; -P and a directory
    # of its own keep a clone's unbuilt source tree off the child's sys.path)
    env = dict(os.environ)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(k, None)
    if regime == "reused":  # glibc keeps every block on its heap, for reuse
        env.update(MALLOC_MMAP_THRESHOLD_="4294967296", MALLOC_TRIM_THRESHOLD_="8589934592")
    r = subprocess.run([sys.executable, "-P", "-c", CHILD], capture_output=True, text=True,
                       env=env, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln.split() for ln in r.stdout.splitlines()]
    assert len(lines) == 6, r.stdout
    if os.environ.get("JAX_EXT_EXPECT_SANITIZED"):
        return  # ASan's allocator replaces glibc's: the bits were checked, the regimes
        # (which glibc's settings and page behaviour set up) do not apply
    for op, dtype, least, most in lines:
        if regime == "fresh":
            # mapped by the kernel as huge pages: from one fault per 2 MiB (16 or more),
            # far fewer than one per 4 KiB page (16640)
            assert 16 <= int(least) and int(most) < 4096, (op, dtype, least, most)
        else:
            # at least one call found its result's pages resident (a fresh result faults
            # 16 times or more): the kernel saw a reused buffer and streamed
            assert int(least) < 16, (op, dtype, least, most)
