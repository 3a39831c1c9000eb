// Padded row gather (Ascend asctile.gather) and its transpose, scatter-add.
//
// Per batch element b (flattened over `batch_shape`; every operand is read at its own
// element offset sum_d idx_d * <operand>_bstrides[d], 0 along dimensions it is broadcast
// along, so nothing unbatched is materialized) and row i < n:
//
//   r = offsets[dim] + index[i]           (exact: 128-bit, never overflows)
//   out[b, i] = src[b][offsets[0], ..., offsets[dim-1], r, :, ..., :]
//
// flattened as `inner = prod(src_shape[dim+1:-1])` sub-rows of `last = src_shape[-1]`
// elements, each written with the padded row length `row_len` (columns past `last` hold
// pad). Rows i >= num_indices, and (check_bounds) rows whose offsets or r fall outside
// src, hold pad. Without check_bounds every offset and r is clamped into src, so no
// caller value can make the kernel read outside it.
//
// Scatter-add is the transpose with respect to src: ct rows that gathered real data are
// added into a zeroed output laid out like src (batch dims broadcast: several batch
// elements accumulate into one output), padding columns and padded rows are dropped.
// Every output element receives its contributions in (b, i, column) order whatever the
// thread count: threads own disjoint columns (long rows) or disjoint output rows (short
// rows), never the same element, so there are no lost updates and the result is
// deterministic. float16/bfloat16 accumulate in float32 and round once at the end.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common.h"
#include "geometry_v2.h"
#include "memory.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

constexpr int kMaxBatchRank = 64;
constexpr int64_t kRowBlock = 64;             // gather: rows resolved per block
constexpr int64_t kFirst = int64_t{1} << 62;  // scatter target flag: the row's first contribution

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

std::string Msg(const char* op, const std::string& s) {
  return std::string("jax_ext ") + op + ": " + s;
}

// Calls f(I{}) with the C++ type of an integer index buffer.
template <typename F>
ffi::Error DispatchIndex(ffi::DataType t, F&& f) {
  switch (t) {
    case ffi::DataType::S8: return f(int8_t{});
    case ffi::DataType::S16: return f(int16_t{});
    case ffi::DataType::S32: return f(int32_t{});
    case ffi::DataType::S64: return f(int64_t{});
    case ffi::DataType::U8: return f(uint8_t{});
    case ffi::DataType::U16: return f(uint16_t{});
    case ffi::DataType::U32: return f(uint32_t{});
    case ffi::DataType::U64: return f(uint64_t{});
    default: return ffi::Error::InvalidArgument("index must have an integer dtype of 8 to 64 bits");
  }
}

// offsets and num_indices arrive as int64 (jax_enable_x64) or int32 (the default).
struct IntOperand {
  const void* p;
  bool wide;
  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
  }
};

inline bool IsOffsetType(ffi::DataType t) {
  return t == ffi::DataType::S64 || t == ffi::DataType::S32;
}

// src seen as rows, the result's padded rows and the batch: what both kernels read from
// their attributes, validated once.
struct RowLayout {
  int rank = 0;
  int dim = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};  // dense element strides of one src
  int64_t src_size = 0;                    // elements of one src
  int64_t inner = 1;                       // sub-rows per result row
  int64_t last = 0;                        // src_shape[-1]
  int64_t row_len = 0;                     // padded result row length
  int64_t n = 0;                           // indices per batch element
  int brank = 0;
  std::array<int64_t, kMaxBatchRank> bshape{};
  int64_t batch = 1;  // prod(bshape)
};

// Element offset of batch element b for one operand.
inline int64_t BatchOffset(const RowLayout& g, const std::array<int64_t, kMaxBatchRank>& st,
                           int64_t b) {
  int64_t off = 0;
  for (int d = g.brank - 1; d >= 0; --d) {
    const int64_t q = b / g.bshape[d];
    off += (b - q * g.bshape[d]) * st[d];
    b = q;
  }
  return off;
}

