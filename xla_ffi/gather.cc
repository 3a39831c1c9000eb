// Padded row gather (Ascend asctile.gather): the row geometry is described in rows.h;
// scatter-add, its transpose, is in scatter_add.cc.
//
// The kernels are compiled once per element width (the bytes they move) and, for short
// unpadded rows, per row size; only RowPointers reads the index, by its dtype.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "geometry_v2.h"
#include "memory.h"
#include "parallel.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

inline void PrefetchBytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// Runs fn(begin, end) over blocks of `block` units covering [0, n), handed out one at a
// time from a shared counter: a thread the pool starts late (or never) leaves its blocks
// to the others instead of making the caller wait for them.
template <typename Fn>
void DynamicFor(ffi::ThreadPool& pool, int64_t n, int64_t block, const Fn& fn) {
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

template <typename I>
inline void RowPointersAs(const RowBase& rb, const I* ix, int64_t m, bool check, const char* s,
                          int64_t row_bytes, const char** p) {
  for (int64_t t = 0; t < m; ++t) {
    int64_t r;
    p[t] = RowOf(rb, ix[t], check, &r) ? s + (rb.base + r) * row_bytes : nullptr;
  }
}

// p[t] = where the source row of index element at + t starts (s: the batch element's src,
// rows of row_bytes), nullptr for a padded row, for t < m: the only code typed by index
// dtype. It yields the pointers the copy loop reads, in one pass: rows first, then
// pointers in a second pass over the block, made the 32-byte-row gather about 20% slower.
void RowPointers(const RowBase& rb, const void* index, ffi::DataType type, int64_t at, int64_t m,
                 bool check, const char* s, int64_t row_bytes, const char** p) {
  switch (type) {
#define JAX_EXT_CASE(DT, I) \
  case ffi::DataType::DT:   \
    return RowPointersAs(rb, static_cast<const I*>(index) + at, m, check, s, row_bytes, p);
    JAX_EXT_CASE(S8, int8_t)
    JAX_EXT_CASE(S16, int16_t)
    JAX_EXT_CASE(S32, int32_t)
    JAX_EXT_CASE(S64, int64_t)
    JAX_EXT_CASE(U8, uint8_t)
    JAX_EXT_CASE(U16, uint16_t)
    JAX_EXT_CASE(U32, uint32_t)
    JAX_EXT_CASE(U64, uint64_t)
#undef JAX_EXT_CASE
    default: std::fill_n(p, m, nullptr);  // refused by CheckIndexOperands
  }
}

// A validated gather call, typed by element width T; the index is read by RowPointers.
template <typename T>
struct GatherCall {
  const RowLayout& g;
  const OperandStrides& st;
  const T* src;
  IntOperand offsets;
  const void* index;
  ffi::DataType index_type;
  IntOperand num;
  const T* pad;
  T* out;
  bool check_bounds;
  int64_t row_out;      // elements of one result row
  int64_t total_rows;   // result rows, over the whole batch
  bool stream = false;  // write out with streaming stores (PrepareResult)
};

// The row loop. RB > 0: rows are unpadded and RB bytes long, so the copy is a few inline
// vector moves; RB == 0: any row.
template <int64_t RB, typename T>
void GatherRows(ffi::ThreadPool& pool, const GatherCall<T>& call) {
  const RowLayout& g = call.g;
  const OperandStrides& st = call.st;
  const T* sp = call.src;
  const IntOperand op_ = call.offsets;
  const IntOperand np_ = call.num;
  const T* pp = call.pad;
  T* o = call.out;
  const bool check_bounds = call.check_bounds;
  const int64_t row_out = call.row_out;
  const int64_t inner = g.inner, last = g.last, L = g.row_len, nn = g.n;
  const int64_t row_src = inner * last;
  const size_t last_bytes = static_cast<size_t>(last) * sizeof(T);
  const int64_t min_chunk = std::max<int64_t>(
      1, kGatherMinChunkBytes / std::max<int64_t>(1, row_out * int64_t(sizeof(T))));
  const int64_t row_bytes = row_src * int64_t(sizeof(T));
  // Source rows are resolved a block ahead of their copy, and their lines prefetched
  // then: about 4 KiB in flight. A source that fits in L2 is not prefetched (the
  // instructions cost more than they hide). Resolving a whole block in a tight loop, not
  // one row per copied row, keeps the per-row work a few instructions: at 32-byte rows
  // that work, not memory, bounds the copy.
  const int64_t blk = std::clamp<int64_t>(4096 / std::max<int64_t>(1, row_bytes), 4, kRowBlock);
  const bool prefetch = g.src_size * int64_t(sizeof(T)) > (int64_t{1} << 20);
  // call.stream (GatherImpl): streaming stores only for results well past the last-level
  // cache, from 64 MiB: at 32 MiB (random 512-byte rows, 2 threads, the cores shared)
  // regular stores were as fast or faster, and they leave the result's tail in cache for
  // whatever reads it next. Never into a buffer just mapped (see PrepareResult).
  const bool stream = call.stream;
  DynamicFor(pool, call.total_rows, min_chunk, [&](int64_t begin, int64_t end) {
    const char* ptrs[2][kRowBlock];  // a block's source rows, nullptr: pad
    int64_t u = begin, b = begin / nn, i = begin - b * nn;
    while (u < end) {
      const T* s = sp + BatchOffset(g, st.data, b);
      const int64_t ix = BatchOffset(g, st.index, b);
      const RowBase rb = BaseOf(g, op_, BatchOffset(g, st.offsets, b), check_bounds);
      const int64_t k = rb.ok ? std::clamp<int64_t>(np_[BatchOffset(g, st.num, b)], 0, nn) : 0;
      const T pv = pp[BatchOffset(g, st.pad, b)];
      const int64_t i_end = std::min(nn, i + (end - u));  // rows of b in this block
      const int64_t i_real = std::max(i, std::min(k, i_end));
      T* orow = o + u * row_out;
      auto resolve = [&](int64_t j, const char** p) {
        const int64_t m = std::min(blk, i_real - j);
        RowPointers(rb, call.index, call.index_type, ix + j, m, check_bounds,
                    reinterpret_cast<const char*>(s), row_bytes, p);
        if (prefetch)
          for (int64_t t = 0; t < m; ++t)
            if (p[t]) PrefetchBytes(p[t], RB > 0 ? RB : row_bytes);
      };
      if (i < i_real) resolve(i, ptrs[0]);
      for (int64_t j = i, h = 0; j < i_real; j += blk, h ^= 1) {
        if (j + blk < i_real) resolve(j + blk, ptrs[h ^ 1]);
        const int64_t m = std::min(blk, i_real - j);
        for (int64_t t = 0; t < m; ++t, orow += row_out) {
          const T* srow = reinterpret_cast<const T*>(ptrs[h][t]);
          if (!srow) {
            std::fill_n(orow, row_out, pv);
          } else if constexpr (RB > 0) {
            if (stream)
              StreamBytes(orow, srow, RB);
            else if constexpr (RB > 256)
              CopyFixed<RB>(orow, srow);
            else
              std::memcpy(orow, srow, RB);
          } else if (L == last) {
            if (stream)
              StreamBytes(orow, srow, row_bytes);
            else
              std::memcpy(orow, srow, static_cast<size_t>(row_bytes));
          } else {
            for (int64_t j2 = 0; j2 < inner; ++j2) {
              std::memcpy(orow + j2 * L, srow + j2 * last, last_bytes);
              std::fill_n(orow + j2 * L + last, L - last, pv);
            }
          }
        }
      }
      std::fill_n(orow, (i_end - i_real) * row_out, pv);  // rows past num_indices
      u += i_end - i;
      ++b;
      i = 0;
    }
    if (stream) StreamFence();
  });
}

// Picks the row loop: specialized on the row size in bytes when the rows are short and
// unpadded, generic otherwise.
template <typename T>
void GatherKernel(ffi::ThreadPool& pool, const GatherCall<T>& call) {
  const int64_t row_bytes = call.g.inner * call.g.last * int64_t(sizeof(T));
  if (call.g.row_len == call.g.last) {
    switch (row_bytes) {
      case 32: return GatherRows<32>(pool, call);
      case 64: return GatherRows<64>(pool, call);
      case 128: return GatherRows<128>(pool, call);
      case 256: return GatherRows<256>(pool, call);
      case 512: return GatherRows<512>(pool, call);
      default: break;
    }
  }
  GatherRows<0>(pool, call);
}

ffi::Error GatherImpl(ffi::ThreadPool pool, ffi::AnyBuffer src, ffi::AnyBuffer offsets,
                      ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::AnyBuffer pad,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int64_t> src_shape,
                      int64_t dim, int64_t row_len, int64_t n, bool check_bounds,
                      ffi::Span<const int64_t> batch_shape, ffi::Span<const int64_t> src_bstrides,
                      ffi::Span<const int64_t> offsets_bstrides,
                      ffi::Span<const int64_t> index_bstrides,
                      ffi::Span<const int64_t> num_bstrides,
                      ffi::Span<const int64_t> pad_bstrides) {
  // Check the geometry: the attributes, then every operand against its buffer.
  const char* op = "gather";
  RowLayout g;
  JAX_EXT_RETURN_IF_ERROR(ReadRowLayout(op, g, src_shape, dim, row_len, n, batch_shape));
  const ffi::DataType dt = out->element_type();
  if (src.element_type() != dt || pad.element_type() != dt)
    return ffi::Error::InvalidArgument(Msg(op, "src, pad_value and the result differ in dtype"));
  if (IsSubByte(dt))
    return ffi::Error::InvalidArgument(Msg(op, "sub-byte dtypes are not supported"));
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(
      CheckOperand(op, "src", g, src_bstrides, g.src_size, src.element_count(), st.data));
  JAX_EXT_RETURN_IF_ERROR(CheckIndexOperands(op, g, offsets, index, num, offsets_bstrides,
                                             index_bstrides, num_bstrides, st));
  JAX_EXT_RETURN_IF_ERROR(
      CheckOperand(op, "pad_value", g, pad_bstrides, 1, pad.element_count(), st.pad));
  int64_t row_out, total_rows;
  JAX_EXT_RETURN_IF_ERROR(
      CheckPaddedRows(op, "result", g, out->element_count(), &row_out, &total_rows));
  if (out->element_count() == 0) return ffi::Error::Success();

  // Run: typed by element width.
  return DispatchWidth(ffi::ByteWidth(dt), [&](auto wtag) -> ffi::Error {
    using T = decltype(wtag);
    {
      GatherCall<T> call{
          g,
          st,
          static_cast<const T*>(src.untyped_data()),
          IntOperand{offsets.untyped_data(), offsets.element_type() == ffi::DataType::S64},
          index.untyped_data(),
          index.element_type(),
          IntOperand{num.untyped_data(), num.element_type() == ffi::DataType::S64},
          static_cast<const T*>(pad.untyped_data()),
          static_cast<T*>(out->untyped_data()),
          check_bounds,
          row_out,
          total_rows};
      call.stream = PrepareResult(call.out, out->size_bytes(), 4 * kStreamBytes);
      GatherKernel(pool, call);
      return ffi::Error::Success();
    }
  });
}

// v2: the same kernels; shapes, sizes and batch strides come from the buffers
// (geometry_v2.h), the attributes carry only dim, nbatch and check_bounds.
ffi::Error GatherV2Impl(ffi::ThreadPool pool, ffi::AnyBuffer src, ffi::AnyBuffer offsets,
                        ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::AnyBuffer pad,
                        ffi::Result<ffi::AnyBuffer> out, int64_t dim, int64_t nbatch,
                        bool check_bounds) {
  v2::GatherAttrs g;
  std::vector<int64_t> st[5];
  JAX_EXT_RETURN_IF_ERROR(v2::GatherFromBuffers(
      src.dimensions(), offsets.dimensions(), index.dimensions(), num.dimensions(),
      pad.dimensions(), out->dimensions(), nbatch, dim, g, st));
  return GatherImpl(pool, src, offsets, index, num, pad, out, v2::Of(g.src_shape), dim, g.row_len,
                    g.n, check_bounds, v2::Of(g.batch_shape), v2::Of(st[0]), v2::Of(st[1]),
                    v2::Of(st[2]), v2::Of(st[3]), v2::Of(st[4]));
}

// gather(src, offsets, index, num_indices, pad_value) -> result.
auto GatherOperands() {
  return WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>())  // src
      .Arg<ffi::AnyBuffer>()  // pad_value
      .Ret<ffi::AnyBuffer>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    GatherHandler, GatherImpl,
    WithV1Attrs(GatherOperands(), "src_bstrides").Attr<ffi::Span<const int64_t>>("pad_bstrides"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatherV2Handler, GatherV2Impl, WithV2Attrs(GatherOperands()));

}  // namespace jax_ext
