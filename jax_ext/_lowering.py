"""The one place that builds FFI custom calls, plus the glue the lax fallbacks share."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _compat
from ._native import native_available

mlir = _compat.mlir

# Dtypes narrower than a byte are packed in XLA buffers; the byte-moving kernels do not
# handle them, so they always take the lax path.
_SUB_BYTE = {"int2", "uint2", "int4", "uint4", "float4_e2m1fn"}


def native_dtype_ok(dtype) -> bool:
    return np.dtype(dtype).name not in _SUB_BYTE


def ffi_call(ctx, target: str, operands, *, aliases: dict[int, int] | None = None, **attrs):
    """Lower to the FFI custom call `target`. Attributes are normalized here: the C++
    decoders are strict (an int64 array must arrive as i64), so every integer sequence
    becomes an int64 array, every int an int64 and every bool a bool."""
    typed = {}
    for k, v in attrs.items():
        if isinstance(v, (bool, np.bool_)):
            typed[k] = np.bool_(v)
        elif isinstance(v, (int, np.integer)):
            typed[k] = np.int64(v)
        elif isinstance(v, (tuple, list, np.ndarray)):
            typed[k] = np.asarray(v, dtype=np.int64).reshape(-1)
        else:
            raise TypeError(f"unsupported attribute {k}={v!r}")
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=aliases or None)
    return rule(ctx, *operands, **typed)


def register(prim, lax_impl, native_rule, *, inspects_operands: bool = False):
    """Lowerings for `prim`: `lax_impl` (a jax function of the operands and params) on
    every platform; on CPU `native_rule(ctx, *args, **params)` when the primitive was
    bound with impl="native" and returns non-None, else the lax path.

    `inspects_operands`: the native rule looks at where its operands come from (the
    in-place select asks whether an operand is a donated argument), so it must be lowered
    inline rather than into a shared cached function whose arguments hide that."""
    lax_rule = mlir.lower_fun(lax_impl, multiple_results=prim.multiple_results)

    def cpu_rule(ctx, *args, **params):
        if params.get("impl") == "native" and native_available():
            out = native_rule(ctx, *args, **params)
            if out is not None:
                return out
        return lax_rule(ctx, *args, **params)

    mlir.register_lowering(prim, lax_rule)
    _compat.register_lowering(prim, cpu_rule, platform="cpu", cacheable=not inspects_operands)


def dense_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = acc
        acc *= shape[d]
    return out


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]):
    """Drops size-1 dimensions and merges neighbours that every operand walks through
    contiguously, so the kernel sees the fewest, longest rows. Always rank >= 1."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    sh = [shape[d] for d in keep]
    st = [[s[d] for d in keep] for s in strides]
    i = len(sh) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * sh[i + 1] for s in st):
            sh[i] *= sh[i + 1]
            for s in st:
                s[i] = s[i + 1]
                del s[i + 1]
            del sh[i + 1]
        i -= 1
    if not sh:
        return [1], [[0] for _ in strides]
    return sh, st


# --- bit-exact lax glue -------------------------------------------------------------
# XLA:CPU may rewrite NaN payloads or flush denormals of 16-bit floats moving through
# select/broadcast/gather, even behind a same-width integer bitcast that fusion undoes.
# The lax paths therefore move every value as unsigned bytes: uint8[..., itemsize].

def to_bytes(x):
    """x -> uint8 array of shape x.shape + (itemsize,) (no extra dim for 1-byte types;
    bool stays bool). Complex values become their real and imaginary bytes."""
    dt = np.dtype(x.dtype)
    if dt == np.bool_:
        return x
    if jnp.issubdtype(dt, jnp.complexfloating):
        parts = [lax.bitcast_convert_type(p, jnp.uint8) for p in (lax.real(x), lax.imag(x))]
        return jnp.concatenate(parts, axis=-1)
    return lax.bitcast_convert_type(x, jnp.uint8)


def from_bytes(b, dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return b
    if jnp.issubdtype(dt, jnp.complexfloating):
        half = dt.itemsize // 2
        part_dt = np.float32 if half == 4 else np.float64
        re = lax.bitcast_convert_type(b[..., :half], part_dt)
        im = lax.bitcast_convert_type(b[..., half:], part_dt)
        return lax.complex(re, im)
    return lax.bitcast_convert_type(b, dt)


def extra_byte_dims(dtype) -> int:
    """How many trailing dims to_bytes adds (0 or 1)."""
    dt = np.dtype(dtype)
    return 0 if dt == np.bool_ or dt.itemsize == 1 else 1
