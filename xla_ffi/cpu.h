// What the processor can run, asked once: for the loops compiled twice, for the baseline
// x86-64 the wheels target and for AVX2 (select.cc).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define JAX_EXT_X86_AVX2 1
// A function compiled for AVX2; call it only where HasAvx2().
#define JAX_EXT_TARGET_AVX2 __attribute__((target("avx2")))
#endif

namespace jax_ext {

// True where the processor has AVX2 and the OS saves the AVX registers (cpuid and xgetbv
// directly: the wheels' toolchain links no CPU-model runtime for __builtin_cpu_supports).
inline bool HasAvx2() {
#if defined(JAX_EXT_X86_AVX2)
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return false;  // XMM and YMM state
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace jax_ext
