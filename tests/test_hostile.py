"""Hostile inputs never crash (SPEC "Errors, never crashes", issue 4).

Every public function gets wild values, huge sizes, NaN, empty and 0-d operands,
mismatched dtypes and non-array inputs: each gives a correct result or the documented
exception. The registered FFI targets are also called directly with malicious
attributes (strides and shapes that would read out of bounds, wrong ranks, wrong
dtypes): each must fail with a clean runtime error naming the problem.

Cases that could crash the interpreter (anything that reaches native code with a hostile
value) run in a child process: a segfault or abort there is a test failure showing the
child's stderr, not a dead test run. Under .ci/sanitize.sh the children inherit
LD_PRELOAD/ASAN_OPTIONS, so an out-of-bounds access in them is reported too.
"""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_ext
from references import ALL_DTYPES, assert_bits_equal, random_values

TESTS = os.path.dirname(os.path.abspath(__file__))
RuntimeErr = getattr(jax.errors, "JaxRuntimeError", None) or jax.errors.XlaRuntimeError
I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1
SUB_BYTE = [getattr(jnp, n) for n in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn")
            if hasattr(jnp, n)]


# --- child processes ------------------------------------------------------------------

CHILD = {}


def child(fn):
    """Registers fn to run in a fresh interpreter (see test_in_child_process)."""
    CHILD[fn.__name__] = fn
    return fn


