"""Ascend asctile.gather: the seed's examples, then offsets, bounds and padding."""
import numpy as np

import jax_ext

# "Read full rows by outermost dimension": src (1024, 128), 256 rows -> tile (256, 128).
rng = np.random.default_rng(0)
src = rng.standard_normal((1024, 128)).astype(np.float32)
index = rng.integers(0, 1024, 256).astype(np.int32)
tile = jax_ext.gather(src, [0], 0, index)
assert tile.shape == (256, 128) and (np.asarray(tile) == src[index]).all()

# "Read every other row": src (32, 8) holding 0..255, index [0, 2, ..., 30] -> (16, 8).
ints = np.arange(256, dtype=np.int32).reshape(32, 8)
tile = jax_ext.gather(ints, [0], 0, np.arange(0, 32, 2, dtype=np.int32))
assert tile.shape == (16, 8) and (np.asarray(tile) == ints[::2]).all()
print(np.asarray(tile)[[0, 1, -1]].tolist())  # rows 0, 2, ..., 30 of src

# Offsets and a deeper dim: rows of src3[1, 2 + index[i], :].
src3 = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
rows = jax_ext.gather(src3, [1, 2], 1, np.array([0, 3, 9]), pad_value=-1.0, align_bytes=None)
# index 9 -> row 11 lies outside src3 (6 rows): check_bounds=True fills it with pad_value.
assert np.asarray(rows).tolist() == [src3[1, 2].tolist(), src3[1, 5].tolist(), [-1.0] * 3]

# align_bytes: 3 float32 columns (12 bytes) are padded to 8 columns (32 bytes).
padded = jax_ext.gather(src3, [0], 0, np.array([1]), pad_value=0.5)
assert padded.shape == (1, 6, 8) and (np.asarray(padded)[..., 3:] == 0.5).all()
print("padded shape:", padded.shape)
