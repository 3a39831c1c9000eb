"""OpenVINO Select-1 and oneDNN Graph Select: the seed documents' examples.

OpenVINO: auto_broadcast "numpy" (the default) or "none"; the condition is broadcast one
way (it never enlarges the result). oneDNN: the same rule, and `then` may serve as the
output: under jit with `then` donated, the result reuses its buffer.
"""
import jax
import jax.numpy as jnp
import numpy as np

import jax_ext

# OpenVINO Select-1's example, in both broadcast modes.
cond = np.array([[False, False], [True, False], [True, True]])
then = np.array([[-1, 0], [1, 2], [3, 4]], np.int32)
else_ = np.array([[11, 10], [9, 8], [7, 6]], np.int32)
for mode in ("numpy", "none"):
    out = jax_ext.select(cond, then, else_, auto_broadcast=mode)
    assert (np.asarray(out) == [[11, 10], [1, 8], [3, 4]]).all(), mode
print("OpenVINO example:", np.asarray(out).tolist())

# oneDNN Graph Select: src0/src1 of shape (2, 3, 4, 5); the condition broadcasts one way.
rng = np.random.default_rng(0)
src0 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
src1 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
for cond_shape in [(4, 5), (3, 1, 5)]:
    c = rng.integers(0, 2, cond_shape).astype(bool)
    out = jax_ext.select(c, src0, src1)
    assert out.shape == (2, 3, 4, 5)
    assert (np.asarray(out) == np.where(np.broadcast_to(c, src0.shape), src0, src1)).all()
for cond_shape in [(3, 5), (2, 2, 3, 4, 5)]:  # would enlarge or misalign: refused
    try:
        jax_ext.select(np.ones(cond_shape, bool), src0, src1)
    except ValueError as e:
        print("oneDNN refuses cond", cond_shape, "->", str(e)[:60], "...")
    else:
        raise AssertionError(f"cond {cond_shape} must be refused")

# oneDNN in place: `then` (src0) donated, the result takes over its buffer. The buffer
# must belong to jax: jnp.array copies src0 into one. jax.device_put(src0) may instead
# share numpy's memory on CPU (it does when the array is 64-byte aligned), and XLA then
# copies a donated buffer before writing to it, since numpy still holds that memory.
c = rng.integers(0, 2, (2, 3, 4, 5)).astype(bool)
want = np.where(c, src0, src1)
inplace = jax.jit(jax_ext.select, donate_argnums=1)
x = jnp.array(src0)
ptr = x.unsafe_buffer_pointer()
out = inplace(c, x, src1)
assert (np.asarray(out) == want).all()
assert out.unsafe_buffer_pointer() == ptr, "the donated then was not reused"
assert x.is_deleted()  # donated: its buffer is the result's now
print("in place:", out.unsafe_buffer_pointer() == ptr)
