// Pieces shared by the kernels: element-width dispatch and argument checks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "xla/ffi/api/ffi.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace jax_ext {

namespace ffi = xla::ffi;

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

// Results at least this large do not fit in the last-level cache: rows are written with
// non-temporal stores, which skip reading each destination line before overwriting it.
constexpr int64_t kStreamBytes = int64_t{16} << 20;

// Copies `bytes` with non-temporal stores where the target allows.
inline void StreamBytes(void* dst, const void* src, int64_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, static_cast<size_t>(bytes - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
#endif
}

// A fresh result buffer of many MiB is mapped by the kernel one 4 KiB page fault at a
// time on first write, and those faults cost more than the copy itself. Asking for
// transparent huge pages on the buffer's 2 MiB-aligned interior cuts them 512-fold. A
// buffer the allocator is reusing (its first page already resident) is left alone:
// there the hint only adds compaction work. Failure is ignored.
constexpr uintptr_t kHugeBytes = uintptr_t{2} << 20;

// The 2 MiB-aligned interior [*b, *e) of a buffer; false when it has none or its first
// huge page is already resident (a buffer the allocator is reusing).
inline bool FreshInterior(void* data, size_t bytes, uintptr_t* b, uintptr_t* e) {
#if defined(__linux__)
  if (bytes < kHugeBytes) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  *b = (p + kHugeBytes - 1) & ~(kHugeBytes - 1);
  *e = (p + bytes) & ~(kHugeBytes - 1);
  if (*e <= *b) return false;
  unsigned char resident = 0;
  return !(mincore(reinterpret_cast<void*>(*b), 4096, &resident) == 0 && (resident & 1));
#else
  (void)data, (void)bytes, (void)b, (void)e;
  return false;
#endif
}

// Returns true when the hint was given (the buffer is fresh).
inline bool AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  uintptr_t b, e;
  if (!FreshInterior(data, bytes, &b, &e)) return false;
  madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
  return true;
#else
  (void)data;
  (void)bytes;
  return false;
#endif
}

}  // namespace jax_ext