def run_child(name, timeout=600):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        import conftest  # x64 and the hypothesis profile, as in the parent
        import test_hostile
        getattr(test_hostile, {name!r})()
        print("CHILD-OK")
    """)
    # cwd: not the repository root, whose jax_ext/ source dir lacks the compiled module.
    p = subprocess.run([sys.executable, "-c", code], cwd=TESTS + "/..", capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, PYTHONSAFEPATH="1"))
    if p.returncode != 0 or "CHILD-OK" not in p.stdout:
        how = (f"killed by signal {-p.returncode}" if p.returncode < 0
               else f"exit status {p.returncode}")
        raise AssertionError(f"child {name} failed ({how})\n--- stdout\n{p.stdout[-3000:]}"
                             f"\n--- stderr\n{p.stderr[-6000:]}")


def ref_gather(src, offsets, dim, index, *, check_bounds=True, num_indices=None,
               pad_value=None, align_bytes=32):
    from references import ref_gather as ref
    return ref(src, offsets, dim, index, check_bounds=check_bounds, num_indices=num_indices,
               pad_value=pad_value, align_bytes=align_bytes)


def both(fn, *args, **kw):
    """fn natively and through lax; the two agree bit for bit; returns the native one."""
    outs = []
    for impl in ("native", "lax"):
        with jax_ext.implementation(impl):
            outs.append(np.asarray(jax.block_until_ready(fn(*args, **kw))))
    assert_bits_equal(outs[0], outs[1])
    return outs[0]


WILD = [0, 1, -1, 3, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 5, -2 ** 31, -2 ** 31 - 1, 2 ** 32 + 1,
        I64_MAX, I64_MIN, I64_MAX - 2, I64_MIN + 2]


@child
def gather_wild_static():
    rng = np.random.default_rng(0)
    src = random_values(rng, (4, 5, 3), np.float32)
    idx64 = np.array(WILD, np.int64)
    idxu64 = np.array([0, 3, 2 ** 63, 2 ** 64 - 1, 2 ** 32, 2 ** 31], np.uint64)
    for cb in (True, False):
        for offs in ([0], [3], [I64_MAX], [I64_MIN], [-2 ** 31]):
            for idx in (idx64, idxu64, idx64.astype(np.int32)):
                got = both(jax_ext.gather, src, offs, 0, idx, check_bounds=cb)
                assert_bits_equal(got, ref_gather(src, offs, 0, idx, check_bounds=cb))
        for offs in ([I64_MAX, 0], [I64_MIN, I64_MAX], [1, I64_MIN], [3, 2 ** 40], [-1, 2]):
            got = both(jax_ext.gather, src, offs, 1, idx64, check_bounds=cb, align_bytes=None)
            assert_bits_equal(got, ref_gather(src, offs, 1, idx64, check_bounds=cb,
                                              align_bytes=None))


@child
def gather_wild_traced():
    rng = np.random.default_rng(1)
    src = random_values(rng, (3, 4, 6), ml_dtypes.bfloat16)
    for cb in (True, False):
        for impl in ("native", "lax"):
            with jax_ext.implementation(impl):
                f = jax.jit(lambda s, o, i, k: jax_ext.gather(
                    s, [o[0], o[1]], 1, i, check_bounds=cb, num_indices=k, pad_value=-1.0))
                for o in ([I64_MAX, I64_MAX], [I64_MIN, I64_MIN], [1, I64_MIN + 1],
                          [-1, 2], [2, I64_MAX - 1]):
                    for k in (0, 3, len(WILD), I64_MAX, I64_MIN, -1):
                        idx = np.array(WILD, np.int64)
                        got = f(src, np.array(o, np.int64), idx, np.int64(k))
                        want = ref_gather(src, o, 1, idx, check_bounds=cb, num_indices=k,
                                          pad_value=-1.0)
                        assert_bits_equal(got, want)
                # traced uint64 offsets above int64 saturate; uint64 num_indices clamps
                g = jax.jit(lambda s, o, i, k: jax_ext.gather(
                    s, o, 0, i, check_bounds=cb, num_indices=k))
                got = g(src, np.array([2 ** 64 - 1], np.uint64), np.array([0, -1], np.int64),
                        np.uint64(2 ** 64 - 1))
                want = ref_gather(src, [I64_MAX], 0, [0, -1], check_bounds=cb)
                assert_bits_equal(got, want)


@child
def gather_huge_num_nan_pad_empty():
    rng = np.random.default_rng(2)
    src = random_values(rng, (5, 4), np.float32)
    idx = np.array([0, 4, 9, -3], np.int32)
    # static num_indices outside [0, n]: ValueError, before any native code runs
    for k in (5, -1, 2 ** 62, 2 ** 70, -2 ** 70):
        with pytest.raises(ValueError, match="num_indices"):
            jax_ext.gather(src, [0], 0, idx, num_indices=k)
    # traced: clamped to [0, n]
    for k, dt in ((2 ** 62, np.int64), (I64_MIN, np.int64), (2 ** 64 - 1, np.uint64),
                  (2 ** 31 - 1, np.int32), (-2 ** 31, np.int32), (255, np.uint8)):
        got = both(jax.jit(lambda s, i, k: jax_ext.gather(s, [0], 0, i, num_indices=k)),
                   src, idx, dt(k))
        assert_bits_equal(got, ref_gather(src, [0], 0, idx, num_indices=int(k)))
    # NaN pad values: quiet, signalling with payload, into floats; NaN into integers
    # converts (as astype) -- natively and through lax alike
    snan = np.array(0x7F800001, np.uint32).view(np.float32)
    for pad in (float("nan"), np.float32(np.nan), snan, -np.float32(np.nan)):
        got = both(jax_ext.gather, src, [0], 0, idx, pad_value=pad)
        assert_bits_equal(got, ref_gather(src, [0], 0, idx, pad_value=pad))
    both(jax_ext.gather, src.astype(np.int32), [0], 0, idx, pad_value=np.float32(np.nan))
    both(jax_ext.gather, src.astype(np.uint8), [0], 0, idx, pad_value=np.float64(-np.inf))
    # empty everything
    for shape, dim, offs in (((0, 4), 0, [0]), ((5, 0), 0, [1]), ((0, 3, 4), 1, [0, 0]),
                             ((2, 0, 4), 1, [1, 0]), ((2, 3, 0), 0, [1]), ((3, 0, 2, 4), 0, [2])):
        s = random_values(rng, shape, np.float32)
        for cb in (True, False):
            for ix in (idx, np.zeros((0,), np.int64)):
                got = both(jax_ext.gather, s, offs, dim, ix, check_bounds=cb, pad_value=7.0)
                assert_bits_equal(got, ref_gather(s, offs, dim, ix, check_bounds=cb,
                                                  pad_value=7.0))
    # a huge alignment: a clean error (too big to allocate or to describe), never a crash
    for ab in (2 ** 40, 2 ** 62, 2 ** 70):
        try:
            jax.block_until_ready(jax_ext.gather(src, [0], 0, idx, align_bytes=ab))
        except (ValueError, RuntimeErr, MemoryError, TypeError, OverflowError) as e:
            print(f"align_bytes={ab}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)


@child
def select_hostile_values():
    rng = np.random.default_rng(3)
    # 0-d everything, zero-size dims everywhere, every dtype, through every front-end
    for dt in ALL_DTYPES:
        for shape in ((), (0,), (3, 0), (0, 1, 2), (1, 1, 1, 1, 1), (2, 1, 0, 3)):
            c = rng.integers(0, 2, shape).astype(bool)
            x, y = random_values(rng, shape, dt), random_values(rng, shape, dt)
            for fn in (jax_ext.where, jax_ext.where3,
                       lambda c, x, y: jax_ext.select(c, x, y, auto_broadcast="none")):
                got = both(fn, c, x, y)
                from references import np_select
                assert_bits_equal(got, np_select(c, x, y, shape))
    # a 0-d condition against big broadcasts, and empty results from broadcasting
    x = random_values(rng, (1, 7), np.float64)
    assert both(jax_ext.where, np.bool_(True), x, np.float64(np.nan)).shape == (1, 7)
    assert both(jax_ext.where, np.zeros((0, 1), bool), x, x).shape == (0, 7)
    assert both(jax_ext.select, np.ones((7,), bool), np.zeros((5, 0, 7), np.int8),
                np.int8(3)).shape == (5, 0, 7)


@child
def ffi_select_malicious():
    c = jnp.array([True, False, True, False, True, False])
    x = jnp.arange(6, dtype=jnp.float32)
    y = -jnp.arange(6, dtype=jnp.float32)
    ok = dict(shape=[6], cond_strides=[1], x_strides=[1], y_strides=[1])
    np.testing.assert_array_equal(ffi_select(c, x, y, (6,), jnp.float32, **ok),
                                  [0, -1, 2, -3, 4, -5])
    np.testing.assert_array_equal(  # a valid 2-d view with broadcast cond
        ffi_select(c[:3], x, y, (6,), jnp.float32, shape=[2, 3], cond_strides=[0, 1],
                   x_strides=[3, 1], y_strides=[3, 1]), [0, -1, 2, 3, -4, 5])
    bad = [
        (dict(ok, x_strides=[2]), "read past the end of x"),
        (dict(ok, y_strides=[1 << 62]), "read past the end of y"),
        (dict(ok, shape=[2, 3], cond_strides=[4, 1], x_strides=[3, 1], y_strides=[3, 1]),
         "read past the end of cond"),
        (dict(ok, shape=[3, 2], cond_strides=[I64_MAX, 1], x_strides=[2, 1],
              y_strides=[2, 1]), "read past the end of cond"),
        (dict(ok, cond_strides=[-1]), "negative stride"),
        (dict(ok, x_strides=[-1 << 62]), "negative stride"),
        (dict(ok, y_strides=[1, 1]), "wrong rank"),
        (dict(ok, x_strides=[]), "wrong rank"),
        (dict(ok, shape=[7]), "does not match"),
        (dict(ok, shape=[3]), "does not match"),
        (dict(ok, shape=[-6]), "bad shape"),
        (dict(ok, shape=[-2, -3], cond_strides=[1, 1], x_strides=[1, 1], y_strides=[1, 1]),
         "bad shape"),
        (dict(ok, shape=[1 << 62, 4], cond_strides=[0, 0], x_strides=[0, 0],
              y_strides=[0, 0]), "bad shape"),
        (dict(shape=[], cond_strides=[], x_strides=[], y_strides=[]), "rank 0"),
        (dict(shape=[1] * 65, cond_strides=[0] * 65, x_strides=[0] * 65, y_strides=[0] * 65),
         "rank 65"),
    ]
    for attrs, msg in bad:
        expect_runtime_error(msg, ffi_select, c, x, y, (6,), jnp.float32, **attrs)
    # cond is bound as a typed PRED buffer: the FFI refuses another dtype before the call.
    expect_runtime_error("Wrong buffer dtype: expected PRED but got S8", ffi_select,
                         c.astype(jnp.int8), x, y, (6,), jnp.float32, **ok)
    expect_runtime_error("differ in dtype", ffi_select, c, x, y.astype(jnp.int32), (6,),
                         jnp.float32, **ok)
    expect_runtime_error("differ in dtype", ffi_select, c, x, y, (6,), jnp.float64, **ok)
    # sub-byte types are packed: element_count elements are not element_count bytes
    for dt in SUB_BYTE:
        expect_runtime_error("sub-byte", ffi_select, c, x.astype(dt), y.astype(dt), (6,), dt,
                             **ok)


@child
def ffi_gather_malicious():
    rng = np.random.default_rng(4)
    src = jnp.asarray(random_values(rng, (4, 5), np.float32))
    off = jnp.array([0], jnp.int64)
    idx = jnp.array([0, 3, 1], jnp.int32)
    num = jnp.array(3, jnp.int64)
    pad = jnp.array(0, jnp.float32)
    ok = dict(src_shape=[4, 5], dim=0, row_len=5, n=3, check_bounds=True, batch_shape=[1],
              src_bstrides=[0], offsets_bstrides=[0], index_bstrides=[0], num_bstrides=[0],
              pad_bstrides=[0])
    args = (src, off, idx, num, pad)
    got = ffi_gather(*args, out=((3, 5), jnp.float32), **ok)
    np.testing.assert_array_equal(got, np.asarray(src)[[0, 3, 1]])
    out = ((3, 5), jnp.float32)
    bad = [
        (dict(ok, src_shape=[8, 5]), out, "src: batch strides"),
        (dict(ok, src_shape=[4, 5 + (1 << 40)]), out, "src"),
        (dict(ok, src_shape=[1 << 40, 1 << 40]), out, "overflows 64 bits"),
        (dict(ok, src_shape=[20]), out, "src rank 1"),
        (dict(ok, src_shape=[-4, -5]), out, "bad src shape"),
        (dict(ok, dim=1), out, "dim 1 outside"),
        (dict(ok, dim=-1), out, "dim -1 outside"),
        (dict(ok, dim=I64_MIN), out, "outside"),
        (dict(ok, row_len=4), out, "row_len 4 is shorter"),
        (dict(ok, row_len=1 << 62), out, "elements, expected"),
        (dict(ok, n=5), ((5, 5), jnp.float32), "index: batch strides"),
        (dict(ok, n=-1), out, "negative n"),
        (dict(ok, n=I64_MAX), out, "index"),
        (dict(ok, batch_shape=[]), out, "batch rank 0"),
        (dict(ok, batch_shape=[-1]), out, "bad batch shape"),
        (dict(ok, batch_shape=[2], src_bstrides=[20]), ((2, 3, 5), jnp.float32),
         "src: batch strides"),
        (dict(ok, batch_shape=[2], offsets_bstrides=[1]), ((2, 3, 5), jnp.float32),
         "offsets: batch strides"),
        (dict(ok, batch_shape=[2], pad_bstrides=[I64_MAX]), ((2, 3, 5), jnp.float32),
         "pad_value"),
        (dict(ok, src_bstrides=[-1]), out, "negative batch stride for src"),
        (dict(ok, num_bstrides=[0, 0]), out, "num_indices batch strides"),
        (dict(ok, batch_shape=[2]), out, "elements, expected"),
        (dict(ok, batch_shape=[1 << 40, 1 << 40]), out, "bad batch shape"),
    ]
    for attrs, o, msg in bad:
        expect_runtime_error(msg, ffi_gather, *args, out=o, **attrs)
    # inner * row_len past int64 (src (4, 2, 5), dim 0: two sub-rows per row)
    src3 = jnp.zeros((4, 2, 5), jnp.float32)
    expect_runtime_error("elements, expected", ffi_gather, src3, off, idx, num, pad,
                         out=((3, 2, 5), jnp.float32),
                         **dict(ok, src_shape=[4, 2, 5], row_len=1 << 62))
    expect_runtime_error("differ in dtype", ffi_gather, src, off, idx, num,
                         pad.astype(jnp.float64), out=out, **ok)
    expect_runtime_error("differ in dtype", ffi_gather, *args, out=((3, 5), jnp.int32), **ok)
    # the rows as wire values (pad_value and the result the unsigned integer of src's width,
    # as a partitioned call's shard gathers them): the same bytes
    wire = ffi_gather(src, off, idx, num, jax.lax.bitcast_convert_type(pad, jnp.uint32),
                      out=((3, 5), jnp.uint32), **ok)
    np.testing.assert_array_equal(wire, np.asarray(src)[[0, 3, 1]].view(np.uint32))
    for pdt, odt in ((jnp.int32, jnp.int32), (jnp.uint16, jnp.uint16), (jnp.uint64, jnp.uint64),
                     (jnp.bool_, jnp.bool_)):
        expect_runtime_error("differ in dtype", ffi_gather, src, off, idx, num,
                             pad.astype(pdt), out=((3, 5), odt), **ok)
    # bool rows as uint8 (bool's wire dtype), but never bytes read as bool
    wire = ffi_gather(src > 0, off, idx, num, pad.astype(jnp.uint8), out=((3, 5), jnp.uint8),
                      **ok)
    np.testing.assert_array_equal(wire, (np.asarray(src) > 0)[[0, 3, 1]].astype(np.uint8))
    expect_runtime_error("differ in dtype", ffi_gather, (src > 0).astype(jnp.uint8), off, idx,
                         num, pad > 0, out=((3, 5), jnp.bool_), **ok)
    expect_runtime_error("differ in dtype", ffi_gather, src.astype(jnp.int4), off, idx, num,
                         pad.astype(jnp.uint8), out=((3, 5), jnp.uint8), **ok)
    expect_runtime_error("", ffi_gather, src, off.astype(jnp.float32), idx, num, pad, out=out,
                         **ok)
    expect_runtime_error("integer dtype", ffi_gather, src, off, idx.astype(jnp.float32), num,
                         pad, out=out, **ok)
    expect_runtime_error("integer dtype", ffi_gather, src, off, idx.astype(jnp.int4), num,
                         pad, out=out, **ok)
    for dt in SUB_BYTE:
        expect_runtime_error("sub-byte", ffi_gather, src.astype(dt), off, idx, num,
                             pad.astype(dt), out=((3, 5), dt), **ok)
    # wild indices without bounds checks: clamped, never read outside src
    wild = jnp.array([I64_MAX, I64_MIN, -1, 4, 2 ** 40], jnp.int64)
    for o in ([I64_MAX], [I64_MIN], [2]):
        got = ffi_gather(src, jnp.array(o, jnp.int64), wild, jnp.array(5, jnp.int64), pad,
                         out=((5, 5), jnp.float32), **dict(ok, n=5, check_bounds=False))
        want = ref_gather(np.asarray(src), o, 0, np.asarray(wild), check_bounds=False,
                          align_bytes=None)
        assert_bits_equal(got, want)
    # an absurd but zero-size src: (2**40, 2**40, 0) rows of nothing, pad columns only
    got = ffi_gather(jnp.zeros((0,), jnp.float32), jnp.array([2 ** 40 - 1, 5], jnp.int64),
                     jnp.array([0, 1], jnp.int32), jnp.array(2, jnp.int64), pad,
                     out=((2, 0, 1), jnp.float32),
                     **dict(ok, src_shape=[1 << 40, 1 << 40, 0, 0], dim=1, row_len=1, n=2))
    assert got.shape == (2, 0, 1)
    got = ffi_gather(jnp.zeros((0,), jnp.float32), jnp.array([2 ** 40 - 1, 5], jnp.int64),
                     jnp.array([0, 1], jnp.int32), jnp.array(2, jnp.int64), pad + 3,
                     out=((2, 1), jnp.float32),
                     **dict(ok, src_shape=[1 << 40, 1 << 40, 0], dim=1, row_len=1, n=2,
                            check_bounds=False))
    np.testing.assert_array_equal(got, [[3], [3]])


@child
def ffi_scatter_malicious():
    ct = jnp.arange(15, dtype=jnp.float32).reshape(3, 5)
    off = jnp.array([0], jnp.int64)
    idx = jnp.array([0, 3, 0], jnp.int32)
    num = jnp.array(3, jnp.int64)
    ok = dict(src_shape=[4, 5], dim=0, row_len=5, n=3, check_bounds=True, batch_shape=[1],
              out_bstrides=[0], offsets_bstrides=[0], index_bstrides=[0], num_bstrides=[0])
    out = ((4, 5), jnp.float32)
    got = ffi_scatter(ct, off, idx, num, out=out, **ok)
    want = np.zeros((4, 5), np.float32)
    np.add.at(want, [0, 3, 0], np.asarray(ct))
    np.testing.assert_array_equal(got, want)
    bad = [
        (dict(ok, src_shape=[8, 5]), out, "result: batch strides"),
        (dict(ok, src_shape=[1 << 40, 1 << 40]), out, "overflows"),
        (dict(ok, dim=1), out, "dim 1 outside"),
        (dict(ok, row_len=3), out, "row_len 3 is shorter"),
        (dict(ok, row_len=6), out, "the cotangent has 15 elements"),
        (dict(ok, row_len=1 << 62), out, "the cotangent has"),
        (dict(ok, n=4), out, "index: batch strides"),
        (dict(ok, n=-7), out, "negative n"),
        (dict(ok, batch_shape=[2], out_bstrides=[20], offsets_bstrides=[0],
              index_bstrides=[0], num_bstrides=[0]), out, "result: batch strides"),
        (dict(ok, batch_shape=[2], out_bstrides=[0], offsets_bstrides=[0],
              index_bstrides=[3], num_bstrides=[0]), out, "index: batch strides"),
        (dict(ok, out_bstrides=[-20]), out, "negative batch stride"),
        (dict(ok, index_bstrides=[]), out, "do not match the batch rank"),
        # in bounds, but not whole rows: the rows would land off their places
        (dict(ok, batch_shape=[2], out_bstrides=[7], offsets_bstrides=[0],
              index_bstrides=[0], num_bstrides=[0]), ((2, 4, 5), jnp.float32),
         "multiples of src's size"),
    ]
    for attrs, o, msg in bad:
        expect_runtime_error(msg, ffi_scatter, ct, off, idx, num, out=o, **attrs)
    # inner * row_len past int64 (src (4, 2, 5), dim 0)
    expect_runtime_error("the cotangent has", ffi_scatter, ct, off, idx, num,
                         out=((4, 2, 5), jnp.float32),
                         **dict(ok, src_shape=[4, 2, 5], row_len=1 << 62))
    expect_runtime_error("differ in dtype", ffi_scatter, ct, off, idx, num,
                         out=((4, 5), jnp.float64), **ok)
    # a cotangent of wire values (gathered across devices as the unsigned integer of its
    # width) is read as the result's dtype: the same sums
    wire = jax.lax.bitcast_convert_type(ct, jnp.uint32)
    np.testing.assert_array_equal(ffi_scatter(wire, off, idx, num, out=out, **ok), want)
    for dt in (jnp.int32, jnp.uint16, jnp.uint64):
        expect_runtime_error("differ in dtype", ffi_scatter, ct.astype(dt), off, idx, num,
                             out=out, **ok)
    for dt in (jnp.bool_, ml_dtypes.float8_e4m3fn, jnp.int4):
        expect_runtime_error("", ffi_scatter, ct.astype(dt), off, idx, num, out=((4, 5), dt),
                             **ok)
    # wild indices, no bounds checks: clamped into the output, never outside it
    wild = jnp.array([I64_MAX, I64_MIN, -1], jnp.int64)
    got = ffi_scatter(ct, jnp.array([I64_MIN], jnp.int64), wild, num, out=out,
                      **dict(ok, check_bounds=False))
    assert np.isfinite(np.asarray(got)).all()


def _peak_rss_mib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def expect_invalid(msg, fn, *args, **kw):
    """fn fails at run time with INVALID_ARGUMENT naming `msg` (never bad_alloc, never a
    crash)."""
    try:
        fn(*args, **kw)
    except RuntimeErr as e:
        assert "INVALID_ARGUMENT" in str(e) and msg in str(e), f"expected {msg!r} in: {e}"
        return
    raise AssertionError(f"no error for {kw} (expected {msg!r})")


@child
def ffi_v2_hostile_attrs():
    """Every v2 attribute is checked against the operands' ranks before anything is sized
    by it: a huge nbatch is refused at once, naming nbatch, without allocating."""
    src = jnp.zeros((5, 2, 3), jnp.float32)
    offs, idx = jnp.array([0], jnp.int64), jnp.array([0, 4], jnp.int32)
    num, pad, ct = jnp.array(2, jnp.int64), jnp.array(0, jnp.float32), jnp.ones((2, 2, 3))
    gf = jax.ffi.ffi_call("jax_ext_gather_v2", jax.ShapeDtypeStruct((2, 2, 3), jnp.float32))
    sf = jax.ffi.ffi_call("jax_ext_scatter_add_v2",
                          jax.ShapeDtypeStruct((5, 2, 3), jnp.float32))
    gather = lambda **a: np.asarray(gf(src, offs, idx, num, pad, **_attrs(a)))  # noqa: E731
    scatter = lambda **a: np.asarray(sf(ct.astype(jnp.float32), offs, idx, num,  # noqa: E731
                                        **_attrs(a)))
    base = _peak_rss_mib()
    for nb, msg in ((2 ** 28, "nbatch = 268435456 is above"), (2 ** 40, "nbatch = 1099511627776"),
                    (I64_MAX, "nbatch = 9223372036854775807"), (65, "limit of 64 batch dims"),
                    (2, "nbatch = 2: an operand (1,) has fewer dims"),
                    (-1, "negative nbatch = -1"), (I64_MIN, "negative nbatch")):
        for fn in (gather, scatter):
            expect_invalid(msg, fn, dim=0, nbatch=nb, check_bounds=True)
    for d in (2, -1, 2 ** 40, I64_MIN):
        expect_invalid("has no dim", gather, dim=d, nbatch=0, check_bounds=False)
        expect_invalid("has no dim", scatter, dim=d, nbatch=0, check_bounds=False)
    # rank mismatches: one batch dim that offsets and index do not carry
    expect_invalid("an operand () has fewer dims", gather, dim=0, nbatch=1, check_bounds=True)
    expect_invalid("offsets (1,) must have rank nbatch + 1 = 2", lambda: np.asarray(gf(
        src[:2], offs, idx, num.reshape(1), pad.reshape(1), **_attrs(dict(
            dim=0, nbatch=1, check_bounds=True)))))
    # nothing above was allocated by attribute (2**28 batch dims held 2 GiB)
    assert _peak_rss_mib() - base < 256, (base, _peak_rss_mib())


@child
def ffi_v1_hostile_counts():
    """v1 attributes with huge counts over empty rows: nothing is sized by them."""
    off, idx, num = jnp.array([0], jnp.int64), jnp.array([0, 3, 0], jnp.int32), jnp.array(3)
    z = [0]
    ok = dict(src_shape=[4, 5], dim=0, row_len=5, n=3, check_bounds=True, batch_shape=[1],
              out_bstrides=z, offsets_bstrides=z, index_bstrides=z, num_bstrides=z)
    base = _peak_rss_mib()
    # 2**40 broadcast batch elements of rows with no elements: 3 * 2**40 cotangent rows
    # of 0 elements; the result holds no row, so it is zeros
    for bshape in ([2 ** 40], [2 ** 20, 2 ** 20, 2 ** 10]):
        bz = [0] * len(bshape)
        got = ffi_scatter(jnp.zeros((0,), jnp.float32), off, idx, num, out=((4, 5), jnp.float32),
                          **dict(ok, src_shape=[4, 0], row_len=0, batch_shape=bshape,
                                 out_bstrides=bz, offsets_bstrides=bz, index_bstrides=bz,
                                 num_bstrides=bz))
        assert not got.any()
    # an empty batch with a huge n: no rows at all
    got = ffi_scatter(jnp.zeros((0,), jnp.float32), off, idx, num, out=((4, 5), jnp.float32),
                      **dict(ok, n=2 ** 40, batch_shape=[0]))
    assert not got.any()
    g = {k: v for k, v in ok.items() if k != "out_bstrides"}
    got = ffi_gather(jnp.zeros((4, 5), jnp.float32), off, idx, num, jnp.array(0, jnp.float32),
                     out=((0,), jnp.float32),
                     **dict(g, n=2 ** 40, batch_shape=[0], src_bstrides=z, pad_bstrides=z))
    assert got.size == 0
    assert _peak_rss_mib() - base < 256, (base, _peak_rss_mib())


@child
def ffi_v2_select_hostile():
    """The select handler reads the shapes from the buffers: dim maps that name no result
    dim, name one twice or disagree with the operands, an aliased x walked transposed, and
    bad dtypes are errors naming the problem; a result of rank 70 (size-1 dims) is fine.
    (A result with more than 64 dims of size other than 1 has no elements, and XLA does not
    call a custom call whose result is empty.)"""
    c, x, y = np.array([[True], [False], [True]]), jnp.arange(12.0).reshape(3, 4), -jnp.arange(4.0)
    maps = lambda c, x, y: dict(cond_dims=c, x_dims=x, y_dims=y)  # noqa: E731
    ok = maps([0, 1], [0, 1], [1])
    assert_bits_equal(ffi_select_v2(c, x, y, (3, 4), x.dtype, **ok),
                      np.where(c, np.asarray(x), np.asarray(y)))
    for bad, msg in ((maps([0, I64_MAX], [0, 1], [1]), "cond dim map (0, 9223372036854775807)"),
                     (maps([I64_MIN, 1], [0, 1], [1]), "cond dim map (-9223372036854775808, 1) "
                                                       "does not fit the result rank 2"),
                     (maps([0, 1], [-1, 1], [1]), "x dim map (-1, 1) does not fit"),
                     (maps([0, 1], [0, 1], [2]), "y dim map (2,) does not fit the result rank 2"),
                     (maps([0, 1], [1, 1], [1]), "x (3, 4) does not map onto the result (3, 4) "
                                                 "with dims (1, 1)"),
                     (maps([0, 0], [0, 1], [1]), "cond dim map (0, 0) does not fit"),
                     (maps([1, 0], [0, 1], [1]), "cond (3, 1) does not map onto the result"),
                     (maps([0, 1], [0, 1], [0, 1]), "y has rank 1 but its dim map (0, 1)")):
        expect_invalid("jax_ext select: " + msg, ffi_select_v2, c, x, y, (3, 4), x.dtype, **bad)
    # rank 70 of size-1 dims around 3 elements, operands mapped every which way (numpy holds
    # at most 64 dims: the result is flattened by jax)
    shape = (1,) * 69 + (3,)
    f = jax.ffi.ffi_call("jax_ext_select_v2", jax.ShapeDtypeStruct(shape, jnp.float32))
    got = f(np.array([True, False, True]), jnp.arange(3, dtype=jnp.float32).reshape(shape),
            jnp.float32(-1), **_attrs(maps([69], list(range(70)), [])))
    assert_bits_equal(np.asarray(got.reshape(-1)), np.array([0.0, -1.0, 2.0], np.float32))
    # in place, x must be laid out like the result: a transposed walk of it is refused
    sq = jnp.arange(9, dtype=jnp.float32).reshape(3, 3)
    f = jax.ffi.ffi_call("jax_ext_select_v2", jax.ShapeDtypeStruct((3, 3), jnp.float32),
                         input_output_aliases={1: 0})
    expect_invalid("aliased x is not dense", lambda: np.asarray(f(
        np.ones((3, 3), bool), sq, sq, **_attrs(maps([0, 1], [1, 0], [0, 1])))))
    expect_invalid("x, y and the result differ in dtype", ffi_select_v2, c, x,
                   y.astype(jnp.int32), (3, 4), x.dtype, **ok)
    for dt in SUB_BYTE:
        expect_invalid("sub-byte", ffi_select_v2, c, x.astype(dt), y.astype(dt), (3, 4), dt,
                       **ok)


@child
def ffi_v2_rows_hostile():
    """The gather and scatter-add handlers read the shapes from the buffers: operands whose
    dims disagree with one another or with dim and nbatch are errors naming them, wild
    positions are clamped, and broadcast batch dims read and accumulate correctly."""
    rng = np.random.default_rng(6)
    src = jnp.asarray(random_values(rng, (5, 2, 3), np.float32))
    offs, idx = jnp.array([0], jnp.int64), jnp.array([0, 4], jnp.int32)
    num, pad = jnp.array(2, jnp.int64), jnp.array(-1, jnp.float32)
    a0 = dict(dim=0, nbatch=0, check_bounds=True)
    g = lambda *a, out=((2, 2, 3), jnp.float32), **kw: ffi_gather_v2(  # noqa: E731
        *a, out=out, **(a0 | kw))
    assert_bits_equal(g(src, offs, idx, num, pad), ref_gather(np.asarray(src), [0], 0, idx,
                                                               align_bytes=None))
    for args, out, msg in (
            ((src, offs[:0], idx, num, pad), None, "offsets (0,) must hold dim + 1 = 1 values"),
            ((src, jnp.zeros(2, jnp.int64), idx, num, pad), None, "must hold dim + 1 = 1"),
            ((src, offs, idx, num, pad.reshape(1)), None, "pad_value (1,) must have rank nbatch"),
            ((src, offs, idx, num.reshape(1), pad), None, "num_indices (1,) must have rank"),
            ((src, offs, idx.reshape(1, 2), num, pad), None, "index (1, 2) must have rank"),
            ((src, offs, idx, num, pad), ((2, 2, 2), jnp.float32),
             "row_len 2 is shorter than the last src dimension 3"),
            ((src, offs, idx, num, pad), ((3, 2, 3), jnp.float32),
             "result (3, 2, 3) does not fit src (5, 2, 3) and n = 2: expected (2, 2, L) with "
             "L >= 3"),
            ((src, offs, idx, num, pad), ((2, 3, 3), jnp.float32), "result (2, 3, 3) does not"),
            ((src, offs, idx, num, pad), ((2, 6), jnp.float32), "result (2, 6) does not fit"),
            ((src, offs, idx.astype(jnp.float32), num, pad), None, "integer dtype"),
            ((src, offs.astype(jnp.float32), idx, num, pad), None, "int32 or int64"),
            ((src, offs, idx, num, pad.astype(jnp.float64)), None, "differ in dtype")):
        expect_invalid(msg, g, *args, **({"out": out} if out else {}))
    for dt in SUB_BYTE:
        expect_invalid("sub-byte", g, src.astype(dt), offs, idx, num, pad.astype(dt),
                       out=((2, 2, 3), dt))
    # batch dims that disagree, and a result without the full batch
    bsrc = jnp.stack([src, src])
    expect_invalid("batch dim 0 differs between operands (2 and 3)", g, bsrc, offs[None],
                   jnp.zeros((3, 2), jnp.int32), num[None], pad[None],
                   out=((2, 2, 2, 3), jnp.float32), nbatch=1)
    expect_invalid("result (1, 2, 2, 3) does not fit src (2, 5, 2, 3)", g, bsrc, offs[None],
                   idx[None], num[None], pad[None], out=((1, 2, 2, 3), jnp.float32), nbatch=1)
    # wild positions without bounds checks: clamped into src
    wild = jnp.array([I64_MAX, I64_MIN, -1, 4, 2 ** 40], jnp.int64)
    for o in ([I64_MAX], [I64_MIN], [2]):
        got = g(src, jnp.array(o, jnp.int64), wild, jnp.array(5, jnp.int64), pad,
                out=((5, 2, 3), jnp.float32), check_bounds=False)
        assert_bits_equal(got, ref_gather(np.asarray(src), o, 0, np.asarray(wild),
                                          check_bounds=False, align_bytes=None))
    # one src for three batch elements (a broadcast batch dim), per-element pads
    bidx = jnp.array([[0, 4], [7, 1], [-1, 2]], jnp.int32)
    bpad = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    got = g(src[None], offs[None], bidx, jnp.array([2, 2, 1], jnp.int64), bpad,
            out=((3, 2, 2, 3), jnp.float32), nbatch=1)
    want = [ref_gather(np.asarray(src), [0], 0, i, num_indices=k, pad_value=p, align_bytes=None)
            for i, k, p in zip(np.asarray(bidx), [2, 2, 1], [1.0, 2.0, 3.0])]
    assert_bits_equal(got, np.stack(want))
    # scatter-add: the cotangent must hold the gather's result shape
    s0 = dict(dim=0, nbatch=0, check_bounds=True)
    ct = jnp.ones((2, 2, 3), jnp.float32)
    s = lambda *a, out=((5, 2, 3), jnp.float32), **kw: ffi_scatter_v2(  # noqa: E731
        *a, out=out, **(s0 | kw))
    want = np.zeros((5, 2, 3), np.float32)
    want[0] += 1
    want[4] += 1
    assert_bits_equal(s(ct, offs, idx, num), want)
    for args, out, msg in (
            ((jnp.ones((3, 2, 3), jnp.float32), offs, idx, num), None,
             "cotangent (3, 2, 3) does not fit result (5, 2, 3) and n = 2"),
            ((jnp.ones((2, 2, 2), jnp.float32), offs, idx, num), None,
             "row_len 2 is shorter than the last src dimension 3"),
            ((ct, jnp.zeros(2, jnp.int64), idx, num), None, "must hold dim + 1 = 1"),
            ((ct, offs, idx, num), ((5, 2, 3), jnp.float64), "differ in dtype"),
            ((ct.astype(jnp.bool_), offs, idx, num), ((5, 2, 3), jnp.bool_), "unsupported dtype")):
        expect_invalid(msg, s, *args, **({"out": out} if out else {}))
    # three batch elements accumulate into one result (a broadcast batch dim of the result)
    got = s(jnp.ones((3, 2, 2, 3), jnp.float32), offs[None], bidx, jnp.array([2], jnp.int64),
            out=((1, 5, 2, 3), jnp.float32), nbatch=1)
    want = np.zeros((5, 2, 3), np.float32)
    for r in (0, 4, 1, 2):  # 7 and -1 are out of range
        want[r] += 1
    assert_bits_equal(got, want[None])


# --- direct FFI calls -----------------------------------------------------------------

@child
def ffi_update_rows_hostile():
    """update_rows' read and write kernels, called directly: shapes that disagree, ids out
    of range, wrong dtypes and counts of operands are errors naming them, before a byte is
    read or written; wild ids read no row."""
    def read(*ops, m=3, ids_dt=jnp.int32, rows=None, **kw):
        t = ops[5]
        row = (m,) + t.shape[1:] if rows is None else rows
        outs = [jax.ShapeDtypeStruct((m,), ids_dt), jax.ShapeDtypeStruct(row, t.dtype),
                jax.ShapeDtypeStruct((), ids_dt)] + [
            jax.ShapeDtypeStruct(row, x.dtype) for x in ops[5:]]
        f = jax.ffi.ffi_call("jax_ext_update_rows_read_v1", outs)
        return jax.block_until_ready(f(*ops, **_attrs(dict(dict(dim=0, nbatch=0,
                                                               check_bounds=True), **kw))))

    def write(ids, *ops, nbatch=0, outs=None):
        k = len(ops) // 2
        f = jax.ffi.ffi_call("jax_ext_update_rows_write_v1", [
            jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (outs or ops[:k])])
        return jax.block_until_ready(f(ids, *ops, nbatch=np.int64(nbatch)))
    t = jnp.asarray(np.arange(20, dtype=np.float32).reshape(5, 4))
    offs, num, first = jnp.array([0], jnp.int32), jnp.array(4, jnp.int32), jnp.array(0, jnp.int32)
    idx = jnp.array([1, 4, 1, 9], jnp.int64)  # a repeat and a row out of range
    g = jnp.ones((4, 4), jnp.float32)
    ids, sums, count, rows = read(offs, idx, num, first, g, t, m=4)
    assert np.asarray(ids).tolist() == [1, 4, -1, -1] and int(count) == 2
    assert np.asarray(sums)[:, 0].tolist() == [2.0, 1.0, 0.0, 0.0]
    for ops, kw, msg in (
            ((offs, idx, num, first, g[:, :2], t), {}, "row_len 2 is shorter than the last"),
            ((offs, idx, num, first, g.astype(jnp.float16), t), {}, "differ in dtype"),
            ((offs, idx.astype(jnp.float32), num, first, g, t), {}, "integer dtype"),
            ((offs, idx, num, first.astype(jnp.float32), g, t), {}, "first must be int32"),
            ((offs, idx, num, first.reshape(1), g, t), {}, "first (1,) must have rank"),
            ((offs, idx, num, first, g, t, t[:2]), {}, "differs from the table"),
            ((offs, idx, num, first, g, t), {"rows": (3, 3)}, "sums must hold unpadded rows"),
            ((offs, idx, num, first, g, t), {"nbatch": 3}, "nbatch = 3: an operand"),
            ((offs, idx, num, first, g, t), {"dim": 1}, "has no dim 1 before its last")):
        expect_invalid(msg, read, *ops, **kw)
    expect_invalid("ids and count must both be int32", read, offs, idx, num, first, g, t,
                   ids_dt=jnp.float32)
    for dt in SUB_BYTE:
        expect_invalid("sub-byte", read, offs, idx, num, first, g.astype(dt), t.astype(dt))
    # the write: every id checked before a byte is written
    new = jnp.full((3, 4), 7.0, jnp.float32)
    got = write(jnp.array([4, -1, 0], jnp.int32), t, new)
    want = np.arange(20, dtype=np.float32).reshape(5, 4)
    want[[4, 0]] = 7.0
    assert_bits_equal(got[0], want)
    for bad in (5, -2, I64_MAX, I64_MIN):
        expect_invalid("outside [-1, 5)", write, jnp.array([0, bad, 1], jnp.int64), t, new)
    expect_invalid("do not fit", write, jnp.array([0, 1], jnp.int32), t, new)
    expect_invalid("do not fit", write, jnp.array([0, 1, 2], jnp.int32), t,
                   new.astype(jnp.float16))
    expect_invalid("expected leaves, their new rows", write, jnp.array([0, 1, 2], jnp.int32),
                   t, new, t)
    expect_invalid("ids must be int32 or int64", write, jnp.array([0.0, 1.0, 2.0]), t, new)
    expect_invalid("nbatch = -1 out of range", write, jnp.array([0, 1, 2], jnp.int32), t, new,
                   nbatch=-1)


def _attrs(kw):
    out = {}
    for k, v in kw.items():
        if isinstance(v, bool):
            out[k] = np.bool_(v)
        elif isinstance(v, int):
            out[k] = np.int64(v)
        else:
            out[k] = np.asarray(v, np.int64).reshape(-1)
    return out


def _ffi(target, out, *args, **attrs):
    f = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(*out))
    return np.asarray(jax.block_until_ready(f(*args, **_attrs(attrs))))


# The *_v1 targets (shapes and strides as attributes) and the *_v2 ones (shapes from the
# buffers).
def ffi_select(c, x, y, out_shape, dtype, **attrs):
    return _ffi("jax_ext_select_v1", (out_shape, dtype), c, x, y, **attrs)


def ffi_select_v2(c, x, y, out_shape, dtype, **attrs):
    return _ffi("jax_ext_select_v2", (out_shape, dtype), c, x, y, **attrs)


def ffi_gather(*args, out, **attrs):
    return _ffi("jax_ext_gather_v1", out, *args, **attrs)


def ffi_gather_v2(*args, out, **attrs):
    return _ffi("jax_ext_gather_v2", out, *args, **attrs)


def ffi_scatter(*args, out, **attrs):
    return _ffi("jax_ext_scatter_add_v1", out, *args, **attrs)


def ffi_scatter_v2(*args, out, **attrs):
    return _ffi("jax_ext_scatter_add_v2", out, *args, **attrs)


def expect_runtime_error(msg, fn, *args, **kw):
    print(f"  expect {msg!r}", file=sys.stderr, flush=True)
    try:
        fn(*args, **kw)
    except RuntimeErr as e:
        assert msg in str(e), f"expected {msg!r} in: {e}"
        return
    raise AssertionError(f"no error for {kw} (expected {msg!r})")


# --- ranks past the kernels' limit: routed at lowering -------------------------------

def _decisions(fn, *args):
    return [(d.op, d.impl, d.reason) for d in jax_ext.explain(fn, *args)]


@pytest.mark.skipif(not jax_ext.native_available(), reason="needs the native module")
def test_rank_above_the_kernel_limit_is_routed_at_lowering():
    """src of rank 66 (size-1 dims), 65 nested vmaps, a select of 65 dims of size other
    than 1: lax under auto, with the reason explain() shows; a ValueError at trace time
    naming the op, the operand and its rank under native. Below the limit, native. (numpy
    holds at most 64 dims: the arrays are jax's, compared reshaped.)"""
    rng = np.random.default_rng(5)
    rows, cols = 4096, 64  # large enough that auto picks native below the limit
    base = jnp.asarray(random_values(rng, (rows, cols), np.float32))
    idx = jnp.asarray(rng.integers(-2, rows + 2, rows).astype(np.int32))
    want = np.where((np.asarray(idx) >= 0)[:, None] & (np.asarray(idx) < rows)[:, None],
                    np.asarray(base)[np.clip(np.asarray(idx), 0, rows - 1)], 0)
    lift = lambda a, k: a.reshape(a.shape[:1] + (1,) * k + a.shape[1:])  # noqa: E731
    flat = lambda a: np.asarray(a.reshape(rows, cols))  # noqa: E731
    f = lambda s: jax_ext.gather(s, [0], 0, idx, align_bytes=None)  # noqa: E731
    src66, src64 = lift(base, 64), lift(base, 62)
    with jax_ext.implementation("auto"):
        assert _decisions(f, src64)[0][:2] == ("gather", "native")
        (op, impl, why), = _decisions(f, src66)
        assert (op, impl) == ("gather", "lax"), why
        assert "src float32[4096,1," in why and "rank 66" in why and "limit of 64" in why
        assert_bits_equal(flat(f(src66)), want)
        g = jax.grad(lambda s: f(s).sum())(src66)
        assert_bits_equal(flat(g), np.asarray(jax.grad(lambda s: f(s).sum())(base)))
    with jax_ext.implementation("native"):
        with pytest.raises(ValueError, match=r"jax_ext\.gather: impl='native' cannot take "
                                             r"this call: src float32\[4096,1,.*rank 66"):
            f(src66)
        with pytest.raises(ValueError, match="rank 66"):
            jax.jit(f).lower(src66)
        assert_bits_equal(flat(f(src64)), want)

    # 65 nested vmaps: 65 batch dims
    vf = lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None)  # noqa: E731
    for _ in range(65):
        vf = jax.vmap(vf)
    bsrc, bidx = base.reshape((1,) * 65 + (rows, cols)), idx.reshape((1,) * 65 + (rows,))
    with jax_ext.implementation("auto"):
        (op, impl, why), = _decisions(vf, bsrc, bidx)
        assert impl == "lax" and "65 batch dims" in why, why
        assert_bits_equal(flat(vf(bsrc, bidx)), want)
    with jax_ext.implementation("native"):
        with pytest.raises(ValueError, match="gather: impl='native'.*65 batch dims"):
            vf(bsrc, bidx)

    # select: size-1 dims are dropped before the call, so 70 dims of them stay native...
    c = np.asarray(base[:, 0] > 0)
    x = base[:, 0].reshape((1,) * 69 + (rows,))
    with jax_ext.implementation("native"):
        assert _decisions(jax_ext.where, c, x, 0.0)[0][:2] == ("select", "native")
        assert_bits_equal(np.asarray(jax_ext.where(c, x, 0.0).reshape(-1)),
                          np.where(c, np.asarray(base[:, 0]), np.float32(0)))
    # ... but 65 dims of other sizes (an empty array) are not
    e = jnp.zeros((0,) + (2,) * 64, jnp.float32)
    with jax_ext.implementation("auto"):
        assert jax_ext.where(True, e, e).shape == e.shape
        assert _decisions(jax_ext.where, True, e, e)[0][:2] == ("select", "lax")
    with jax_ext.implementation("native"):
        # each front-end is named in its own refusal
        for fn, args in ((jax_ext.where, (True, e, e)), (jax_ext.where3, (True, e, e)),
                         (jax_ext.select, (np.array([True]), e, e))):
            with pytest.raises(ValueError, match=rf"^jax_ext\.{fn.__name__}: impl='native'"
                                                 r".*float32\[0,2,.*has rank 65, above the "
                                                 r"native kernels' limit"):
                fn(*args)


