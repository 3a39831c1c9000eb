// Writing large results: non-temporal (streaming) stores and transparent huge pages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace jax_ext {

// Results at least this large do not fit in the last-level cache: they are written with
// non-temporal stores, which skip reading each destination line before overwriting it.
// The scatter-add's result streams from kStreamBytes (ScatterStreamBytes). Results the select and
// the gather copy into stream only from kStreamCopyBytes: below it regular stores were as
// fast, and they leave the result's tail in cache for whatever reads it next
// (docs/performance.md, "Streaming stores for 16-32 MiB results").
constexpr int64_t kStreamBytes = int64_t{16} << 20;
constexpr int64_t kStreamCopyBytes = 4 * kStreamBytes;

// The size from which the scatter-add streams its result: kStreamBytes, or half the
// last-level cache where the C library reports one larger than 32 MiB. A result that fits
// in half of such a cache is faster written with regular stores, for the kernel and for
// whatever runs next: streamed lines leave the cache that would have held them (see
// docs/performance.md, "Tuning the output-row sweep on a machine with a large last-level
// cache"). The environment
// variable JAX_EXT_SCATTER_STREAM_BYTES, read once, sets it instead (the test suite sets
// 16 MiB, so that the same tests reach the streaming stores on every machine).
inline int64_t ScatterStreamBytes() {
  static const int64_t bytes = [] {
    if (const char* v = std::getenv("JAX_EXT_SCATTER_STREAM_BYTES")) {
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (end != v && *end == '\0' && n > 0) return static_cast<int64_t>(n);
    }
    int64_t llc = 0;
#if defined(__linux__) && defined(_SC_LEVEL3_CACHE_SIZE)
    llc = std::max<int64_t>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
#endif
    return std::max(kStreamBytes, llc / 2);
  }();
  return bytes;
}

#if defined(__SSE2__)
// Moves 64 bytes: four 16-byte loads, then four stores, non-temporal (d 16-byte aligned)
// when Stream.
template <bool Stream>
inline void Move64(uint8_t* d, const uint8_t* s) {
  __m128i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * k));
  for (int k = 0; k < 4; ++k) {
    if constexpr (Stream)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
  }
}
#endif

// Copies `bytes` with non-temporal stores where the target allows.
inline void StreamBytes(void* dst, const void* src, int64_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) Move64</*stream=*/true>(d + i, s + i);
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, static_cast<size_t>(bytes - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

// Copies B bytes, B a multiple of 64, with 16-byte moves. GCC expands a constant
// memcpy larger than 256 bytes into `rep movsq`, whose start-up cost is paid per row.
template <int64_t B>
inline void CopyFixed(void* dst, const void* src) {
  static_assert(B % 64 == 0, "whole 64-byte blocks");
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < B; i += 64) Move64</*stream=*/false>(d + i, s + i);
#else
  std::memcpy(dst, src, static_cast<size_t>(B));
#endif
}

// Zeroes `bytes`, with non-temporal stores when `stream`.
inline void ZeroBytes(void* dst, int64_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    auto* d = static_cast<uint8_t*>(dst);
    const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
    std::memset(d, 0, static_cast<size_t>(head));
    int64_t i = head;
    const __m128i z = _mm_setzero_si128();
    for (; i + 16 <= bytes; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), z);
    std::memset(d + i, 0, static_cast<size_t>(bytes - i));
    return;
  }
#endif
  std::memset(dst, 0, static_cast<size_t>(bytes));
}

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
#endif
}

// A fresh result buffer of many MiB is mapped by the kernel one 4 KiB page fault at a
// time on first write, and those faults cost more than the copy itself. Asking for
// transparent huge pages on the buffer's 2 MiB-aligned interior cuts them 512-fold. A
// buffer the allocator is reusing (already resident, see FreshInterior) is left alone:
// there the hint only adds compaction work. Failure is ignored.
constexpr uintptr_t kHugeBytes = uintptr_t{2} << 20;

// The 2 MiB-aligned interior [*b, *e) of a buffer; false when it has none or it is
// already resident (a buffer the allocator is reusing). Residency is sampled at the
// middle and the last page of the interior, not at its start: inside a program the first
// pages of a fresh result can be resident before the kernel runs, and taking such a
// buffer for a reused one would leave the rest to fault 4 KiB at a time.
inline bool FreshInterior(void* data, size_t bytes, uintptr_t* b, uintptr_t* e) {
#if defined(__linux__)
  if (bytes < kHugeBytes) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  *b = (p + kHugeBytes - 1) & ~(kHugeBytes - 1);
  *e = (p + bytes) & ~(kHugeBytes - 1);
  if (*e <= *b) return false;
  auto resident = [](uintptr_t page) {
    unsigned char r = 0;
    return mincore(reinterpret_cast<void*>(page & ~uintptr_t{4095}), 4096, &r) == 0 && (r & 1);
  };
  return !resident(*b + (*e - *b) / 2) && !resident(*e - 4096);
#else
  (void)data, (void)bytes, (void)b, (void)e;
  return false;
#endif
}

// Maps a fresh result's interior as huge pages, from the calling thread, before the
// kernel's threads write it: huge pages faulted from several threads at once can stall
// one of them for a long time on a virtual machine, and mapping from one thread removes
// that tail at a small cost to the median. Contents are unchanged (fresh anonymous memory
// reads as zero either way). A kernel without MADV_POPULATE_WRITE (before Linux 5.14)
// refuses it and the pages fault on first write, as huge pages still.
//
// Returns true when it mapped the buffer: its lines were just zeroed through the cache,
// so the kernels then write it with regular stores (PrepareResult); non-temporal ones
// would evict those lines and go to memory. The measurements are in docs/performance.md
// ("Huge pages mapped by several threads", "Streaming stores for 16-32 MiB results").
inline bool PrefaultFresh(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  uintptr_t b, e;
  if (!FreshInterior(data, bytes, &b, &e)) return false;
  madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
  return madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_WRITE) == 0;
#else
  return false;
#endif
#else
  (void)data, (void)bytes;
  return false;
#endif
}

// Readies a result for a kernel's writes and says how to write it: a fresh result is
// mapped (PrefaultFresh) and written with regular stores; a reused one of at least
// `stream_from` bytes with streaming stores. Returns true for streaming.
inline bool PrepareResult(void* data, size_t bytes, int64_t stream_from) {
  const bool fresh = PrefaultFresh(data, bytes);
  return !fresh && static_cast<int64_t>(bytes) >= stream_from;
}

}  // namespace jax_ext
