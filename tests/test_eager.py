"""The eager layer (jax_ext/_eager.py): a Python scalar is traced, converted exactly where
the call is made, so a loop over many values compiles once per Python type and keeps
numpy's bits; every concrete value that jit traces passes the front-end's checks first,
with its class and message; and many threads may call the front-ends at once (issue 52)."""
import struct
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_ext
from jax_ext import _eager, _gather, _select
from references import IMPLS, assert_bits_equal, ref_gather

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
rng = np.random.default_rng(52)
C = np.asarray(rng.random(12) > 0.5)


def _f64(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _halfway(dt, k):
    """Python floats halfway between neighbours of `dt` and one ulp (of float64) either
    side: a conversion through float32 first rounds some of them the other way."""
    out = []
    for v in rng.standard_normal(k) * 100:
        a = np.asarray(v, dt)
        b = np.nextafter(a.astype(np.float32), np.float32(np.inf)).astype(dt)
        if b == a:
            b = np.asarray(np.nextafter(float(a), np.inf) * (1 + 2 ** -7), dt)
        mid = (float(a) + float(b)) / 2
        out += [mid, float(np.nextafter(mid, np.inf)), float(np.nextafter(mid, -np.inf))]
    return out


FLOATS = [0.0, -0.0, float("nan"), _f64(0x7FF4000000000001), _f64(0xFFF8000000000123),
          float("inf"), -float("inf"), 1e-30, 65519.99, 1e300, 0.1, -2.5]
# (dtype of x, the Python scalars tried beside it)
CASES = [
    (np.float16, FLOATS + _halfway(np.float16, 12) + [3, -7, True]),
    (ml_dtypes.bfloat16, FLOATS + _halfway(ml_dtypes.bfloat16, 12) + [3, True]),
    (np.float32, FLOATS + [2 ** 24 + 1, -(2 ** 60) - 3, False]),
    (np.float64, FLOATS + [2 ** 53 + 1]),
    (np.complex64, [complex(0.1, -0.0), complex(float("nan"), 1e300), -0.0, 5]),
    (np.int8, [127, -128, 0, True]),
    (np.int32, [0.5, -0.0, 2.5j, -(2 ** 31)]),  # a float or complex promotes the pair
    (np.bool_, [True, False, 2, 0.5]),
]


def _want(cond, x, v):
    """numpy's where of x and the Python scalar v converted directly to the dtype and
    weak type jnp.where gives the pair."""
    want = jax.eval_shape(lambda: jnp.where(cond, x, v))  # typed as jnp types it, not run
    return np.where(cond, np.asarray(x).astype(want.dtype),
                    np.asarray(v, want.dtype)), want.dtype, want.weak_type


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,scalars", CASES, ids=[np.dtype(c[0]).name for c in CASES])
def test_a_python_scalar_keeps_numpys_direct_conversion(dtype, scalars, impl):
    """where and select with a Python scalar beside a strong array, a weakly
    typed one (a Python scalar passed to jit) and another Python scalar: numpy's bits
    (one rounding: float16 halfway points, -0.0, NaN payloads) and jnp.where's dtype and
    weak type, eagerly and under jit."""
    x = jnp.asarray(rng.standard_normal(12) * 3).astype(dtype)
    with jax_ext.implementation(impl):
        for v in scalars:
            want, dt, weak = _want(C, x, v)
            got = jax_ext.where(C, x, v)
            assert (got.dtype, got.weak_type) == (dt, weak), (v, got.dtype)
            assert_bits_equal(got, want)
            got = jax_ext.select(C, v, x)
            assert (got.dtype, got.weak_type) == (dt, weak), (v, got.dtype)
            assert_bits_equal(got, np.where(C, np.asarray(v, dt), np.asarray(x).astype(dt)))
        # under jit (one trace for them all: a constant each)
        jitted = jax.jit(lambda x: [jax_ext.where(C, x, v) for v in scalars[:12]])(x)
        for v, got in zip(scalars, jitted):
            want, dt, weak = _want(C, x, v)
            assert (got.dtype, got.weak_type) == (dt, weak), (v, got.dtype)
            assert_bits_equal(got, want)
        # two Python scalars, and a weakly typed array beside one (a jit argument)
        v = scalars[0]
        want = jnp.where(C, 3, v)
        got = jax_ext.where(C, 3, v)
        assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)
        assert_bits_equal(got, np.where(C, np.asarray(3, want.dtype), np.asarray(v, want.dtype)))
        w = jax.jit(lambda a: jnp.where(C, a, v))(2)
        g = jax.jit(lambda a: jax_ext.where(C, a, v))(2)
        assert (g.dtype, g.weak_type) == (w.dtype, w.weak_type)
        assert_bits_equal(g, w)


