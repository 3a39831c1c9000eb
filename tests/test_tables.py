"""Tables that both the Python package and the C++ kernels hold, tied together: each test
reads the C++ side from xla_ffi/ (or the compiled module) and fails when one side changes
alone. The recipes in docs/design.md name both sides of each."""
import os
import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_ext
from jax_ext import _lowering, _names, _native, _rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FFI = os.path.join(ROOT, "xla_ffi")

pytestmark = pytest.mark.skipif(not os.path.isdir(FFI), reason="needs the source tree")

# xla::ffi::DataType -> the numpy dtype name (the FFI's names, as XLA's PrimitiveType).
XLA_DTYPES = {
    "PRED": "bool", "S1": "int1", "S2": "int2", "S4": "int4", "S8": "int8", "S16": "int16",
    "S32": "int32", "S64": "int64", "U1": "uint1", "U2": "uint2", "U4": "uint4",
    "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "C128": "complex128", "F4E2M1FN": "float4_e2m1fn", "F8E5M2": "float8_e5m2",
    "F8E4M3FN": "float8_e4m3fn", "F8E4M3": "float8_e4m3", "F8E3M4": "float8_e3m4",
}
# The C++ types a sum is formed in -> numpy (lanes of 2 floats are a complex).
CC_TYPES = {("float", 1): "float32", ("double", 1): "float64", ("float", 2): "complex64",
            ("double", 2): "complex128"}


def _dtype(name):
    """The numpy dtype of a name, ml_dtypes' own first (int1, bfloat16, float8_*)."""
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _known(name):
    return hasattr(ml_dtypes, name) or hasattr(np, name)


def _source(name):
    return open(os.path.join(FFI, name)).read()


def _function(text, name):
    """The text of the C++ function `name` (from its name to the closing brace)."""
    start = re.search(rf"\b{name}\s*\(", text)
    assert start, f"no function {name}"
    depth, i = 0, text.index("{", start.end())
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[start.start():j + 1]
    raise AssertionError(f"unclosed {name}")


def _cases(body):
    """[(the DataType names of one case group, what the group returns)] of a switch."""
    out, pending = [], []
    for m in re.finditer(r"case ffi::DataType::(\w+):\s*(return [^;]*;|f\([^;]*;)?", body):
        pending.append(XLA_DTYPES[m.group(1)])
        if m.group(2):
            out.append((pending, m.group(2)))
            pending = []
    return out


def test_sub_byte_dtypes_are_the_ones_the_kernels_refuse():
    """_lowering.SUB_BYTE (routed to lax) == IsSubByte in dispatch.h (refused there), but
    for the dtypes XLA's FFI has no DataType for (the 6-bit floats), which a kernel cannot
    name: their buffers reach it with no width it knows, and it refuses them so."""
    cc = {n for names, _ in _cases(_function(_source("dispatch.h"), "IsSubByte"))
          for n in names if _ in ("return true;",)}
    assert cc == set(_lowering.SUB_BYTE) & set(XLA_DTYPES.values())
    unnamed = set(_lowering.SUB_BYTE) - cc
    assert unnamed == {"float6_e2m3fn", "float6_e3m2fn"}
    import jax.ffi
    header = open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")).read()
    assert "XLA_FFI_DataType_F6E" not in header  # no 6-bit float in the FFI's DataType
    for name in _lowering.SUB_BYTE:
        assert not _lowering.native_dtype_ok(_dtype(name)), name


def test_index_dtypes_are_the_ones_the_kernels_read():
    """Every whole-byte integer dtype jax has goes to the kernel as an index, and those are
    DispatchIndex's cases in dispatch.h."""
    cc = {n for names, _ in _cases(_function(_source("dispatch.h"), "DispatchIndex"))
          for n in names}
    py = {n for n in XLA_DTYPES.values() if _known(n) and n != "bool"
          and jnp.issubdtype(_dtype(n), jnp.integer) and _lowering.native_dtype_ok(_dtype(n))}
    assert cc == py


def test_native_scatter_dtypes_are_the_kernel_s_cases():
    """OpSpec.native_dtypes of the scatter-add == DispatchAccumulate's cases."""
    cc = {n for names, _ in _cases(_function(_source("accumulate.h"), "DispatchAccumulate"))
          for n in names}
    assert cc == set(_names.SCATTER_ADD.native_dtypes)


def test_accumulation_type_is_the_kernel_s():
    """_rows.acc_dtype == the type DispatchAccumulate adds in: floats and complex in
    the C++ type it names, integers in an unsigned type of their own width (two's
    complement wraps alike, so the sum is the dtype's own)."""
    body = _function(_source("accumulate.h"), "DispatchAccumulate")
    for names, ret in _cases(body):
        m = re.match(r"return run\((\w+)\{\},.*?,\s*(\d+)\);", ret)
        assert m, ret
        acc, lanes = m.group(1), int(m.group(2))
        for name in names:
            py = _rows.acc_dtype(_dtype(name))
            if (acc, lanes) in CC_TYPES:
                assert py.name == CC_TYPES[acc, lanes], (name, acc, lanes)
            else:
                assert acc == f"uint{8 * _dtype(name).itemsize}_t", (name, acc)
                assert py == _dtype(name), name


def test_max_rank_is_the_kernels():
    """_native.MAX_RANK (read from the compiled module when it loads) == check.h's
    kMaxRank, and the default before it loads is the same."""
    m = re.search(r"constexpr int kMaxRank = (\d+);", _source("check.h"))
    assert m
    assert _native.MAX_RANK == int(m.group(1))
    src = open(os.path.join(ROOT, "jax_ext", "_native.py")).read()
    assert re.search(rf"^MAX_RANK = {m.group(1)}$", src, re.M)
    if jax_ext.native_available():
        from jax_ext import _jax_ext
        assert _jax_ext.MAX_RANK == int(m.group(1))


def test_element_widths_cover_every_whole_byte_dtype():
    """Every whole-byte dtype's itemsize is a case of DispatchWidth (the kernels move it)."""
    widths = {int(w) for w in re.findall(r"case (\d+):", _function(_source("dispatch.h"),
                                                                  "DispatchWidth"))}
    for name in XLA_DTYPES.values():
        if _known(name):
            dt = _dtype(name)
            if _lowering.native_dtype_ok(dt):
                assert dt.itemsize in widths, name


@pytest.mark.parametrize("table", ["IsSubByte", "DispatchAccumulate"])
def test_the_parser_sees_a_change_on_one_side(table):
    """The parse above is not vacuous: dropping one case from the C++ text changes what
    it reads."""
    src = _source("dispatch.h" if table == "IsSubByte" else "accumulate.h")
    body = _function(src, table)
    first = re.search(r"case ffi::DataType::\w+:", body).group(0)
    assert _cases(body.replace(first, "", 1)) != _cases(body)
