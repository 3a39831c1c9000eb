// Splitting a range of work over XLA's CPU intra-op thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace jax_ext {

// Work per task below which splitting over the thread pool does not pay for scheduling.
// Each kernel has its own value (select's is four times gather's), named apart so that
// changing one does not move the other. Gather and scatter-add share theirs.
constexpr int64_t kSelectMinChunkBytes = int64_t{1} << 18;
constexpr int64_t kGatherMinChunkBytes = int64_t{1} << 16;

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

// Runs fn(begin, end) over blocks of `block` units covering [0, n), handed out one at a
// time from a shared counter: a thread the pool starts late (or never) leaves its blocks
// to the others instead of making the caller wait for them.
template <typename Fn>
void DynamicFor(xla::ffi::ThreadPool& pool, int64_t n, int64_t block, const Fn& fn) {
  if (n <= 0) return;
  block = std::max<int64_t>(1, block);
  const int64_t blocks = (n + block - 1) / block;
  const int64_t tasks =
      std::clamp<int64_t>(blocks / 2, 1, std::max<int64_t>(1, pool.num_threads()));
  if (tasks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  ParallelFor(pool, tasks, 1, [&](int64_t, int64_t) {
    for (;;) {
      const int64_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= blocks) return;
      fn(k * block, std::min(n, (k + 1) * block));
    }
  });
}

}  // namespace jax_ext