@pytest.mark.parametrize("name", sorted(CHILD))
def test_in_child_process(name):
    assert jax_ext.native_available()
    run_child(name)


def _segfault():
    import ctypes
    ctypes.string_at(0)


def test_child_runner_reports_a_crash(monkeypatch):
    """The runner itself: a child that segfaults is a failure that says so."""
    # Under the sanitizers: let the signal kill the child, not ASan's SEGV report.
    monkeypatch.setenv("ASAN_OPTIONS", "handle_segv=0:detect_leaks=0")
    with pytest.raises(AssertionError, match="killed by signal 11"):
        run_child("_segfault")


@pytest.mark.parametrize("impl", ["native", "lax"])
def test_sub_byte_dtypes_through_the_public_api(impl):
    """int4/uint4/int2 values and int4 indices: packed in XLA buffers, so they take the
    lax path, with correct results (the native handlers refuse them; see above)."""
    c = np.array([True, False, True, False, True])
    with jax_ext.implementation(impl):
        for dt in SUB_BYTE:
            if np.dtype(dt).kind not in "iu":
                continue
            x, y = np.arange(5).astype(dt), np.array([1, 0, 1, 0, 1]).astype(dt)
            want = np.where(c, np.arange(5), [1, 0, 1, 0, 1])
            for got in (jax_ext.where(c, x, y), jax_ext.select(c[:, None], x[:, None], y),
                        jax_ext.where3(c, x, y)):
                assert got.dtype == np.dtype(dt)
                np.testing.assert_array_equal(np.asarray(got).astype(np.int64).reshape(-1)[:5],
                                              want)
        src = np.arange(12, dtype=np.float32).reshape(3, 4)
        got = jax_ext.gather(src, [0], 0, np.array([0, 2, 5, -1], jnp.int4), align_bytes=None)
        np.testing.assert_array_equal(got, [src[0], src[2], np.zeros(4), np.zeros(4)])
        g = jax.grad(lambda s: jax_ext.gather(s, [0], 0, np.array([0, 2, 2], jnp.int4)).sum())(src)
        np.testing.assert_array_equal(g, [[1] * 4, [0] * 4, [2] * 4])
        s4 = np.arange(-4, 4).reshape(4, 2).astype(jnp.int4)
        got = jax_ext.gather(s4, [1], 0, np.array([0, 2, 7], np.int32), align_bytes=None,
                             pad_value=3)
        np.testing.assert_array_equal(np.asarray(got).astype(int), [[-2, -1], [2, 3], [3, 3]])
