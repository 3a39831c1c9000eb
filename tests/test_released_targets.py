"""Programs exported by an earlier jax_ext keep running, bit for bit.

tests/data holds programs serialized with ``jax.export`` by the jax_ext of an earlier
release (tests/data/README.md says what each one holds): for each of select, gather and
scatter-add, one with static shapes (the ``*_v1`` targets, shapes and strides as
attributes) and one with symbolic dimensions (the ``*_v2`` targets, shapes read from the
buffers), written by the oldest and the newest supported jax. They are not regenerated
when the kernels change: they are what users hold, and every later jax_ext must run them.
Each is deserialized, called on fixed inputs (at several sizes for the symbolic ones) and
compared with numpy bit for bit.
"""
import pathlib
import re

import jax
import numpy as np
import pytest

import jax_ext
from references import assert_bits_equal, np_select, random_values

DATA = pathlib.Path(__file__).parent / "data"
ARTIFACTS = sorted(p.name for p in DATA.glob("*.jaxexport"))
RELEASED = [f"jax_ext_{op}_{v}" for op in ("select", "gather", "scatter_add")
            for v in ("v1", "v2")]
f32, i32 = np.float32, np.int32
# A float32 NaN with a payload, as pad value: it must arrive bit for bit.
NAN_PAD = np.array(0x7FC00123, np.uint32).view(f32)


def _exact(rng, shape):
    """Values whose sums of doubles are exact in float32 (quarters in [-8, 8))."""
    return (rng.integers(-32, 32, shape) / 4).astype(f32)


