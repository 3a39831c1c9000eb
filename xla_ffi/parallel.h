// Splitting a range of work over XLA's CPU intra-op thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "memory.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

// Runs fn(begin, end) over chunks that cover [0, n) exactly once.
//
// Enough work per chunk (`min_chunk` units) keeps scheduling overhead small, and there
// are at most as many chunks as pool threads. The calling thread claims chunks too, so
// the call completes even when the pool runs our tasks late or inline; afterwards it
// waits only for chunks another thread has already claimed (and is running). A task
// that starts after every chunk is claimed returns without touching `fn`, which is why
// the shared counters live on the heap and outlive this call.
template <typename Fn>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, int64_t min_chunk, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunks = std::clamp<int64_t>(n / std::max<int64_t>(1, min_chunk), 1, threads);
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0};
    int64_t done = 0;  // guarded by mu
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  const int64_t per = n / chunks, extra = n % chunks;
  auto run_chunks = [state, chunks, per, extra, &fn]() {
    for (;;) {
      const int64_t k = state->next.fetch_add(1);
      if (k >= chunks) return;
      const int64_t begin = k * per + std::min(k, extra);
      fn(begin, begin + per + (k < extra ? 1 : 0));
      std::lock_guard<std::mutex> lock(state->mu);
      if (++state->done == chunks) state->cv.notify_all();
    }
  };
  for (int64_t t = 1; t < chunks; ++t) pool.Schedule(decltype(run_chunks)(run_chunks));
  run_chunks();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done == chunks; });
}

// Maps (and lets the kernel zero) a fresh result's huge pages before the kernel writes
// it, split over the pool: each thread faults in its own contiguous range. Writing
// threads that interleave small blocks fault the same 2 MiB page at once, and the kernel
// zeroes it once per faulting thread and keeps one. Contents are unchanged (fresh
// anonymous memory reads as zero either way) and only the buffer's own pages are
// touched; a kernel without MADV_POPULATE_WRITE (before Linux 5.14) refuses it and the
// pages fault on first write as before.
inline void PrefaultFresh(xla::ffi::ThreadPool& pool, void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  uintptr_t b, e;
  if (!FreshInterior(data, bytes, &b, &e)) return;
#if defined(MADV_HUGEPAGE)
  madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#endif
  const int64_t pages = static_cast<int64_t>((e - b) / kHugeBytes);
  ParallelFor(pool, pages, int64_t{1}, [&](int64_t p0, int64_t p1) {
    madvise(reinterpret_cast<void*>(b + static_cast<uintptr_t>(p0) * kHugeBytes),
            static_cast<size_t>(p1 - p0) * kHugeBytes, MADV_POPULATE_WRITE);
  });
#else
  AdviseHugePages(data, bytes);
  (void)pool;
#endif
}

}  // namespace jax_ext