ffi::Error ReadRowLayout(const char* op, RowLayout& g, ffi::Span<const int64_t> src_shape,
                         int64_t dim, int64_t row_len, int64_t n,
                         ffi::Span<const int64_t> batch_shape) {
  const int64_t rank = static_cast<int64_t>(src_shape.size());
  if (rank < 2 || rank > kMaxRank)
    return ffi::Error::InvalidArgument(Msg(
        op, "src rank " + std::to_string(rank) + " outside [2, " + std::to_string(kMaxRank) + "]"));
  if (dim < 0 || dim > rank - 2)
    return ffi::Error::InvalidArgument(Msg(op, "dim " + std::to_string(dim) + " outside [0, " +
                                                   std::to_string(rank - 2) + "] for src shape " +
                                                   ShapeString(src_shape)));
  g.rank = static_cast<int>(rank);
  g.dim = static_cast<int>(dim);
  int64_t acc = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (src_shape[d] < 0)
      return ffi::Error::InvalidArgument(Msg(op, "bad src shape " + ShapeString(src_shape)));
    g.shape[d] = src_shape[d];
    g.stride[d] = acc;
    if (__builtin_mul_overflow(acc, src_shape[d], &acc))
      return ffi::Error::InvalidArgument(
          Msg(op, "src shape " + ShapeString(src_shape) + " overflows 64 bits"));
  }
  g.src_size = acc;
  g.last = src_shape[rank - 1];
  g.inner = 1;
  for (int64_t d = dim + 1; d < rank - 1; ++d)
    if (__builtin_mul_overflow(g.inner, src_shape[d], &g.inner))  // possible when last == 0
      return ffi::Error::InvalidArgument(
          Msg(op, "src shape " + ShapeString(src_shape) + " overflows 64 bits"));
  if (row_len < g.last)
    return ffi::Error::InvalidArgument(Msg(op, "row_len " + std::to_string(row_len) +
                                                   " is shorter than the last src dimension " +
                                                   std::to_string(g.last)));
  g.row_len = row_len;
  if (n < 0) return ffi::Error::InvalidArgument(Msg(op, "negative n"));
  g.n = n;
  const int64_t brank = static_cast<int64_t>(batch_shape.size());
  if (brank < 1 || brank > kMaxBatchRank)
    return ffi::Error::InvalidArgument(Msg(op, "batch rank " + std::to_string(brank) +
                                                   " outside [1, " + std::to_string(kMaxBatchRank) +
                                                   "]"));
  g.brank = static_cast<int>(brank);
  g.batch = 1;
  for (int64_t d = 0; d < brank; ++d) {
    if (batch_shape[d] < 0 || __builtin_mul_overflow(g.batch, batch_shape[d], &g.batch))
      return ffi::Error::InvalidArgument(Msg(op, "bad batch shape " + ShapeString(batch_shape)));
    g.bshape[d] = batch_shape[d];
  }
  return ffi::Error::Success();
}

// Checks that reading `slice` elements at every batch offset of `strides` stays inside a
// buffer of `count` elements, and copies the strides.
ffi::Error CheckOperand(const char* op, const char* name, const RowLayout& g,
                        ffi::Span<const int64_t> strides, int64_t slice, int64_t count,
                        std::array<int64_t, kMaxBatchRank>& out) {
  if (static_cast<int64_t>(strides.size()) != g.brank)
    return ffi::Error::InvalidArgument(
        Msg(op, std::string(name) + " batch strides " + ShapeString(strides) +
                    " do not match the batch rank " + std::to_string(g.brank)));
  int64_t m = 0;
  for (int d = 0; d < g.brank; ++d) {
    if (strides[d] < 0)
      return ffi::Error::InvalidArgument(Msg(op, std::string("negative batch stride for ") + name));
    out[d] = strides[d];
    int64_t t;
    if (g.bshape[d] > 0 && (__builtin_mul_overflow(g.bshape[d] - 1, strides[d], &t) ||
                            __builtin_add_overflow(m, t, &m)))
      return ffi::Error::InvalidArgument(Msg(op, std::string(name) + " batch strides overflow"));
  }
  if (g.batch == 0 || slice == 0) return ffi::Error::Success();
  int64_t need;
  if (__builtin_add_overflow(m, slice, &need) || need > count)
    return ffi::Error::InvalidArgument(
        Msg(op, std::string(name) + ": batch strides " + ShapeString(strides) + " over batch " +
                    ShapeString(ffi::Span<const int64_t>(g.bshape.data(), g.brank)) + " read " +
                    std::to_string(slice) + " elements past the end of its " +
                    std::to_string(count) + " elements"));
  return ffi::Error::Success();
}

