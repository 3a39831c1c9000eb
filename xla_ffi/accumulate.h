// Adding rows into rows in a fixed order, shared by the scatter-add (gather's transpose)
// and update_rows (which sums a gather's cotangent rows per distinct row): a target per
// source row, the output row it adds into (kFirst marks the row's first contribution, -1
// a dropped row), and the adds. Every output element receives its contributions in source
// order whatever the thread count: threads own disjoint output rows (long rows,
// contributions sorted stably by row; short rows) or disjoint columns (long rows of few
// output rows), never the same element, so there are no lost updates and the result is
// deterministic. float16/bfloat16 accumulate in float32 and round once at the end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "check.h"
#include "memory.h"
#include "parallel.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

constexpr int64_t kFirst = int64_t{1} << 62;  // target flag: the row's first contribution

inline float Bf16ToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t F32ToBf16(float f) {  // round to nearest even; NaN -> canonical quiet NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u & 0x80000000u) ? 0xffc0 : 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float F16ToF32(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t F32ToF16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

// How a dtype is accumulated: as Acc, converted from and to the stored 16-bit floats for
// kF16 and kBF16.
enum class Conv { kNone, kF16, kBF16 };

// The end of the run of output rows from t on that no contribution reaches (clear in
// `seen`), at most re; whole clear words of `seen` are skipped at once.
inline int64_t UnreachedEnd(const uint64_t* seen, int64_t t, int64_t re) {
  int64_t z = t;
  while (z < re && !(seen[z >> 6] >> (z & 63) & 1)) {
    if ((z & 63) == 0 && z + 64 <= re && seen[z >> 6] == 0)
      z += 64;
    else
      ++z;
  }
  return z;
}

// Zeroes the output rows of E Acc values no contribution reaches (clear in `seen`), and
// the tail past the last whole row, with non-temporal stores when `stream`.
template <typename Acc>
void ZeroUnreachedRows(ffi::ThreadPool& pool, Acc* acc, int64_t E, int64_t out_n,
                       const uint64_t* seen, bool stream) {
  const int64_t out_rows = E > 0 ? out_n / E : 0;
  const int64_t row_bytes = E * int64_t(sizeof(Acc));
  const int64_t min_rows =
      std::max<int64_t>(1, kGatherMinChunkBytes / std::max<int64_t>(1, row_bytes));
  ParallelFor(pool, out_rows, min_rows, [&](int64_t rb, int64_t re) {
    for (int64_t t = rb; t < re;) {
      const int64_t z = UnreachedEnd(seen, t, re);
      if (z > t) ZeroBytes(acc + t * E, (z - t) * row_bytes, stream);
      t = std::max(z, t + 1);  // past the run, or past a reached row
    }
    if (stream) StreamFence();
  });
  if (out_rows * E < out_n)
    std::memset(acc + out_rows * E, 0, static_cast<size_t>(out_n - out_rows * E) * sizeof(Acc));
}

// Adds columns [c0, c1) of ct row u into output row t of `acc` (stores them into a zero
// when kFirst in t marks the row's first contribution). Counts are in Acc values.
template <typename Acc, Conv C>
struct RowAdder {
  using Stored = std::conditional_t<C == Conv::kNone, Acc, uint16_t>;
  const Stored* ct;
  Acc* acc;
  int64_t E;       // per src row
  int64_t L;       // per padded ct sub-row
  int64_t last;    // per src sub-row
  int64_t row_ct;  // per ct row
  bool stream;

  static Acc Load(Stored v) {
    if constexpr (C == Conv::kF16)
      return F16ToF32(v);
    else if constexpr (C == Conv::kBF16)
      return Bf16ToF32(v);
    else
      return v;
  }

  template <bool kFirstAdd>
  void AddCols(const Stored* __restrict cr, Acc* __restrict arow, int64_t a, int64_t z) const {
    if constexpr (kFirstAdd) {
#if defined(__SSE2__)
      if constexpr (C == Conv::kNone && std::is_same_v<Acc, float>) {
        if (stream) {
          // Written without reading the line first; a later add reads it back.
          for (; a < z && reinterpret_cast<uintptr_t>(arow + a) % 16 != 0; ++a)
            arow[a] = 0.0f + cr[a];
          const __m128 zero = _mm_setzero_ps();
          for (; a + 4 <= z; a += 4)
            _mm_stream_ps(arow + a, _mm_add_ps(zero, _mm_loadu_ps(cr + a)));
        }
      }
#endif
      for (int64_t c = a; c < z; ++c) arow[c] = static_cast<Acc>(Acc{0} + Load(cr[c]));
    } else {
      for (int64_t c = a; c < z; ++c) arow[c] += Load(cr[c]);
    }
  }

  void operator()(int64_t u, int64_t tt, int64_t c0, int64_t c1) const {
    const bool first = (tt & kFirst) != 0;
    const int64_t t = tt & ~kFirst;
    const Stored* crow = ct + u * row_ct;
    Acc* arow = acc + t * E;
    auto go = [&](const Stored* cr, int64_t a, int64_t z) {
      if (first)
        AddCols<true>(cr, arow, a, z);
      else
        AddCols<false>(cr, arow, a, z);
    };
    if (L == last) {
      go(crow, c0, c1);
    } else {
      for (int64_t j = c0 / last; j * last < c1; ++j) {
        const int64_t a = std::max(c0, j * last), z = std::min(c1, (j + 1) * last);
        go(crow + j * L - j * last, a, z);
      }
    }
  }
};

// Adds columns [c0, c1) of every ct row into its target row. Output rows are hit in random
// order: the owned part of the rows a few targets ahead (about 4 KiB in flight) is
// prefetched for writing, unless a first contribution will stream into it (`nt_first`),
// which needs no read of the line.
template <typename Acc, Conv C>
void AddColumnRange(const RowAdder<Acc, C>& add, const int64_t* targets, int64_t total_rows,
                    int64_t c0, int64_t c1, bool nt_first) {
  const int64_t span = (c1 - c0) * int64_t(sizeof(Acc));
  const int64_t ahead = std::clamp<int64_t>(4096 / std::max<int64_t>(1, span), 2, 64);
  for (int64_t u = 0; u < total_rows; ++u) {
    const int64_t next = u + ahead < total_rows ? targets[u + ahead] : -1;
    if (next >= 0 && !(nt_first && (next & kFirst))) {
      const char* p = reinterpret_cast<const char*>(add.acc + (next & ~kFirst) * add.E + c0);
      for (int64_t q = 0; q < span; q += 64) __builtin_prefetch(p + q, 1, 3);
    }
    if (targets[u] >= 0) add(u, targets[u], c0, c1);
  }
}

// Columns a task owns of every output row, at least. Each task visits every target row
// in random order, so splitting a row over tasks multiplies the random accesses: a split
// pays only where each task's share of a row is long, and rows shorter than two such
// shares are added by the calling thread alone (see docs/performance.md, "Splitting the
// scatter-add's rows").
constexpr int64_t kMinTaskColumns = 256;

// Long rows: each task owns a column range of every output row.
template <typename Acc, Conv C>
void AddByColumns(ffi::ThreadPool& pool, const RowAdder<Acc, C>& add, const int64_t* targets,
                  int64_t total_rows, int64_t threads, bool nt_first) {
  const int64_t E = add.E;
  const int64_t tasks = std::clamp<int64_t>(E / kMinTaskColumns, 1, threads);
  ParallelFor(pool, tasks, 1, [&](int64_t tb, int64_t te) {
    for (int64_t tk = tb; tk < te; ++tk) {
      const int64_t c0 = (E * tk / tasks) & ~int64_t{15};
      const int64_t c1 = tk + 1 == tasks ? E : (E * (tk + 1) / tasks) & ~int64_t{15};
      AddColumnRange(add, targets, total_rows, c0, c1, nt_first);
    }
    if (add.stream) StreamFence();
  });
}

// Long rows: the contributions sorted by output row (a stable counting sort, so each row
// still receives them in ct order), then each task writes a range of output rows once, in
// order, reading the ct rows it needs (prefetched 8 KiB ahead into every cache level:
// non-temporal prefetches, which skip the outer levels, made the sweep slower where the
// last-level cache is large). A row with one contribution streams straight
// into the output; one with several is summed in a cache-resident row first and then
// streamed; a run of rows with none is zeroed in the same sweep, not in a pass of its own
// (unreached rows come in runs of one or two scattered over the result, and a separate pass
// would visit every line twice). So each output line is written once, in address order, and
// never read, instead of read and written at random as contributions arrive (see
// docs/performance.md, "Adding the contributions in output-row order" and "Tuning the
// output-row sweep on a machine with a large last-level cache").
// I: the index type of the sort's two arrays, 32-bit where the rows fit (under a low mmap
// threshold each array is a fresh mapping per call, a page fault per 4 KiB).
template <typename I, typename Acc, Conv C>
void AddBySortedRows(ffi::ThreadPool& pool, const RowAdder<Acc, C>& add, const int64_t* targets,
                     int64_t total_rows, int64_t out_rows, int64_t threads) {
  std::vector<I> start(static_cast<size_t>(out_rows) + 1, 0);
  for (int64_t u = 0; u < total_rows; ++u)
    if (targets[u] >= 0) ++start[(targets[u] & ~kFirst) + 1];
  for (int64_t t = 0; t < out_rows; ++t) start[t + 1] += start[t];
  std::unique_ptr<I[]> order(new I[static_cast<size_t>(start[out_rows])]);
  // start[t] serves as row t's cursor, which ends at row t + 1's start; shifted back after.
  for (int64_t u = 0; u < total_rows; ++u)
    if (targets[u] >= 0) order[start[targets[u] & ~kFirst]++] = static_cast<I>(u);
  for (int64_t t = out_rows; t > 0; --t) start[t] = start[t - 1];
  start[0] = 0;
  using Stored = typename RowAdder<Acc, C>::Stored;
  const int64_t E = add.E;
  const int64_t span = std::min<int64_t>(E, add.row_ct) * int64_t(sizeof(Stored));
  const int64_t ahead = std::clamp<int64_t>(8192 / std::max<int64_t>(1, span), 2, 64);
  // Blocks of rows handed out one at a time (16 per thread): a pool thread that wakes late
  // still takes its share of what is left. With one half each, a helper that woke after
  // the caller's half (it happened after the caller had spent milliseconds mapping a fresh
  // result) left the caller both halves, and the call took twice as long.
  const int64_t block = std::max<int64_t>(1, out_rows / (16 * threads));
  DynamicFor(pool, out_rows, block, [&](int64_t rb, int64_t re) {
    std::vector<Acc> row(add.stream ? static_cast<size_t>(E) : 0);
    RowAdder<Acc, C> into_row = add;  // sums a row of several contributions in `row`
    into_row.acc = row.data();
    into_row.stream = false;
    const int64_t p1 = static_cast<int64_t>(start[re]);
    for (int64_t t = rb; t < re; ++t) {
      const int64_t a = static_cast<int64_t>(start[t]), z = static_cast<int64_t>(start[t + 1]);
      if (a == z) {  // no contribution: zero the run of such rows
        int64_t t1 = t + 1;
        while (t1 < re && start[t1 + 1] == start[t1]) ++t1;
        ZeroBytes(add.acc + t * E, (t1 - t) * E * int64_t(sizeof(Acc)), add.stream);
        t = t1 - 1;
        continue;
      }
      for (int64_t p = a; p < z; ++p) {
        if (p + ahead < p1) {
          const char* q = reinterpret_cast<const char*>(
              add.ct + static_cast<int64_t>(order[p + ahead]) * add.row_ct);
          for (int64_t o = 0; o < span; o += 64) __builtin_prefetch(q + o, 0, 3);
        }
        const int64_t first = p == a ? kFirst : 0;
        if (!add.stream || z - a == 1)  // straight into the result
          add(order[p], t | first, 0, E);
        else
          into_row(order[p], first, 0, E);
      }
      if (add.stream && z - a > 1)
        StreamBytes(add.acc + t * E, row.data(), E * int64_t(sizeof(Acc)));
    }
    if (add.stream) StreamFence();
  });
}

// Short rows: each task owns a range of output rows and scans every target.
template <typename Acc, Conv C>
void AddByRows(ffi::ThreadPool& pool, const RowAdder<Acc, C>& add, const int64_t* targets,
               int64_t total_rows, int64_t threads, int64_t out_n, int64_t work) {
  const int64_t E = add.E;
  const int64_t out_rows = E > 0 ? out_n / E : 0;
  const int64_t min_rows = work >= 2 * kGatherMinChunkBytes
                               ? std::max<int64_t>(1, out_rows / threads)
                               : std::max<int64_t>(1, out_rows);
  ParallelFor(pool, out_rows, min_rows, [&](int64_t rb, int64_t re) {
    // The targets are in random order, so "is this row mine" is a coin toss per row for
    // the branch predictor: pick a block's rows without a branch, then add them.
    constexpr int64_t kBlock = 512;
    int64_t mine[kBlock];
    for (int64_t u0 = 0; u0 < total_rows; u0 += kBlock) {
      const int64_t u1 = std::min(total_rows, u0 + kBlock);
      int64_t n = 0;
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t t = targets[u] & ~kFirst;  // dropped rows (-1) stay negative
        mine[n] = u;
        n += (t >= rb) & (t < re);
      }
      for (int64_t q = 0; q < n; ++q) add(mine[q], targets[mine[q]], 0, E);
    }
    if (add.stream) StreamFence();
  });
}

