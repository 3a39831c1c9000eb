"""What the tests share: dtype lists, random and special bit patterns, the bitwise
comparison, and the independent references (numpy on raw bytes, plain Python loops) that
results are checked against. Test modules import this one, never each other."""
import itertools

import ml_dtypes
import numpy as np

ALL_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
              np.uint64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.float16,
              ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128]
INDEX_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
GRAD_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
               np.complex128]
FLOAT_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
                np.complex128]
# The packed dtypes jax holds as arrays at both ends of the window, gathered on every path
# (always through lax): every one jax has but int1/uint1, which jax cannot move onto a
# device from numpy, and the 6-bit floats (jax 0.11+), which gather refuses
# (tests/test_gather.py::test_what_jax_has_of_sub_byte_dtypes pins both).
SUB_BYTE_DTYPES = [ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4, ml_dtypes.uint4,
                   ml_dtypes.float4_e2m1fn]
# Every test parametrized over IMPLS runs all three: the kernels, the lax path (what other
# platforms and fused call sites run) and auto (the default, which picks per call site).
IMPLS = ["native", "lax", "auto"]
# For property tests that run many examples: each example takes the next pair of IMPLS
# (native+lax, lax+auto, auto+native), so every pair is compared and each implementation
# meets two thirds of the examples, at two compilations an example.
IMPL_PAIRS = itertools.cycle([(IMPLS[k], IMPLS[(k + 1) % len(IMPLS)])
                              for k in range(len(IMPLS))])


def bit_width(dtype):
    """The bits of one element: fewer than 8 for the packed dtypes (float4_e2m1fn: 4)."""
    import jax.numpy as jnp
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.finfo(dtype).bits
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits
    return 8 * dtype.itemsize