// Per batch element: where its rows start in src (flat row index into the
// (prod(shape[:dim+1]), inner * last) view of one src), or that every row is pad.
struct RowBase {
  bool ok;       // outer offsets valid (or clamped)
  int64_t base;  // flat index of row (offsets[0..dim-1], 0)
  int64_t odim;  // offsets[dim]
  int64_t rows;  // src_shape[dim]
};

inline RowBase BaseOf(const RowLayout& g, IntOperand offs_op, int64_t at, bool check) {
  auto offs = [&](int k) { return offs_op[at + k]; };
  RowBase rb{true, 0, offs(g.dim), g.shape[g.dim]};
  int64_t p = 0;
  for (int k = 0; k < g.dim; ++k) {
    int64_t o = offs(k);
    const int64_t s = g.shape[k];
    if (o < 0 || o >= s) {
      if (check || s == 0) rb.ok = false;
      o = o < 0 ? 0 : s - 1;
    }
    // < prod(shape[:k+1]) <= src_size, except when src has no elements (a later dim is
    // 0): then rows read nothing, so a row whose position overflows is simply pad.
    if (__builtin_mul_overflow(p, s, &p) || __builtin_add_overflow(p, o, &p)) {
      rb.ok = false;
      p = 0;
    }
  }
  if (rb.rows == 0) rb.ok = false;
  if (__builtin_mul_overflow(p, rb.rows, &rb.base)) {
    rb.ok = false;
    rb.base = 0;
  }
  return rb;
}

// Row r = odim + idx of the dim axis, exactly; false when the row is pad.
template <typename I>
inline bool RowOf(const RowBase& rb, I idx, bool check, int64_t* r) {
  const __int128 v = static_cast<__int128>(rb.odim) + static_cast<__int128>(idx);
  if (v >= 0 && v < rb.rows) {
    *r = static_cast<int64_t>(v);
    return true;
  }
  if (check) return false;
  *r = v < 0 ? 0 : rb.rows - 1;
  return true;
}

// ---------------------------------------------------------------------------------------
// gather

// Each operand's batch strides (elements), checked against its buffer. `data` is the
// operand laid out like src: src itself for gather, the result for scatter-add.
struct OperandStrides {
  std::array<int64_t, kMaxBatchRank> data{}, offsets{}, index{}, num{}, pad{};
};

// The operands gather and scatter-add share: offsets, index and num_indices, each with
// its batch strides checked against its buffer.
ffi::Error CheckIndexOperands(const char* op, const RowLayout& g, const ffi::AnyBuffer& offsets,
                              const ffi::AnyBuffer& index, const ffi::AnyBuffer& num,
                              ffi::Span<const int64_t> offsets_bstrides,
                              ffi::Span<const int64_t> index_bstrides,
                              ffi::Span<const int64_t> num_bstrides, OperandStrides& st) {
  if (!IsOffsetType(offsets.element_type()) || !IsOffsetType(num.element_type()))
    return ffi::Error::InvalidArgument(Msg(op, "offsets and num_indices must be int32 or int64"));
  JAX_EXT_RETURN_IF_ERROR(CheckOperand(op, "offsets", g, offsets_bstrides, g.dim + 1,
                                       offsets.element_count(), st.offsets));
  JAX_EXT_RETURN_IF_ERROR(
      CheckOperand(op, "index", g, index_bstrides, g.n, index.element_count(), st.index));
  JAX_EXT_RETURN_IF_ERROR(
      CheckOperand(op, "num_indices", g, num_bstrides, 1, num.element_count(), st.num));
  return ffi::Error::Success();
}