// Adds every ct row into its target output row. Acc is the adding type and `lanes` the
// Acc values per element (2 for complex).
template <typename Acc, Conv C>
ffi::Error ScatterRun(ffi::ThreadPool& pool, const RowLayout& g, const void* ct_data,
                      void* out_data, int64_t out_elems, int lanes, const int64_t* targets,
                      const uint64_t* seen, int64_t total_rows, bool stream_out) {
  using Stored = typename RowAdder<Acc, C>::Stored;
  const int64_t E = g.inner * g.last * lanes;  // Acc values per src row
  const int64_t L = g.row_len * lanes;         // Acc values per padded ct sub-row
  const int64_t out_n = out_elems * lanes;     // Acc values in the output
  // Nothing is zeroed up front: a row's first contribution (kFirst in its target) is
  // stored as Acc{0} + value, bit for bit what adding it into a zero would give, and only
  // rows no contribution reaches (clear in `seen`) are zeroed.
  // The output does not stay in cache: first contributions and zeroed rows are written
  // with non-temporal stores (no read of the line before it is overwritten); not into a
  // buffer just mapped, whose zeroed lines are in cache (`stream_out`: PrepareResult).
  const bool stream = C == Conv::kNone && stream_out;
#if defined(__SSE2__)
  const bool nt_first = stream && std::is_same_v<Acc, float>;
#else
  const bool nt_first = false;
#endif
  std::unique_ptr<Acc[]> scratch;  // 16-bit floats accumulate here, rounded once at the end
  Acc* acc;
  if constexpr (C == Conv::kNone) {
    acc = static_cast<Acc*>(out_data);
  } else {
    scratch.reset(new Acc[static_cast<size_t>(out_n)]);
    acc = scratch.get();
  }
  const RowAdder<Acc, C> add{
      static_cast<const Stored*>(ct_data), acc, E, L, g.last * lanes, g.inner * L, stream};
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t work = total_rows * E * int64_t(sizeof(Acc));
  const int64_t out_rows = E > 0 ? out_n / E : 0;
  const bool long_rows = E >= 128 && work >= 2 * kGatherMinChunkBytes;
  const bool sorted = long_rows && out_rows >= 2 * threads;
  if (!sorted) ZeroUnreachedRows(pool, acc, E, out_n, seen, stream);  // the sorted sweep does
  if (sorted && total_rows <= int64_t{UINT32_MAX})
    AddBySortedRows<uint32_t>(pool, add, targets, total_rows, out_rows, threads);
  else if (sorted)
    AddBySortedRows<int64_t>(pool, add, targets, total_rows, out_rows, threads);
  else if (long_rows)  // too few output rows to share out
    AddByColumns(pool, add, targets, total_rows, threads, nt_first);
  else
    AddByRows(pool, add, targets, total_rows, threads, out_n, work);
  if (sorted && out_rows * E < out_n)  // the tail past the last whole row
    std::memset(acc + out_rows * E, 0, static_cast<size_t>(out_n - out_rows * E) * sizeof(Acc));
  if constexpr (C != Conv::kNone) {
    uint16_t* o = static_cast<uint16_t*>(out_data);
    ParallelFor(pool, out_n, kGatherMinChunkBytes / 4, [&](int64_t b, int64_t e) {
      for (int64_t x = b; x < e; ++x) o[x] = C == Conv::kF16 ? F32ToF16(acc[x]) : F32ToBf16(acc[x]);
    });
  }
  return ffi::Error::Success();
}

