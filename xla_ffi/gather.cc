// Padded row gather (Ascend asctile.gather): the row geometry is described in rows.h;
// scatter-add, its transpose, is in scatter_add.cc.
//
// The kernels are compiled once per element width (the bytes they move) and, for short
// unpadded rows, per row size; only RowPointers reads the index, by its dtype.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "dispatch.h"
#include "memory.h"
#include "parallel.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

constexpr int64_t kRowBlock = 64;  // most rows resolved per block (Lookahead)

inline void PrefetchBytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// p[t] = where the source row of index element at + t starts (s: the batch element's src,
// rows of row_bytes), nullptr for a padded row, for t < m. Pointers are made in the same
// pass that reads the index: a second pass over the block costs more than it saves
// (docs/performance.md).
void RowPointers(const RowBase& rb, const void* index, ffi::DataType type, int64_t at, int64_t m,
                 bool check, const char* s, int64_t row_bytes, const char** p) {
  ForEachIndexRow(rb, index, type, at, m, check, [&](int64_t t, int64_t r) {
    p[t] = r >= 0 ? s + (rb.base + r) * row_bytes : nullptr;
  });
}

// A checked gather call, typed by element width T; the index is read by RowPointers.
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
  bool stream;  // write `out` with streaming stores (PrepareResult)
};

// How one result row is written, with the sizes held in registers: a fixed-size copy of RB
// bytes (RB > 0: short unpadded rows), a copy of the row, or sub-rows followed by pad.
template <int64_t RB, typename T>
struct RowWriter {
  int64_t row_out;    // elements of one result row
  int64_t row_bytes;  // bytes of one source row
  int64_t inner, last, row_len;
  bool stream;

  void Write(T* orow, const T* srow, T pv) const {
    if (!srow) {
      std::fill_n(orow, row_out, pv);
    } else if constexpr (RB > 0) {
      if (stream)
        StreamBytes(orow, srow, RB);
      else if constexpr (RB > 256)
        CopyFixed<RB>(orow, srow);
      else
        std::memcpy(orow, srow, RB);
    } else if (row_len == last) {
      if (stream)
        StreamBytes(orow, srow, row_bytes);
      else
        std::memcpy(orow, srow, static_cast<size_t>(row_bytes));
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        std::memcpy(orow + j * row_len, srow + j * last, static_cast<size_t>(last) * sizeof(T));
        std::fill_n(orow + j * row_len + last, row_len - last, pv);
      }
    }
  }
};

// One batch element's share of the work: its src, where its index starts, where its rows
// start (RowBase), how many of its rows are real, and its pad value.
template <typename T>
struct BatchRows {
  const T* src;
  int64_t index_at;
  RowBase rb;
  int64_t real;  // rows before num_indices; 0 when its offsets are out of range
  T pad;
};

template <typename T>
BatchRows<T> RowsOfBatch(const GatherCall<T>& c, int64_t b) {
  const RowLayout& g = c.g;
  const RowBase rb = BaseOf(g, c.offsets, BatchOffset(g, c.st.offsets, b), c.check_bounds);
  const int64_t k = rb.ok ? std::clamp<int64_t>(c.num[BatchOffset(g, c.st.num, b)], 0, g.n) : 0;
  return {c.src + BatchOffset(g, c.st.data, b), BatchOffset(g, c.st.index, b), rb, k,
          c.pad[BatchOffset(g, c.st.pad, b)]};
}

// Source rows are resolved a block ahead of their copy, and their lines prefetched then:
// about 4 KiB in flight. A source that fits in L2 is not prefetched (the instructions cost
// more than they hide). Resolving a whole block in a tight loop, not one row per copied
// row, keeps the per-row work a few instructions: at 32-byte rows that work, not memory,
// bounds the copy.
template <typename T>
struct Lookahead {
  int64_t block;     // rows per block, at most kRowBlock
  int64_t prefetch;  // bytes to prefetch per row, 0: none

  Lookahead(const GatherCall<T>& c, int64_t row_bytes, int64_t rb_bytes)
      : block(std::clamp<int64_t>(4096 / std::max<int64_t>(1, row_bytes), 4, kRowBlock)),
        prefetch(c.g.src_size * int64_t(sizeof(T)) > (int64_t{1} << 20) ? rb_bytes : 0) {}

  void Resolve(const GatherCall<T>& c, const BatchRows<T>& br, int64_t j, int64_t m,
               int64_t row_bytes, const char** p) const {
    RowPointers(br.rb, c.index, c.index_type, br.index_at + j, m, c.check_bounds,
                reinterpret_cast<const char*>(br.src), row_bytes, p);
    if (prefetch == 0) return;
    for (int64_t t = 0; t < m; ++t)
      if (p[t]) PrefetchBytes(p[t], prefetch);
  }
};