// The padded rows of a gather result or scatter-add cotangent: `what` (named so in the
// message) must hold batch x n x inner x row_len elements, counted without overflow.
// Sets the elements of one row and the number of rows.
ffi::Error CheckPaddedRows(const char* op, const char* what, const RowLayout& g, size_t count,
                           int64_t* row_elems, int64_t* total_rows) {
  int64_t total;
  if (__builtin_mul_overflow(g.inner, g.row_len, row_elems) ||
      __builtin_mul_overflow(g.batch, g.n, total_rows) ||
      __builtin_mul_overflow(*total_rows, *row_elems, &total) ||
      total != static_cast<int64_t>(count))
    return ffi::Error::InvalidArgument(
        Msg(op, std::string(what) + " has " + std::to_string(count) + " elements, expected " +
                    std::to_string(g.batch) + " x " + std::to_string(g.n) + " x " +
                    std::to_string(g.inner) + " x " + std::to_string(g.row_len)));
  return ffi::Error::Success();
}

// A validated gather call, typed: T the element (by width), I the index.
template <typename T, typename I>
struct GatherCall {
  const RowLayout& g;
  const OperandStrides& st;
  const T* src;
  IntOperand offsets;
  const I* index;
  IntOperand num;
  const T* pad;
  T* out;
  bool check_bounds;
  int64_t row_out;     // elements of one result row
  int64_t total_rows;  // result rows, over the whole batch
};

