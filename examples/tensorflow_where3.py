"""TensorFlow Where3 (the legacy Select): the seed's two examples, and the scalar mode."""
import numpy as np

import jax_ext

t = np.array([[1, 2], [3, 4]], np.int32)
e = np.array([[5, 6], [7, 8]], np.int32)

# Element-wise: the condition has x's shape.
out = jax_ext.where3(np.array([[True, False], [False, True]]), t, e)
assert np.asarray(out).tolist() == [[1, 6], [7, 4]]
print("element-wise:", np.asarray(out).tolist())

# Row mode: a vector condition of length x.shape[0] picks whole rows.
out = jax_ext.where3(np.array([True, False]), t, e)
assert np.asarray(out).tolist() == [[1, 2], [7, 8]]
print("rows:        ", np.asarray(out).tolist())

# A scalar condition picks all of x or all of y.
out = jax_ext.where3(np.array(False), t, e)
assert np.asarray(out).tolist() == [[5, 6], [7, 8]]
print("scalar:      ", np.asarray(out).tolist())