// Writes rows [i, i_real) of one batch element from `orow` on; returns where they end.
template <int64_t RB, typename T>
T* CopyRealRows(const GatherCall<T>& c, const RowWriter<RB, T>& w, const Lookahead<T>& ahead,
                const BatchRows<T>& br, int64_t i, int64_t i_real, T* orow) {
  const int64_t blk = ahead.block;
  const char* ptrs[2][kRowBlock];  // a block's source rows, nullptr: pad
  if (i < i_real) ahead.Resolve(c, br, i, std::min(blk, i_real - i), w.row_bytes, ptrs[0]);
  for (int64_t j = i, h = 0; j < i_real; j += blk, h ^= 1) {
    if (j + blk < i_real)
      ahead.Resolve(c, br, j + blk, std::min(blk, i_real - j - blk), w.row_bytes, ptrs[h ^ 1]);
    const int64_t m = std::min(blk, i_real - j);
    for (int64_t t = 0; t < m; ++t, orow += w.row_out)
      w.Write(orow, reinterpret_cast<const T*>(ptrs[h][t]), br.pad);
  }
  return orow;
}

// The row loop. RB > 0: rows are unpadded and RB bytes long, so the copy is a few inline
// vector moves; RB == 0: any row.
template <int64_t RB, typename T>
void GatherRows(ffi::ThreadPool& pool, const GatherCall<T>& c) {
  const RowLayout& g = c.g;
  const int64_t row_bytes = g.inner * g.last * int64_t(sizeof(T));
  const RowWriter<RB, T> w{g.row_elems, row_bytes, g.inner, g.last, g.row_len, c.stream};
  const Lookahead<T> ahead(c, row_bytes, RB > 0 ? RB : row_bytes);
  const int64_t min_chunk = std::max<int64_t>(
      1, kGatherMinChunkBytes / std::max<int64_t>(1, g.row_elems * int64_t(sizeof(T))));
  DynamicFor(pool, g.total_rows, min_chunk, [&](int64_t begin, int64_t end) {
    int64_t u = begin, b = begin / g.n, i = begin - b * g.n;
    while (u < end) {  // one batch element's rows in [u, end) per step
      const BatchRows<T> br = RowsOfBatch(c, b);
      const int64_t i_end = std::min(g.n, i + (end - u));
      const int64_t i_real = std::max(i, std::min(br.real, i_end));
      T* orow = CopyRealRows(c, w, ahead, br, i, i_real, c.out + u * g.row_elems);
      std::fill_n(orow, (i_end - i_real) * g.row_elems, br.pad);  // rows past num_indices
      u += i_end - i;
      ++b;
      i = 0;
    }
    if (c.stream) StreamFence();
  });
}

// Picks the row loop: specialized on the row size in bytes when the rows are short and
// unpadded, generic otherwise.
template <typename T>
void GatherKernel(ffi::ThreadPool& pool, const GatherCall<T>& c) {
  const int64_t row_bytes = c.g.inner * c.g.last * int64_t(sizeof(T));
  if (c.g.row_len == c.g.last) {
    switch (row_bytes) {
      case 32: return GatherRows<32>(pool, c);
      case 64: return GatherRows<64>(pool, c);
      case 128: return GatherRows<128>(pool, c);
      case 256: return GatherRows<256>(pool, c);
      case 512: return GatherRows<512>(pool, c);
      default: break;
    }
  }
  GatherRows<0>(pool, c);
}

// What both targets run once the layout is known: dtype checks, then the kernel.
ffi::Error GatherRun(ffi::ThreadPool pool, ffi::AnyBuffer src, ffi::AnyBuffer offsets,
                     ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::AnyBuffer pad,
                     ffi::Result<ffi::AnyBuffer> out, const RowLayout& g, const OperandStrides& st,
                     bool check_bounds) {
  const ffi::DataType dt = out->element_type();
  JAX_EXT_RETURN_IF_ERROR(
      CheckSameDtype("gather", "src, pad_value and the result", dt, {pad.element_type()}));
  // The kernel moves bytes: the result (and pad_value) may be src's wire values.
  JAX_EXT_RETURN_IF_ERROR(
      CheckDtypeOrWire("gather", "src, pad_value and the result", dt, src.element_type()));
  JAX_EXT_RETURN_IF_ERROR(CheckWholeBytes("gather", dt));
  JAX_EXT_RETURN_IF_ERROR(CheckIndexDtypes("gather", offsets, index, num));
  if (out->element_count() == 0) return ffi::Error::Success();
  const bool stream = PrepareResult(out->untyped_data(), out->size_bytes(), kStreamCopyBytes);
  return DispatchWidth("gather", ffi::ByteWidth(dt), [&](auto tag) -> ffi::Error {
    using T = decltype(tag);
    GatherKernel(
        pool, GatherCall<T>{g, st, static_cast<const T*>(src.untyped_data()), IntOperand(offsets),
                            index.untyped_data(), index.element_type(), IntOperand(num),
                            static_cast<const T*>(pad.untyped_data()),
                            static_cast<T*>(out->untyped_data()), check_bounds, stream});
    return ffi::Error::Success();
  });
}

