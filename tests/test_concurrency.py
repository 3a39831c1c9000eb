"""Jitted select and gather called from 4 Python threads at once, many times, each with
its own data: every result correct (issue 4). The native kernels also split work over
XLA's intra-op pool, so this exercises concurrent calls each running parallel chunks."""
import threading
import time

import jax
import numpy as np
import pytest

import jax_ext
from references import assert_bits_equal, np_select, random_values

THREADS = 4
SECONDS = 3.0


@pytest.mark.parametrize("impl", ["native", "lax"])
def test_four_threads_select_and_gather(impl):
    with jax_ext.implementation(impl):
        where = jax.jit(jax_ext.where)
        select = jax.jit(lambda c, x, y: jax_ext.select(c, x, y))
        gather = jax.jit(lambda s, o, i, k, p: jax_ext.gather(s, [o], 0, i, num_indices=k,
                                                               pad_value=p))
    shape = (64, 1031)  # big enough that the kernels split it into parallel chunks
    cases = []
    for t in range(THREADS):
        rng = np.random.default_rng(100 + t)
        c = rng.integers(0, 2, shape).astype(bool)
        x = random_values(rng, shape, np.float32)
        y = random_values(rng, (shape[1],), np.float32)
        src = random_values(rng, (300, 257), np.int16)
        idx = rng.integers(-5, 305, 200).astype(np.int32)
        off, k, pad = int(rng.integers(-3, 4)), int(rng.integers(0, 201)), np.int16(-7 - t)
        from references import ref_gather
        cases.append(dict(
            args=(c, x, y), row=c[:, :1], src=src, off=off, idx=idx, k=k, pad=pad,
            want_where=np_select(c, x, y, shape),
            want_select=np_select(c[:, :1], x, y, shape),
            want_gather=ref_gather(src, [off], 0, idx, num_indices=k, pad_value=pad)))
    # compile once, outside the threads
    jax.block_until_ready(where(*cases[0]["args"]))
    jax.block_until_ready(select(cases[0]["row"], *cases[0]["args"][1:]))
    cs = cases[0]
    jax.block_until_ready(gather(cs["src"], np.int64(cs["off"]), cs["idx"], np.int64(cs["k"]),
                                 cs["pad"]))

    errors, counts = [], [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(t):
        cs = cases[t]
        try:
            start.wait()
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                assert_bits_equal(where(*cs["args"]), cs["want_where"])
                assert_bits_equal(select(cs["row"], *cs["args"][1:]), cs["want_select"])
                got = gather(cs["src"], np.int64(cs["off"]), cs["idx"], np.int64(cs["k"]),
                             cs["pad"])
                assert_bits_equal(got, cs["want_gather"])
                counts[t] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors
    assert all(n >= 3 for n in counts), counts  # every thread really ran many times