def _cache_sizes():
    return (_select._where_jit._cache_size(), _select._select_jit._cache_size(),
            _select._where3_jit._cache_size(), _gather._gather_jit._cache_size())


@pytest.mark.parametrize("impl", IMPLS)
def test_a_loop_over_python_scalars_compiles_once(impl):
    """120 distinct floats (and ints) through where, select, where3 and gather's
    pad_value: no jit cache of jax_ext grows after the first value of each type, and
    every result has numpy's bits."""
    x = jnp.asarray(rng.standard_normal(12), jnp.float16)
    src = jnp.asarray(rng.standard_normal((9, 3)), jnp.float16)
    idx = jnp.asarray([0, 8, 9, -1], jnp.int32)
    values = [float(v) for v in rng.standard_normal(120) * 1000] + list(range(-60, 60))

    def run(v):
        return (jax_ext.where(C, x, v), jax_ext.select(C, v, x), jax_ext.where3(False, x, x),
                jax_ext.where3(C[0], x[0], v), jax_ext.gather(src, [0], 0, idx, pad_value=v))
    with jax_ext.implementation(impl):
        run(0.5), run(1)
        before = _cache_sizes()
        for v in values:
            got = run(v)
            p = np.asarray(v, np.float16)
            assert_bits_equal(got[0], np.where(C, np.asarray(x), p))
            assert_bits_equal(got[1], np.where(C, p, np.asarray(x)))
            assert_bits_equal(got[3], np.asarray(x[0]) if C[0] else p)
            assert_bits_equal(got[4], ref_gather(np.asarray(src), [0], 0, np.asarray(idx),
                                                 pad_value=p))
        assert _cache_sizes() == before


