"""Quick start: select and gather, checked against numpy (as in the README's usage section)."""
import numpy as np

import jax_ext

print("native module:", jax_ext.native_available())  # True: the C++ handlers run on CPU

cond = np.array([[False, False], [True, False], [True, True]])
then = np.array([[-1, 0], [1, 2], [3, 4]], np.int32)
else_ = np.array([[11, 10], [9, 8], [7, 6]], np.int32)
out = jax_ext.select(cond, then, else_)  # OpenVINO Select-1: cond ? then : else_
assert (np.asarray(out) == [[11, 10], [1, 8], [3, 4]]).all()

src = np.arange(256, dtype=np.int32).reshape(32, 8)
rows = jax_ext.gather(src, [0], 0, np.arange(0, 32, 2))  # Ascend gather: every other row
assert (np.asarray(rows) == src[::2]).all()
print(out, rows.shape, sep="\n")
