// What the kernels share besides memory (memory.h): error propagation, limits, element-width
// dispatch and argument checks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jax_ext {

namespace ffi = xla::ffi;

// Returns the ffi::Error of `expr` from the enclosing function when it is a failure, as
// jaxlib's FFI_RETURN_IF_ERROR (jaxlib/ffi_helpers.h) does.
#define JAX_EXT_RETURN_IF_ERROR(expr)                                        \
  do {                                                                       \
    if (::xla::ffi::Error jax_ext_error_ = (expr); jax_ext_error_.failure()) \
      return jax_ext_error_;                                                 \
  } while (0)

// Largest rank of an array the kernels walk (select's collapsed result, gather's src):
// their index state lives in fixed arrays of this size.
constexpr int kMaxRank = 64;

// Work per task below which splitting over the thread pool does not pay for scheduling.
// Each kernel has its own value (select's is four times gather's), named apart so that
// changing one does not move the other. Gather and scatter-add share theirs.
constexpr int64_t kSelectMinChunkBytes = int64_t{1} << 18;
constexpr int64_t kGatherMinChunkBytes = int64_t{1} << 16;

// The kernels only move bytes, so they are keyed on element width, not dtype: every
// JAX dtype maps onto one of five unsigned types and bits are copied exactly (NaN
// payloads, -0.0, signalling NaNs).
struct U128 {
  uint64_t lo, hi;
};

// Calls f(T{}) with the unsigned type of `width` bytes.
template <typename F>
ffi::Error DispatchWidth(size_t width, F&& f) {
  switch (width) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    case 16: return f(U128{});
    default:
      return ffi::Error::InvalidArgument("unsupported element width " + std::to_string(width) +
                                         " bytes");
  }
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

// Branch-free choice: reads both sides (they are always in bounds) so loops vectorize.
template <typename T>
inline T Pick(uint8_t c, T x, T y) {
  const T m = static_cast<T>(-static_cast<T>(c != 0));
  return static_cast<T>((x & m) | (y & static_cast<T>(~m)));
}
template <>
inline U128 Pick<U128>(uint8_t c, U128 x, U128 y) {
  const uint64_t m = -static_cast<uint64_t>(c != 0);
  return {(x.lo & m) | (y.lo & ~m), (x.hi & m) | (y.hi & ~m)};
}

inline std::string ShapeString(ffi::Span<const int64_t> s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

}  // namespace jax_ext