def _message(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


SRC = np.arange(24, dtype=np.float32).reshape(6, 4)
IDX = np.asarray([0, 5, 2], np.int32)


@pytest.mark.parametrize("call,front_end", [
    (lambda: jax_ext.where(C, np.int8(1), 300), lambda: _select._where(C, np.int8(1), 300)),
    (lambda: jax_ext.where(C, 300, np.zeros(12, np.int8)),
     lambda: _select._where(C, 300, np.zeros(12, np.int8))),
    (lambda: jax_ext.select(C, np.zeros(12, np.uint8), -1),
     lambda: _select._select(C, np.zeros(12, np.uint8), -1, "numpy")),
    (lambda: jax_ext.where(C, np.float16(1), 2 ** 70),
     lambda: _select._where(C, np.float16(1), 2 ** 70)),
    (lambda: jax_ext.where(1, np.float32(1), 0.5),
     lambda: _select._where(1, np.float32(1), 0.5)),
    (lambda: jax_ext.where3(C, jax.random.key(0), 0.5),
     lambda: _select._where3(C, jax.random.key(0), 0.5)),
    (lambda: jax_ext.where(np.zeros(3, bool), np.int8(1), 300),  # the first error first
     lambda: _select._where(np.zeros(3, bool), np.int8(1), 300)),
    (lambda: jax_ext.gather(SRC.astype(np.int8), [0], 0, IDX, pad_value=0.5),
     lambda: _gather._gather(SRC.astype(np.int8), [0], 0, IDX, True, None, 0.5, 32)),
    (lambda: jax_ext.gather(SRC.astype(np.int8), [0], 0, IDX, pad_value=-129),
     lambda: _gather._gather(SRC.astype(np.int8), [0], 0, IDX, True, None, -129, 32)),
    (lambda: jax_ext.gather(SRC, [0, 1], 0, IDX, pad_value=1j),  # offsets first
     lambda: _gather._gather(SRC, [0, 1], 0, IDX, True, None, 1j, 32)),
], ids=["int8-300", "300-int8", "select-uint8--1", "float16-2**70", "int-condition", "key",
        "shapes-then-scalar", "pad-0.5-int8", "pad--129-int8", "pad-offsets-first"])
def test_a_scalar_that_does_not_fit_raises_the_front_ends_error(call, front_end):
    """A Python scalar refused where the call is made raises what the front-end raises,
    class and message (the front-end runs unjitted for it)."""
    want = _message(front_end)
    assert want is not None
    assert _message(call) == want
    assert _message(jax.jit(lambda: call())) == want


def _gather_num(num, jit):
    f = (lambda s, i: jax_ext.gather(s, [0], 0, i, num_indices=num))
    return (jax.jit(f) if jit else f)(jnp.asarray(SRC), jnp.asarray(IDX))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("num", [np.int32(4), np.int32(-1), np.int64(-(2 ** 40)),
                                 np.uint8(200), np.uint64(2 ** 64 - 1), np.array(4),
                                 np.array(-1, np.int16), 4, -1])
def test_a_concrete_num_indices_outside_0_n_raises(num, x64, jit):
    """SPEC: a static num_indices outside [0, n] is a ValueError, whatever its Python or
    numpy type (a 0-d numpy array included) and jax_enable_x64, eagerly and under jit,
    with the message a Python int gets."""
    want = (ValueError, f"gather: num_indices={int(num)} must lie in [0, n] = [0, 3] for "
                        f"index (3,)")
    with jax.enable_x64(x64):
        assert _message(_gather_num, num, jit) == want


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num", [np.int32(2), np.uint64(3), np.array(0, np.uint8), 1])
def test_a_concrete_num_indices_in_range(num, impl):
    with jax_ext.implementation(impl):
        for jit in (False, True):
            assert_bits_equal(_gather_num(num, jit),
                              ref_gather(SRC, [0], 0, IDX, num_indices=int(num)))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_jax_array_num_indices_is_clamped_eagerly_as_under_jit(impl):
    """A jax array num_indices is data, concrete or traced: clamped into [0, n] eagerly as
    under jit (the same result either way, and no wait for its value)."""
    with jax_ext.implementation(impl):
        for num, k in ((jnp.asarray(7), 3), (jnp.asarray(-2), 0), (jnp.asarray(2), 2)):
            want = ref_gather(SRC, [0], 0, IDX, num_indices=k)
            assert_bits_equal(_gather_num(num, False), want)
            assert_bits_equal(_gather_num(num, True), want)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("offsets,x64", [
    ([np.int64(2 ** 40)], False), ([np.uint64(2 ** 64 - 1)], True), ([2 ** 63], True),
    ([np.bool_(True)], True), ([np.float32(1)], True), ([np.int8(1), 2], True)],
    ids=["int64-x32", "uint64-x64", "int-x64", "bool", "float", "mixed-ok"])
def test_numpy_scalar_offsets_are_checked_as_python_ints(offsets, x64, jit):
    """Offsets given as numpy scalars pass the front-end's checks of static values, with
    its messages: one that does not fit the default integer type is a ValueError (not
    wrapped or saturated), a bool or float a TypeError naming its type."""
    src = np.zeros((2,) * (len(offsets) + 1), np.float32)
    idx = np.asarray([0, 1], np.int32)
    with jax.enable_x64(x64):
        want = _message(_gather._gather, src, offsets, len(offsets) - 1, idx, True, None,
                        None, None)

        def f(s, i):
            return jax_ext.gather(s, offsets, len(offsets) - 1, i, align_bytes=None)
        got = _message(jax.jit(f) if jit else f, jnp.asarray(src), jnp.asarray(idx))
    assert got == want
    if want is None:  # in range: the rows of the front-end run unjitted
        with jax.enable_x64(x64):
            assert_bits_equal(f(src, idx), _gather._gather(src, offsets, len(offsets) - 1, idx,
                                                           True, None, None, None))


@pytest.mark.parametrize("impl", IMPLS)
def test_eight_threads_with_fresh_offsets_and_scalars(impl):
    """8 threads call gather with fresh Python-int offsets and num_indices (the offsets
    cache evicts all the time), gather with a fresh pad_value, and where and select with
    fresh Python floats, eagerly, for a second: no exception, and the jnp twin's bits
    (computed on this thread)."""
    rows, n, per = 700, 5, 100
    src = jnp.asarray(rng.standard_normal((rows, 4)), jnp.float32)
    idx = jnp.asarray(rng.integers(0, 8, n), jnp.int32)
    x = jnp.asarray(rng.standard_normal(12), jnp.float32)
    cj = jnp.asarray(C)
    work = [[(t * per + k, (t * per + k) * 0.001 - 0.3) for k in range(per)] for t in range(8)]
    want = {}
    for o, v in (w for ws in work for w in ws):
        num = o % (n + 1)
        take = jnp.take(src, idx + o, axis=0, mode="fill", fill_value=0)
        # (jnp.take's fill_value would compile once per value: its where instead)
        want[o] = (jnp.where((jnp.arange(n) < num)[:, None], take, 0),
                   jnp.where((idx + o < rows)[:, None], take, v),
                   jnp.where(cj, x, v), jnp.where(cj, v, x))
    errors, done = [], [0] * 8
    start = threading.Barrier(8)

    def run(t):
        try:
            with jax_ext.implementation(impl):
                start.wait()
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    for o, v in work[t]:
                        got = (jax_ext.gather(src, [o], 0, idx, num_indices=o % (n + 1),
                                              align_bytes=None),
                               jax_ext.gather(src, [o], 0, idx, pad_value=v, align_bytes=None),
                               jax_ext.where(cj, x, v), jax_ext.select(cj, v, x))
                        for g, w in zip(got, want[o]):
                            assert_bits_equal(g, w)
                        done[t] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))
    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors[:3]
    assert all(d >= per for d in done), done
    assert len(_eager._INTS) <= 256  # 800 offsets went through: the oldest were evicted


