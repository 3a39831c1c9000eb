// From a buffer's dtype to a C++ type, each list written once: the element width the
// byte-moving kernels are compiled for, and the integer type an index is read as.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "check.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

// The kernels only move bytes, so they are keyed on element width, not dtype: every
// JAX dtype maps onto one of five unsigned types and bits are copied exactly (NaN
// payloads, -0.0, signalling NaNs).
struct U128 {
  uint64_t lo, hi;
};

// Calls f(T{}) with the unsigned type of `width` bytes and returns its error.
template <typename F>
ffi::Error DispatchWidth(const char* op, size_t width, F&& f) {
  switch (width) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    case 16: return f(U128{});
    default: return Invalid(op, "unsupported element width " + Str(width) + " bytes");
  }
}

// Calls f(I{}) with the integer type an index of dtype `t` is read as: any integer of 8 to
// 64 bits. Returns false, without calling f, for any other dtype. Only the code that
// reads index values is compiled per index type (rows.h), not the kernels.
template <typename F>
bool DispatchIndex(ffi::DataType t, F&& f) {
  switch (t) {
    case ffi::DataType::S8: f(int8_t{}); return true;
    case ffi::DataType::S16: f(int16_t{}); return true;
    case ffi::DataType::S32: f(int32_t{}); return true;
    case ffi::DataType::S64: f(int64_t{}); return true;
    case ffi::DataType::U8: f(uint8_t{}); return true;
    case ffi::DataType::U16: f(uint16_t{}); return true;
    case ffi::DataType::U32: f(uint32_t{}); return true;
    case ffi::DataType::U64: f(uint64_t{}); return true;
    default: return false;
  }
}

inline bool IsIndexType(ffi::DataType t) {
  return DispatchIndex(t, [](auto) {});
}

// Sub-byte types (int4, uint4, int2, uint2, float4_e2m1fn) are packed two or more to a
// byte, yet ffi::ByteWidth reports 1 for them: a kernel moving element_count() units of
// ByteWidth bytes would read and write past their buffers. The byte-moving kernels
// refuse them (the Python side routes them to lax; only a direct FFI call gets here).
inline bool IsSubByte(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::S1:
    case ffi::DataType::S2:
    case ffi::DataType::S4:
    case ffi::DataType::U1:
    case ffi::DataType::U2:
    case ffi::DataType::U4:
    case ffi::DataType::F4E2M1FN: return true;
    default: return false;
  }
}

// A dtype the byte-moving kernels take: whole bytes per element.
inline ffi::Error CheckWholeBytes(const char* op, ffi::DataType t) {
  if (IsSubByte(t)) return Invalid(op, "sub-byte dtypes are not supported");
  return ffi::Error::Success();
}

// A buffer holds the bits of `want` where its dtype `got` is `want`, or where one of the two
// is the unsigned integer of the other's width: a value that crossed devices as such (its
// wire type, jax_ext/_partition.py): a scatter-add's cotangent gathered across devices, a
// gather's rows given as wire values for an integer sum. The kernel reads it as `want`.
inline bool IsUnsignedInt(ffi::DataType t) {
  return t == ffi::DataType::U8 || t == ffi::DataType::U16 || t == ffi::DataType::U32 ||
         t == ffi::DataType::U64;
}
inline ffi::Error CheckDtypeOrWire(const char* op, const char* what, ffi::DataType want,
                                   ffi::DataType got) {
  if (got == want) return ffi::Error::Success();
  // bool crosses as uint8: a bool buffer's bytes (0 or 1) read as uint8, never the reverse
  if (want == ffi::DataType::U8 && got == ffi::DataType::PRED) return ffi::Error::Success();
  const bool wire = (IsUnsignedInt(want) || IsUnsignedInt(got)) && !IsSubByte(want) &&
                    !IsSubByte(got) && want != ffi::DataType::PRED && got != ffi::DataType::PRED &&
                    ffi::ByteWidth(want) == ffi::ByteWidth(got);
  if (wire) return ffi::Error::Success();
  return Invalid(op, std::string(what) + " differ in dtype");
}

}  // namespace jax_ext