def _ceil_to(n, m):
    return -(-n // m) * m


def _rows(rows, start, idx, *, k=None, pad=0.0, width=None, check=True):
    """numpy reference of a gather from `rows` (row r is rows[r]): out[i] is rows[start +
    idx[i]] for i < k when in range (clamped without check), else pad; each row's last
    dim padded with pad to `width`."""
    n, last = len(idx), rows.shape[-1]
    width = last if width is None else width
    pad_bits = np.asarray(pad, f32).view(np.uint32)
    out = np.full((n,) + rows.shape[1:-1] + (width,), pad_bits, np.uint32)
    bits = rows.view(np.uint32)
    for i in range(min(n, len(idx) if k is None else k)):
        r = start + int(idx[i])
        if not 0 <= r < len(rows):
            if check:
                continue
            r = min(max(r, 0), len(rows) - 1)
        out[i, ..., :last] = bits[r]
    return out.view(f32)


def _add_rows(out, rows_of, idx_rows):
    """Adds 2 * rows_of[r] into out[r] for each r in idx_rows, in order (the gradient of
    a sum of squares of gathered rows)."""
    for r in idx_rows:
        out[r] += f32(2) * rows_of[r]


# --- per op: fixed inputs at the static shapes (first) and at other sizes, and numpy ---

def _select_inputs(rng, r, c, b):
    return (rng.integers(0, 2, (r, 1)).astype(bool), random_values(rng, (r, c), f32),
            random_values(rng, (c,), f32), rng.integers(0, 2, (b, c)).astype(bool),
            random_values(rng, (c,), f32), random_values(rng, (c, b), f32))


def _select_want(c, x, y, c2, x2, y2):
    return [np_select(c, x, y, x.shape), np_select(c2, x2[None], y2.T, c2.shape)]


def _gather_inputs(rng, r, c, n, b, m, d, q, e):
    return (random_values(rng, (r, 4, c), f32), rng.integers(-2, r + 2, n).astype(i32),
            i32(max(n - 2, 0)), rng.integers(-3, 5, (b, m)).astype(i32), NAN_PAD,
            random_values(rng, (d, q, c), f32), rng.integers(-3, q + 3, (d, e)).astype(i32))


def _gather_want(src, idx, k, idx2, p, srcb, idx3):
    c = src.shape[-1]
    a = _rows(src, 0, idx, k=int(k), width=_ceil_to(4 * c, 32) // 4)
    b = np.stack([_rows(src[2], 1, i, pad=p) for i in idx2])
    cc = np.stack([_rows(s, 1, i, width=_ceil_to(4 * c, 8) // 4, check=False)
                   for s, i in zip(srcb, idx3)])
    return [a, b, cc]


def _scatter_inputs(rng, r, c, n, b, m):
    return (_exact(rng, (r, 4, c)), rng.integers(-2, r + 2, n).astype(i32),
            rng.integers(-3, 5, (b, m)).astype(i32))


def _scatter_want(src, idx, idx2):
    g1 = np.zeros_like(src)
    _add_rows(g1, src, [int(i) for i in idx if 0 <= i < len(src)])
    g2 = np.zeros_like(src)
    _add_rows(g2[2], src[2], [min(max(1 + int(i), 0), 3) for i in idx2.reshape(-1)])
    return [g1, g2]


# op -> (inputs(rng, *sizes), numpy reference, [sizes]); the first sizes are the static
# export's shapes, the others run the symbolic exports at sizes they were not traced at.
OPS = {
    "select": (_select_inputs, _select_want, [(3, 4, 5), (1, 1, 1), (6, 9, 2)]),
    "gather": (_gather_inputs, _gather_want,
               [(6, 3, 5, 3, 4, 2, 5, 3), (7, 5, 6, 2, 3, 3, 4, 5), (3, 9, 1, 1, 7, 1, 2, 6)]),
    "scatter_add": (_scatter_inputs, _scatter_want, [(6, 3, 5, 3, 4), (5, 6, 7, 2, 5),
                                                     (3, 1, 2, 4, 1)]),
}


def _version(v):
    return tuple(int(x) for x in v.split("."))


def _readable(writer):
    """Whether the running jax reads what jax `writer` serialized: a jax reads exports of
    its own and older versions only. (jax 0.12 reads 0.10.2's; 0.10.2 deserializes 0.12's
    flatbuffer, but not the StableHLO inside: its custom calls are `vhlo.custom_call_v2`,
    an operation 0.10.2's StableHLO does not know.)"""
    return _version(writer) <= _version(jax.__version__)


def _parse(name):
    op, ver, writer = re.fullmatch(r"(\w+?)_(v\d)\.jax([\d_]+)\.jaxexport", name).groups()
    return op, ver, writer.replace("_", ".")


def test_the_artifacts_cover_every_released_target_from_both_jax_ends():
    writers = {}
    for name in ARTIFACTS:
        op, ver, writer = _parse(name)
        writers.setdefault(writer, set()).add(f"jax_ext_{op}_{ver}")
    assert set(writers) == {"0.10.2", "0.12.0.1"}, writers
    for targets in writers.values():
        assert targets == set(RELEASED)


@pytest.mark.skipif(not jax_ext.native_available(), reason="needs the native module")
def test_released_targets_are_in_export_checks():
    text = " ".join(map(str, jax_ext.export_checks()))
    for t in RELEASED:
        assert t in text, t


# What jax raises for an export older than its compatibility window (jax 0.12: six months;
# jax_export_deserialize_expired_versions lets it try anyway). Only that, from jax, means
# "this jax no longer reads that format"; any other failure is a break of jax_ext.
EXPIRED = re.compile(r"^Exported being deserialized seems to be older than the \S+ "
                     r"backward-compatibility window")
EXPIRED_OPTION = "jax_export_deserialize_expired_versions"


def _expired(e):
    """jax's message when `e` says the export is past jax's compatibility window, else
    None."""
    return str(e) if isinstance(e, ValueError) and EXPIRED.match(str(e)) else None


def _deserialize(name):
    """The export in tests/data/`name`; skipped (with jax's reason) where this jax no
    longer reads its format even with EXPIRED_OPTION, the escape hatch jax offers."""
    blob = bytearray((DATA / name).read_bytes())
    try:
        return jax.export.deserialize(blob)
    except ValueError as e:
        if _expired(e) is None or EXPIRED_OPTION not in jax.config.values:
            raise
        first = _expired(e)
    old = jax.config.values[EXPIRED_OPTION]
    jax.config.update(EXPIRED_OPTION, True)
    try:
        return jax.export.deserialize(blob)
    except ValueError as e:
        if _expired(e) is None:
            raise
        pytest.skip(f"jax {jax.__version__} no longer reads this export's format, even with "
                    f"{EXPIRED_OPTION}: {first}")
    finally:
        jax.config.update(EXPIRED_OPTION, old)


@pytest.mark.skipif(not jax_ext.native_available(), reason="needs the native module")
@pytest.mark.parametrize("name", ARTIFACTS)
def test_a_released_export_runs_bit_for_bit(name):
    op, ver, writer = _parse(name)
    if not _readable(writer):
        pytest.skip(f"written by jax {writer}, newer than this jax {jax.__version__}")
    exp = _deserialize(name)
    text = exp.mlir_module()
    assert f"@jax_ext_{op}_{ver}" in text, name  # the released target it is here for
    assert not re.search(rf"@jax_ext_\w+_{'v2' if ver == 'v1' else 'v1'}\b", text), name
    inputs, want, sizes = OPS[op]
    for k, size in enumerate(sizes if ver == "v2" else sizes[:1]):
        args = inputs(np.random.default_rng(k), *size)
        got = jax.tree.leaves(exp.call(*args))
        ref = want(*args)
        assert len(got) == len(ref), name
        for g, w in zip(got, ref):
            assert_bits_equal(np.asarray(g), w)


def test_only_jaxs_expiry_is_told_apart_from_a_break():
    """The skip above takes jax's own expiry message (built by jax's own function where it
    has one), and nothing else: a damaged artifact fails."""
    try:
        from jax._src.export.serialization import _expired_error_msg
    except ImportError:  # jax 0.10.2: no compatibility window to expire
        msg = None
    else:
        class Old:  # what the message reads of a serialized export
            def SerializationVersion(self):
                return 2

            def JaxVersion(self):
                return b"0.4.30"
        msg = _expired_error_msg(Old())
        assert _expired(ValueError(msg)) == msg
    blob = bytearray((DATA / ARTIFACTS[0]).read_bytes())
    with pytest.raises(Exception) as info:
        jax.export.deserialize(blob[: len(blob) // 2])
    assert _expired(info.value) is None, info.value
    assert _expired(ValueError("unsupported custom call jax_ext_select_v1")) is None
    assert _expired(RuntimeError(msg or "older than the window")) is None


@pytest.mark.skipif(EXPIRED_OPTION not in jax.config.values,
                    reason="this jax has no compatibility window (jax 0.10.2)")
def test_an_expired_export_is_read_with_jaxs_option_else_skipped(monkeypatch):
    msg = ("Exported being deserialized seems to be older than the 6-month "
           "backward-compatibility window and cannot be deserialized anymore.")
    calls = []

    def deserialize(blob, expired_too):
        calls.append(jax.config.values[EXPIRED_OPTION])
        if not (expired_too and jax.config.values[EXPIRED_OPTION]):
            raise ValueError(msg)
        return "read"
    monkeypatch.setattr(jax.export, "deserialize", lambda b: deserialize(b, True))
    assert _deserialize(ARTIFACTS[0]) == "read" and calls == [False, True]
    assert jax.config.values[EXPIRED_OPTION] is False  # restored
    monkeypatch.setattr(jax.export, "deserialize", lambda b: deserialize(b, False))
    with pytest.raises(pytest.skip.Exception, match="no longer reads this export's format"):
        _deserialize(ARTIFACTS[0])
    monkeypatch.setattr(jax.export, "deserialize",
                        lambda b: (_ for _ in ()).throw(ValueError("a real break")))
    with pytest.raises(ValueError, match="a real break"):
        _deserialize(ARTIFACTS[0])