def _transfers(capfd, call, times=3):
    """Host-to-device transfers that `times` calls of `call` make (jax's transfer guard
    logs each one), after a first call."""
    call()
    capfd.readouterr()
    with jax.transfer_guard_host_to_device("log"):
        for _ in range(times):
            jax.block_until_ready(call())
    return capfd.readouterr().err.count("host-to-device transfer")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_python_scalar_costs_the_transfer_jnp_pays(capfd, impl):
    """A Python scalar travels to the device once per call, as jnp.where's does; gather's
    Python-int offsets and num_indices are device arrays made once (none per call)."""
    x = jnp.asarray(rng.standard_normal(12), jnp.float32)
    c, src, idx = jnp.asarray(C), jnp.asarray(SRC), jnp.asarray(IDX)
    jnp_where = _transfers(capfd, lambda: jnp.where(c, x, 0.25))
    assert jnp_where == 3
    with jax_ext.implementation(impl):
        assert _transfers(capfd, lambda: jax_ext.where(c, x, 0.25)) == jnp_where
        assert _transfers(capfd, lambda: jax_ext.select(c, 0.25, x)) == jnp_where
        assert _transfers(capfd, lambda: jax_ext.gather(src, [1], 0, idx, pad_value=0.25)) == 3
        assert _transfers(capfd, lambda: jax_ext.gather(src, [1], 0, idx, num_indices=2)) == 0