// The row loop. RB > 0: rows are unpadded and RB bytes long, so the copy is a few inline
// vector moves; RB == 0: any row.
template <int64_t RB, typename T, typename I>
void GatherRows(ffi::ThreadPool& pool, const GatherCall<T, I>& call) {
  const RowLayout& g = call.g;
  const OperandStrides& st = call.st;
  const T* sp = call.src;
  const IntOperand op_ = call.offsets;
  const I* ip = call.index;
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
  // Streaming stores only for results well past the last-level cache: measured at 32 MiB
  // (random 512-byte rows, 2 threads, the cores shared) regular stores were as fast or
  // faster, and they leave the result's tail in cache for whatever reads it next.
  const bool stream = call.total_rows * row_out * int64_t(sizeof(T)) >= 4 * kStreamBytes;
  DynamicFor(pool, call.total_rows, min_chunk, [&](int64_t begin, int64_t end) {
    const T* ptrs[2][kRowBlock];  // a block's source rows, nullptr: pad
    int64_t u = begin, b = begin / nn, i = begin - b * nn;
    while (u < end) {
      const T* s = sp + BatchOffset(g, st.data, b);
      const I* ix = ip + BatchOffset(g, st.index, b);
      const RowBase rb = BaseOf(g, op_, BatchOffset(g, st.offsets, b), check_bounds);
      const int64_t k = rb.ok ? std::clamp<int64_t>(np_[BatchOffset(g, st.num, b)], 0, nn) : 0;
      const T pv = pp[BatchOffset(g, st.pad, b)];
      const int64_t i_end = std::min(nn, i + (end - u));  // rows of b in this block
      const int64_t i_real = std::max(i, std::min(k, i_end));
      T* orow = o + u * row_out;
      auto resolve = [&](int64_t j, const T** p) {
        const int64_t m = std::min(blk, i_real - j);
        for (int64_t t = 0; t < m; ++t) {
          int64_t r;
          p[t] = RowOf(rb, ix[j + t], check_bounds, &r) ? s + (rb.base + r) * row_src : nullptr;
        }
        if (prefetch)
          for (int64_t t = 0; t < m; ++t)
            if (p[t]) PrefetchBytes(p[t], RB > 0 ? RB : row_bytes);
      };
      if (i < i_real) resolve(i, ptrs[0]);
      for (int64_t j = i, h = 0; j < i_real; j += blk, h ^= 1) {
        if (j + blk < i_real) resolve(j + blk, ptrs[h ^ 1]);
        const int64_t m = std::min(blk, i_real - j);
        for (int64_t t = 0; t < m; ++t, orow += row_out) {
          const T* srow = ptrs[h][t];
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
template <typename T, typename I>
void GatherKernel(ffi::ThreadPool& pool, const GatherCall<T, I>& call) {
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

  // Run: typed by element width and index type.
  return DispatchWidth(ffi::ByteWidth(dt), [&](auto wtag) -> ffi::Error {
    using T = decltype(wtag);
    return DispatchIndex(index.element_type(), [&](auto itag) -> ffi::Error {
      using I = decltype(itag);
      const GatherCall<T, I> call{
          g,
          st,
          static_cast<const T*>(src.untyped_data()),
          IntOperand{offsets.untyped_data(), offsets.element_type() == ffi::DataType::S64},
          static_cast<const I*>(index.untyped_data()),
          IntOperand{num.untyped_data(), num.element_type() == ffi::DataType::S64},
          static_cast<const T*>(pad.untyped_data()),
          static_cast<T*>(out->untyped_data()),
          check_bounds,
          row_out,
          total_rows};
      PrefaultFresh(call.out, out->size_bytes());
      GatherKernel(pool, call);
      return ffi::Error::Success();
    });
  });
}

// ---------------------------------------------------------------------------------------
// scatter-add

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

// Zeroes the output rows of E Acc values no contribution reaches (clear in `seen`), and
// the tail past the last whole row, with non-temporal stores when `stream`.
template <typename Acc>
void ZeroUnreachedRows(ffi::ThreadPool& pool, Acc* acc, int64_t E, int64_t out_n,
                       const uint64_t* seen, bool stream) {
  const int64_t out_rows = E > 0 ? out_n / E : 0;
  ParallelFor(
      pool, out_rows,
      std::max<int64_t>(1, kGatherMinChunkBytes / std::max<int64_t>(1, E * int64_t(sizeof(Acc)))),
      [&](int64_t rb, int64_t re) {
        for (int64_t t = rb; t < re;) {
          if (seen[t >> 6] >> (t & 63) & 1) {
            ++t;
            continue;
          }
          int64_t z = t + 1;
          while (z < re && !(seen[z >> 6] >> (z & 63) & 1)) {
            if ((z & 63) == 0 && z + 64 <= re && seen[z >> 6] == 0)
              z += 64;
            else
              ++z;
          }
          ZeroBytes(acc + t * E, (z - t) * E * int64_t(sizeof(Acc)), stream);
          t = z;
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

// Long rows: each task owns a column range of every output row.
template <typename Acc, Conv C>
void AddByColumns(ffi::ThreadPool& pool, const RowAdder<Acc, C>& add, const int64_t* targets,
                  int64_t total_rows, int64_t threads, bool nt_first) {
  const int64_t E = add.E;
  const Acc* acc = add.acc;
  const int64_t tasks = std::min<int64_t>(threads, E / 64);
  ParallelFor(pool, tasks, 1, [&](int64_t tb, int64_t te) {
    for (int64_t tk = tb; tk < te; ++tk) {
      const int64_t c0 = (E * tk / tasks) & ~int64_t{15};
      const int64_t c1 = tk + 1 == tasks ? E : (E * (tk + 1) / tasks) & ~int64_t{15};
      // Output rows are hit in random order: prefetch the owned part of the rows a
      // few targets ahead (about 4 KiB in flight) for writing.
      const int64_t span = (c1 - c0) * int64_t(sizeof(Acc));
      const int64_t ahead = std::clamp<int64_t>(4096 / std::max<int64_t>(1, span), 2, 64);
      for (int64_t u = 0; u < total_rows; ++u) {
        // (A first contribution streamed in needs no read of the line.)
        if (u + ahead < total_rows && targets[u + ahead] >= 0 &&
            !(nt_first && (targets[u + ahead] & kFirst))) {
          const char* p =
              reinterpret_cast<const char*>(acc + (targets[u + ahead] & ~kFirst) * E + c0);
          for (int64_t q = 0; q < span; q += 64) __builtin_prefetch(p + q, 1, 3);
        }
        if (targets[u] >= 0) add(u, targets[u], c0, c1);
      }
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
    for (int64_t u = 0; u < total_rows; ++u) {
      const int64_t t = targets[u] & ~kFirst;
      if (targets[u] >= 0 && t >= rb && t < re) add(u, targets[u], 0, E);
    }
    if (add.stream) StreamFence();
  });
}

// Adds every ct row into its target output row. Acc is the adding type and `lanes` the
// Acc values per element (2 for complex).
template <typename Acc, Conv C>
ffi::Error ScatterRun(ffi::ThreadPool& pool, const RowLayout& g, const void* ct_data,
                      void* out_data, int64_t out_elems, int lanes, const int64_t* targets,
                      const uint64_t* seen, int64_t total_rows) {
  using Stored = typename RowAdder<Acc, C>::Stored;
  const int64_t E = g.inner * g.last * lanes;  // Acc values per src row
  const int64_t L = g.row_len * lanes;         // Acc values per padded ct sub-row
  const int64_t out_n = out_elems * lanes;     // Acc values in the output
  // Nothing is zeroed up front: a row's first contribution (kFirst in its target) is
  // stored as Acc{0} + value, bit for bit what adding it into a zero would give, and only
  // rows no contribution reaches (clear in `seen`) are zeroed.
  // The output does not stay in cache: first contributions and zeroed rows are written
  // with non-temporal stores (no read of the line before it is overwritten).
  const bool stream = C == Conv::kNone && out_n * int64_t(sizeof(Acc)) >= kStreamBytes;
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
  ZeroUnreachedRows(pool, acc, E, out_n, seen, stream);
  const RowAdder<Acc, C> add{
      static_cast<const Stored*>(ct_data), acc, E, L, g.last * lanes, g.inner * L, stream};
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t work = total_rows * E * int64_t(sizeof(Acc));
  if (E >= 128 && work >= 2 * kGatherMinChunkBytes)
    AddByColumns(pool, add, targets, total_rows, threads, nt_first);
  else
    AddByRows(pool, add, targets, total_rows, threads, out_n, work);
  if constexpr (C != Conv::kNone) {
    uint16_t* o = static_cast<uint16_t*>(out_data);
    ParallelFor(pool, out_n, kGatherMinChunkBytes / 4, [&](int64_t b, int64_t e) {
      for (int64_t x = b; x < e; ++x) o[x] = C == Conv::kF16 ? F32ToF16(acc[x]) : F32ToBf16(acc[x]);
    });
  }
  return ffi::Error::Success();
}

// The output row (in units of row_src elements) each ct row adds into, -1 when the row is
// dropped, kFirst set on the first (in ct order) that reaches its row; `seen` marks the
// output rows some ct row reaches.
ffi::Error FindTargets(const RowLayout& g, const OperandStrides& st, const ffi::AnyBuffer& offsets,
                       const ffi::AnyBuffer& index, const ffi::AnyBuffer& num, bool check_bounds,
                       int64_t row_src, std::vector<int64_t>& targets,
                       std::vector<uint64_t>& seen) {
  return DispatchIndex(index.element_type(), [&](auto itag) -> ffi::Error {
    using I = decltype(itag);
    const IntOperand op_{offsets.untyped_data(), offsets.element_type() == ffi::DataType::S64};
    const I* ip = static_cast<const I*>(index.untyped_data());
    const IntOperand np_{num.untyped_data(), num.element_type() == ffi::DataType::S64};
    for (int64_t b = 0; b < g.batch; ++b) {
      const RowBase rb = BaseOf(g, op_, BatchOffset(g, st.offsets, b), check_bounds);
      if (!rb.ok) continue;
      const int64_t k = std::clamp<int64_t>(np_[BatchOffset(g, st.num, b)], 0, g.n);
      const I* ix = ip + BatchOffset(g, st.index, b);
      const int64_t ob = BatchOffset(g, st.data, b) / row_src;  // src_size is a multiple
      for (int64_t i = 0; i < k; ++i) {
        int64_t r;
        if (RowOf(rb, ix[i], check_bounds, &r)) {
          const int64_t t = ob + rb.base + r;
          uint64_t& w = seen[static_cast<size_t>(t >> 6)];
          const uint64_t bit = uint64_t{1} << (t & 63);
          targets[b * g.n + i] = (w & bit) ? t : (t | kFirst);
          w |= bit;
        }
      }
    }
    return ffi::Error::Success();
  });
}

ffi::Error ScatterAddImpl(ffi::ThreadPool pool, ffi::AnyBuffer ct, ffi::AnyBuffer offsets,
                          ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::Result<ffi::AnyBuffer> out,
                          ffi::Span<const int64_t> src_shape, int64_t dim, int64_t row_len,
                          int64_t n, bool check_bounds, ffi::Span<const int64_t> batch_shape,
                          ffi::Span<const int64_t> out_bstrides,
                          ffi::Span<const int64_t> offsets_bstrides,
                          ffi::Span<const int64_t> index_bstrides,
                          ffi::Span<const int64_t> num_bstrides) {
  // Check the geometry: the attributes, then every operand against its buffer.
  const char* op = "scatter_add";
  RowLayout g;
  JAX_EXT_RETURN_IF_ERROR(ReadRowLayout(op, g, src_shape, dim, row_len, n, batch_shape));
  const ffi::DataType dt = out->element_type();
  if (ct.element_type() != dt)
    return ffi::Error::InvalidArgument(Msg(op, "the cotangent and the result differ in dtype"));
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(CheckIndexOperands(op, g, offsets, index, num, offsets_bstrides,
                                             index_bstrides, num_bstrides, st));
  JAX_EXT_RETURN_IF_ERROR(
      CheckOperand(op, "result", g, out_bstrides, g.src_size, out->element_count(), st.data));
  int64_t row_ct, total_rows;
  JAX_EXT_RETURN_IF_ERROR(
      CheckPaddedRows(op, "the cotangent", g, ct.element_count(), &row_ct, &total_rows));
  const int64_t out_elems = static_cast<int64_t>(out->element_count());
  if (out_elems == 0) return ffi::Error::Success();

  // Where each ct row goes.
  const int64_t row_src = g.inner * g.last;
  std::vector<int64_t> targets(static_cast<size_t>(total_rows), -1);
  const int64_t out_rows = row_src > 0 ? out_elems / row_src : 0;
  std::vector<uint64_t> seen(static_cast<size_t>(out_rows / 64 + 1), 0);
  if (row_src > 0)
    JAX_EXT_RETURN_IF_ERROR(
        FindTargets(g, st, offsets, index, num, check_bounds, row_src, targets, seen));
  PrefaultFresh(out->untyped_data(), out->size_bytes());

  // Adding is arithmetic, so this one dispatch is on the accumulation type: integers add
  // as unsigned of their width (two's complement wraps alike), complex as float lanes.
  auto run = [&](auto acc, auto conv, int64_t lanes) {
    return ScatterRun<decltype(acc), decltype(conv)::value>(
        pool, g, ct.untyped_data(), out->untyped_data(), out_elems, lanes, targets.data(),
        seen.data(), total_rows);
  };
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
    default:
      return ffi::Error::InvalidArgument(Msg(op, "unsupported dtype (float, complex or integer)"));
  }
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

ffi::Error ScatterAddV2Impl(ffi::ThreadPool pool, ffi::AnyBuffer ct, ffi::AnyBuffer offsets,
                            ffi::AnyBuffer index, ffi::AnyBuffer num,
                            ffi::Result<ffi::AnyBuffer> out, int64_t dim, int64_t nbatch,
                            bool check_bounds) {
  v2::GatherAttrs g;
  std::vector<int64_t> st[4];
  JAX_EXT_RETURN_IF_ERROR(v2::ScatterFromBuffers(ct.dimensions(), offsets.dimensions(),
                                                 index.dimensions(), num.dimensions(),
                                                 out->dimensions(), nbatch, dim, g, st));
  return ScatterAddImpl(pool, ct, offsets, index, num, out, v2::Of(g.src_shape), dim, g.row_len,
                        g.n, check_bounds, v2::Of(g.batch_shape), v2::Of(st[0]), v2::Of(st[1]),
                        v2::Of(st[2]), v2::Of(st[3]));
}

// The bindings, each piece written once: the operands of an op are the same for its v1
// and v2 targets, and v1's attributes are the same for both ops but for the batch strides
// of the operand laid out like src.

// The offsets, index and num_indices operands, as both ops take them.
template <typename B>
auto WithIndexOperands(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()   // offsets (int32 or int64)
      .template Arg<ffi::AnyBuffer>()   // index (any integer)
      .template Arg<ffi::AnyBuffer>();  // num_indices (int32 or int64)
}

// gather(src, offsets, index, num_indices, pad_value) -> result.
auto GatherOperands() {
  return WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>())  // src
      .Arg<ffi::AnyBuffer>()  // pad_value
      .Ret<ffi::AnyBuffer>();
}

// scatter_add(ct, offsets, index, num_indices) -> result (laid out like src); ct holds
// the padded rows.
auto ScatterAddOperands() {
  return WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>())  // ct
      .Ret<ffi::AnyBuffer>();
}

// The v1 attributes, in order; `data_bstrides` names the batch strides of the operand
// laid out like src (src for gather, the result for scatter-add).
template <typename B>
auto WithV1Attrs(B b, const char* data_bstrides) {
  using Span = ffi::Span<const int64_t>;
  return std::move(b)
      .template Attr<Span>("src_shape")
      .template Attr<int64_t>("dim")
      .template Attr<int64_t>("row_len")
      .template Attr<int64_t>("n")
      .template Attr<bool>("check_bounds")
      .template Attr<Span>("batch_shape")
      .template Attr<Span>(data_bstrides)
      .template Attr<Span>("offsets_bstrides")
      .template Attr<Span>("index_bstrides")
      .template Attr<Span>("num_bstrides");
}

// The v2 attributes: only what is static under shape polymorphism.
template <typename B>
auto WithV2Attrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("dim")
      .template Attr<int64_t>("nbatch")
      .template Attr<bool>("check_bounds");
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    GatherHandler, GatherImpl,
    WithV1Attrs(GatherOperands(), "src_bstrides").Attr<ffi::Span<const int64_t>>("pad_bstrides"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScatterAddHandler, ScatterAddImpl,
                              WithV1Attrs(ScatterAddOperands(), "out_bstrides"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatherV2Handler, GatherV2Impl, WithV2Attrs(GatherOperands()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScatterAddV2Handler, ScatterAddV2Impl,
                              WithV2Attrs(ScatterAddOperands()));

}  // namespace jax_ext