def random_values(rng, shape, dtype):
    """Random bit patterns: NaNs with payloads, signalling NaNs, -0.0, inf, denormals. A
    packed dtype's codes (each in a byte of its own, as numpy holds them) every one in
    turn where the shape has room, in random order."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if bit_width(dtype) < 8:
        codes = np.resize(rng.permutation(2 ** bit_width(dtype)), int(np.prod(shape)))
        return codes.astype(np.uint8).view(dtype).reshape(shape)
    raw = rng.integers(0, 256, size=tuple(shape) + (dtype.itemsize,), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def special_values(dtype, n):
    """-0.0, +-inf, a quiet NaN with payload and a signalling NaN, repeated to length n."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 1 or (dtype.kind not in "fc" and dtype != np.dtype(ml_dtypes.bfloat16)):
        return None  # 1-byte types: random bytes already cover every pattern
    w = dtype.itemsize if dtype.kind != "c" else dtype.itemsize // 2
    bits = {2: [0x8000, 0x7C00, 0xFC00, 0x7E01, 0x7C01], 4: [0x80000000, 0x7F800000, 0xFF800000,
            0x7FC00123, 0x7F800001], 8: [1 << 63, 0x7FF0 << 48, 0xFFF0 << 48,
            (0x7FF8 << 48) | 0x1234, (0x7FF0 << 48) | 1]}[w]
    if dtype == np.dtype(ml_dtypes.bfloat16):
        bits = [0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x7F81]
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
    m = n * (2 if dtype.kind == "c" else 1)  # complex: real and imaginary parts
    vals = np.array((bits * (m // len(bits) + 1))[:m], dtype=u)
    return vals.view(dtype)


def bits(a):
    """Bytes of an array, for bit-for-bit comparison."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.reshape(-1).view(np.uint8), a.shape, a.dtype


def bits_equal(got, want) -> bool:
    """Same shape, dtype and bytes."""
    g, gs, gd = bits(got)
    w, ws, wd = bits(want)
    return gs == ws and gd == wd and np.array_equal(g, w)


def assert_bits_equal(got, want):
    g, gs, gd = bits(got)
    w, ws, wd = bits(want)
    assert gs == ws, f"shape {gs} != {ws}"
    assert gd == wd, f"dtype {gd} != {wd}"
    if not np.array_equal(g, w):
        size = max(gd.itemsize, 1)
        bad = np.unique(np.nonzero(g != w)[0] // size)
        hexes = lambda b: " ".join(  # noqa: E731  (little-endian: most significant first)
            "0x" + b[k * size:(k + 1) * size][::-1].tobytes().hex() for k in bad[:6])
        raise AssertionError(f"bits differ in {bad.size} of {g.size // size} elements, first "
                             f"at flat indices {bad[:6].tolist()}: got {hexes(g)}, "
                             f"want {hexes(w)}")


def np_select(cond, x, y, shape):
    """Reference: numpy on the raw bytes, so nothing canonicalizes NaNs."""
    x, y = np.asarray(x), np.asarray(y)
    dt = x.dtype
    if dt == np.bool_:
        return np.where(np.broadcast_to(cond, shape), np.broadcast_to(x, shape),
                        np.broadcast_to(y, shape))
    ub = np.dtype(f"V{dt.itemsize}")
    xb, yb = x.view(ub), y.view(ub)
    out = np.where(np.broadcast_to(cond, shape), np.broadcast_to(xb, shape),
                   np.broadcast_to(yb, shape))
    return np.ascontiguousarray(out).view(dt)


def hlo(fn, *args):
    """StableHLO text of jit(fn). Under the default "auto" it lowers with "native": these
    tests check the native lowering's structure (auto's own choices: tests/test_auto.py)."""
    import jax
    import jax_ext
    from jax_ext import _config
    if _config.current() == "auto":
        with jax_ext.implementation("native"):
            return jax.jit(fn).lower(*args).as_text()
    return jax.jit(fn).lower(*args).as_text()


# --- gather: a plain loop over Python ints -------------------------------------------

def row_len(last, itemsize, align):
    if align is None:
        return last
    return -(-last * itemsize // align) * align // itemsize


def ref_gather(src, offsets, dim, index, *, check_bounds=True, num_indices=None, pad_value=None,
               align_bytes=32):
    """A plain loop over Python ints, copying raw bytes (no NaN canonicalization)."""
    src = np.asarray(src)
    dt = src.dtype
    offsets = [int(o) for o in offsets]
    index = [int(i) for i in np.asarray(index)]
    n = len(index)
    k = n if num_indices is None else min(max(int(num_indices), 0), n)
    pad = np.zeros((), dt) if pad_value is None else np.asarray(pad_value).astype(dt)
    L = row_len(src.shape[-1], dt.itemsize, align_bytes)
    V = np.dtype(f"V{dt.itemsize}")
    sv = src.view(V) if dt != np.bool_ else src
    out = np.empty((n,) + src.shape[dim + 1:-1] + (L,), sv.dtype)
    out[...] = pad.reshape(1).view(V)[0] if dt != np.bool_ else pad
    for i in range(k):
        pos = offsets[:dim] + [offsets[dim] + index[i]]
        if check_bounds:
            if not all(0 <= p < s for p, s in zip(pos, src.shape)):
                continue
        else:
            if any(s == 0 for s in src.shape[:dim + 1]):
                continue
            pos = [min(max(p, 0), s - 1) for p, s in zip(pos, src.shape)]
        out[i, ..., :src.shape[-1]] = sv[tuple(pos)]
    return out.view(dt) if dt != np.bool_ else out


def ref_rows(src_shape, offsets, dim, index, check_bounds=True, num_indices=None):
    """(i, position) of every row that gathers real data."""
    index = [int(i) for i in np.asarray(index)]
    k = len(index) if num_indices is None else min(max(int(num_indices), 0), len(index))
    out = []
    for i in range(k):
        pos = [int(o) for o in offsets[:dim]] + [int(offsets[dim]) + index[i]]
        if check_bounds:
            if not all(0 <= p < s for p, s in zip(pos, src_shape)):
                continue
        else:
            pos = [min(max(p, 0), s - 1) for p, s in zip(pos, src_shape)]
        out.append((i, tuple(pos)))
    return out


def ref_touched(table_shape, offsets, dim, index, grads, num_indices=None):
    """update_rows' rows and their gradient sums, by a plain loop: (the distinct rows read,
    as positions, in order of first occurrence; per row the sum of its grads rows, +0.0
    first, in index order, formed in float32 for 16-bit and 8-bit floats and rounded once,
    as gather's transpose sums them). Out-of-range rows are no rows, whatever a gather's
    check_bounds would do with them."""
    grads = np.asarray(grads)
    dt = grads.dtype
    acc = np.float32 if dt.itemsize < 4 else dt
    last = table_shape[-1]
    order, sums = [], {}
    for i, pos in ref_rows(table_shape, offsets, dim, index, True, num_indices):
        if pos not in sums:
            order.append(pos)
            sums[pos] = np.zeros(grads.shape[1:-1] + (last,), acc)
        sums[pos] = (sums[pos] + grads[i, ..., :last].astype(acc)).astype(acc)
    return order, {p: v.astype(dt) for p, v in sums.items()}


# --- checks run in child processes (tests/*_checks.py), asserted by their parents ------

def recorder(results):
    """`check(name)` for a child's checks: a decorator that runs the function at once and
    records under `name` in `results` what it returned, with ok=True, or ok=False and the
    exception with its traceback; the parent test reads the records and asserts them."""
    import traceback

    def check(name):
        def deco(fn):
            try:
                rec = fn() or {}
                rec.setdefault("ok", True)
            except Exception as e:  # recorded, asserted by the parent
                rec = {"ok": False,
                       "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            results[name] = rec
            return fn
        return deco
    return check


# --- the sharding matrix (run by tests/sharding_checks.py in child processes) ---------

# Each check runs under every implementation on each kind of mesh and must give numpy's
# bits; see each check in sharding_checks.py for its collective rule.
SHARDING_MATRIX = [
    "select_batch_sharded", "where_scalar_sharded", "vmap_select_batch_sharded",
    "gather_index_sharded", "gather_rows_sharded_exact", "vmap_gather_batch_sharded",
    "grad_vmap_gather_batch_sharded", "grad_gather_rows_sharded", "grad_gather_index_sharded",
    "grad_select_batch_sharded",
    # uneven shards: lengths the mesh does not divide
    "gather_index_uneven", "grad_gather_index_uneven", "gather_rows_uneven",
    "grad_gather_rows_uneven", "vmap_gather_batch_uneven", "grad_vmap_gather_batch_uneven",
    "select_batch_uneven",
    # packed dtypes (every code of each of SUB_BYTE_DTYPES; float4's gradient)
    "subbyte_gather_rows_sharded", "subbyte_gather_index_sharded",
    "subbyte_vmap_gather_batch_sharded", "subbyte_gather_rows_uneven",
    "grad_float4_gather_rows_sharded",
]
MESH_KINDS = ["auto", "explicit", "explicit_noset"]  # sharding_checks.KINDS


def package_modules():
    """{dotted module name: path} of every Python file of the jax_ext source tree."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    for d, _, files in os.walk(os.path.join(root, "jax_ext")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def import_base(node, pkg):
    """The absolute module a `from ... import` node names, written in package `pkg`."""
    base = node.module or ""
    if node.level:
        parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return base


def _extras_requirements():
    """Every requirement of pyproject.toml's extras, parsed (packaging comes with pytest)."""
    import pathlib
    import tomllib

    from packaging.requirements import Requirement
    root = pathlib.Path(__file__).resolve().parent.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    return [Requirement(r) for reqs in extras.values() for r in reqs]


def left_out(dist):
    """The environment marker by which pyproject.toml's extras leave the optional dependency
    `dist` out on this Python (no wheel for it, or for what it needs, here), or None where
    they install it."""
    reqs = [r for r in _extras_requirements() if r.name == dist]
    if not reqs or any(r.marker is None or r.marker.evaluate() for r in reqs):
        return None
    return str(reqs[0].marker)


def need(*dists):
    """Skip the calling test (or module) where some of `dists` (optional dependencies, each
    importable under its own name) are not installed because the extras leave them out on
    this Python; the reason names them. Where the extras install one, a missing one fails
    on its import, as every fallback in the tests does."""
    import importlib.util
    import sys

    import pytest
    missing = [(d, m) for d in dists if (m := left_out(d)) is not None
               and importlib.util.find_spec(d) is None]
    if missing:
        python = ".".join(map(str, sys.version_info[:2]))
        pytest.skip(f"not installed: pyproject.toml's extras leave out on Python {python}, "
                    "for want of a wheel there, " + ", ".join(f"{d} ({m})" for d, m in missing),
                    allow_module_level=True)


def need_imports(source):
    """need() for every optional dependency the Python `source` imports."""
    import re
    imported = set(re.findall(r"^\s*(?:import|from)\s+(\w+)", source, flags=re.M))
    need(*sorted({r.name for r in _extras_requirements()} & imported))