// The handler: shapes from the buffers; the attributes carry only dim, nbatch and
// check_bounds.
ffi::Error GatherImpl(ffi::ThreadPool pool, ffi::AnyBuffer src, ffi::AnyBuffer offsets,
                      ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::AnyBuffer pad,
                      ffi::Result<ffi::AnyBuffer> out, int64_t dim, int64_t nbatch,
                      bool check_bounds) {
  const char* op = "gather";
  const Dims sd = src.dimensions(), od = out->dimensions();
  RowLayout g;
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(BatchFromBuffers(
      op, nbatch,
      {sd, offsets.dimensions(), index.dimensions(), num.dimensions(), pad.dimensions(), od}, g));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t srank, RankPastBatch(op, "src", sd, nbatch, dim));
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "src", sd, srank, "nbatch + rest", g, st.data));
  int64_t n;
  JAX_EXT_RETURN_IF_ERROR(
      IndexStrides(op, offsets.dimensions(), index.dimensions(), num.dimensions(), dim, g, st, &n));
  JAX_EXT_RETURN_IF_ERROR(
      BatchStridesOf(op, "pad_value", pad.dimensions(), 0, "nbatch", g, st.pad));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t row_len,
                           PaddedRowLength(op, "result", od, "src", sd, dim, n, g));
  JAX_EXT_RETURN_IF_ERROR(SetRows(op, g, sd.last(srank), dim, row_len, n));
  JAX_EXT_RETURN_IF_ERROR(SetRowCounts(op, "the result", g));
  return GatherRun(pool, src, offsets, index, num, pad, out, g, st, check_bounds);
}

// Programs exported by jax_ext 0.1.0: shapes and batch strides as attributes, each checked
// against the buffers.
ffi::Error GatherShapeAttrsImpl(ffi::ThreadPool pool, ffi::AnyBuffer src, ffi::AnyBuffer offsets,
                                ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::AnyBuffer pad,
                                ffi::Result<ffi::AnyBuffer> out, Dims src_shape, int64_t dim,
                                int64_t row_len, int64_t n, bool check_bounds, Dims batch_shape,
                                Dims src_bstrides, Dims offsets_bstrides, Dims index_bstrides,
                                Dims num_bstrides, Dims pad_bstrides) {
  const char* op = "gather";
  RowLayout g;
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(SetRows(op, g, src_shape, dim, row_len, n));
  JAX_EXT_RETURN_IF_ERROR(BatchFromAttr(op, batch_shape, g));
  JAX_EXT_RETURN_IF_ERROR(
      CheckStrideAttr(op, "src", g, src_bstrides, g.src_size, src.element_count(), st.data));
  JAX_EXT_RETURN_IF_ERROR(CheckIndexStrideAttrs(op, g, offsets, index, num, offsets_bstrides,
                                                index_bstrides, num_bstrides, st));
  JAX_EXT_RETURN_IF_ERROR(
      CheckStrideAttr(op, "pad_value", g, pad_bstrides, 1, pad.element_count(), st.pad));
  JAX_EXT_RETURN_IF_ERROR(CheckPaddedRowCount(op, "result", g, out->element_count()));
  return GatherRun(pool, src, offsets, index, num, pad, out, g, st, check_bounds);
}

// gather(src, offsets, index, num_indices, pad_value) -> result.
auto GatherOperands() {
  return WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>())  // src
      .Arg<ffi::AnyBuffer>()  // pad_value
      .Ret<ffi::AnyBuffer>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GatherHandler, GatherImpl, WithRowAttrs(GatherOperands()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    GatherShapeAttrsHandler, GatherShapeAttrsImpl,
    WithShapeAttrs(GatherOperands(), "src_bstrides").Attr<Dims>("pad_bstrides"));

}  // namespace jax_ext
