"""Big buffers (issue 4): a gather from an int8 source larger than 2**31 bytes reading rows
past that offset, and a select over more than 2**31 elements with a broadcast
condition. Slow and memory hungry (peak about 9 GiB): run with `pytest --run-slow`.

The operands are built on the device from iotas (no host copy), and results are checked
at sampled positions against a closed form instead of a full numpy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_ext

pytestmark = pytest.mark.slow

ROW = 1 << 19          # int8 columns per row: 512 KiB
ROWS = 4096 + 3        # 4096 rows is exactly 2**31 bytes; rows 4096.. lie past it


def _src_value(r, c):
    return ((np.asarray(r, np.int64) * 7 + np.asarray(c, np.int64) * 3) % 256).astype(
        np.uint8).view(np.int8)


@pytest.mark.parametrize("impl", ["native", "lax"])
def test_gather_int8_source_past_2_31_bytes(impl):
    src = jax.jit(lambda: (lax.broadcasted_iota(jnp.int32, (ROWS, ROW), 0) * 7
                           + lax.broadcasted_iota(jnp.int32, (ROWS, ROW), 1) * 3
                           ).astype(jnp.uint8).view(jnp.int8))()
    assert src.nbytes > 2 ** 31
    index = np.array([4096, 4098, 0, 4095, 4099, -1, 4097, 2048], np.int64)
    with jax_ext.implementation(impl):
        f = jax.jit(lambda s, i, o: jax_ext.gather(s, [o], 0, i, pad_value=-5, align_bytes=None))
        got = np.asarray(f(src, index, np.int64(0)))
        # the same rows reached through a large offset instead of a large index
        got2 = np.asarray(f(src, index - 4000, np.int64(4000)))
    del src
    cols = np.arange(ROW)
    for i, r in enumerate(index):
        want = _src_value(r, cols) if 0 <= r < ROWS else np.full(ROW, -5, np.int8)
        np.testing.assert_array_equal(got[i], want, err_msg=f"row {i} (src row {r})")
    np.testing.assert_array_equal(got2, got)


@pytest.mark.parametrize("impl", ["native", "lax"])
def test_select_more_than_2_31_elements_broadcast_condition(impl):
    rows, cols = (1 << 15) + 3, 1 << 16  # 2**31 + 196608 uint8 elements
    x = jax.jit(lambda: (lax.broadcasted_iota(jnp.uint32, (rows, cols), 0) * 5
                         + lax.broadcasted_iota(jnp.uint32, (rows, cols), 1)
                         ).astype(jnp.uint8))()
    assert x.size > 2 ** 31
    cond = np.asarray((np.arange(cols) % 3) == 1)       # broadcast over every row
    with jax_ext.implementation(impl):
        out = jax.jit(lambda c, x: jax_ext.where(c, x, np.uint8(200)))(cond, x)
    del x
    assert out.shape == (rows, cols) and out.dtype == np.uint8
    rs = np.array([0, 1, 12345, (1 << 15) - 1, 1 << 15, rows - 1])
    cs = np.array([0, 1, 2, 4, 32767, cols - 2, cols - 1])
    got = np.asarray(out[rs][:, cs])
    want = np.where(cond[cs][None, :],
                    ((rs[:, None] * 5 + cs[None, :]) % 256).astype(np.uint8), np.uint8(200))
    np.testing.assert_array_equal(got, want)
    # the very last elements, past 2**31 in linear order
    tail = np.asarray(out.reshape(-1)[-70000:])
    lin = np.arange(rows * cols - 70000, rows * cols, dtype=np.int64)
    r, c = lin // cols, lin % cols
    np.testing.assert_array_equal(
        tail, np.where(cond[c], ((r * 5 + c) % 256).astype(np.uint8), np.uint8(200)))