// Calls run(Acc{}, std::integral_constant<Conv, C>{}, lanes) with how dtype `dt` adds:
// integers as unsigned of their width (two's complement wraps alike), complex as float
// lanes, 16-bit floats in float32.
template <typename Run>
ffi::Error DispatchAccumulate(ffi::DataType dt, Run&& run) {
  using Plain = std::integral_constant<Conv, Conv::kNone>;
  switch (dt) {
    case ffi::DataType::F32: return run(float{}, Plain{}, 1);
    case ffi::DataType::C64: return run(float{}, Plain{}, 2);
    case ffi::DataType::F64: return run(double{}, Plain{}, 1);
    case ffi::DataType::C128: return run(double{}, Plain{}, 2);
    case ffi::DataType::F16: return run(float{}, std::integral_constant<Conv, Conv::kF16>{}, 1);
    case ffi::DataType::BF16: return run(float{}, std::integral_constant<Conv, Conv::kBF16>{}, 1);
    case ffi::DataType::S8:
    case ffi::DataType::U8: return run(uint8_t{}, Plain{}, 1);
    case ffi::DataType::S16:
    case ffi::DataType::U16: return run(uint16_t{}, Plain{}, 1);
    case ffi::DataType::S32:
    case ffi::DataType::U32: return run(uint32_t{}, Plain{}, 1);
    case ffi::DataType::S64:
    case ffi::DataType::U64: return run(uint64_t{}, Plain{}, 1);
    default: return Invalid("scatter_add", "unsupported dtype (float, complex or integer)");
  }
}

}  // namespace jax_ext
