// Row geometry shared by gather.cc and scatter_add.cc: the attributes both read (src seen
// as rows, the padded result rows, the batch), their checks against the operands' buffers,
// the exact row arithmetic, the index read and the FFI bindings both declare.
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
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

constexpr int kMaxBatchRank = kMaxRank;
constexpr int64_t kRowBlock = 64;  // rows resolved per block (ResolveRows)

inline std::string Msg(const char* op, const std::string& s) {
  return std::string("jax_ext ") + op + ": " + s;
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

inline ffi::Error ReadRowLayout(const char* op, RowLayout& g, ffi::Span<const int64_t> src_shape,
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
inline ffi::Error CheckOperand(const char* op, const char* name, const RowLayout& g,
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

// The index dtypes the kernels take: any integer of 8 to 64 bits. Index values are read
// only by ResolveRows, so no kernel is compiled once per index dtype.
inline bool IsIndexType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::S8:
    case ffi::DataType::S16:
    case ffi::DataType::S32:
    case ffi::DataType::S64:
    case ffi::DataType::U8:
    case ffi::DataType::U16:
    case ffi::DataType::U32:
    case ffi::DataType::U64: return true;
    default: return false;
  }
}

template <typename I>
inline void ResolveRowsAs(const RowBase& rb, const I* ix, int64_t m, bool check, int64_t* rows) {
  for (int64_t t = 0; t < m; ++t) {
    int64_t r;
    rows[t] = RowOf(rb, ix[t], check, &r) ? r : -1;
  }
}

// rows[t] = the row (RowOf) of index element at + t of `index` (dtype `type`), -1 for a
// padded row, for t < m. Called once per block of rows, out of line: the per-block call
// is not measurable next to the rows' copy, and the kernels stay one per element width.
__attribute__((noinline)) inline void ResolveRows(const RowBase& rb, const void* index,
                                                  ffi::DataType type, int64_t at, int64_t m,
                                                  bool check, int64_t* rows) {
  switch (type) {
    case ffi::DataType::S8:
      return ResolveRowsAs(rb, static_cast<const int8_t*>(index) + at, m, check, rows);
    case ffi::DataType::S16:
      return ResolveRowsAs(rb, static_cast<const int16_t*>(index) + at, m, check, rows);
    case ffi::DataType::S32:
      return ResolveRowsAs(rb, static_cast<const int32_t*>(index) + at, m, check, rows);
    case ffi::DataType::S64:
      return ResolveRowsAs(rb, static_cast<const int64_t*>(index) + at, m, check, rows);
    case ffi::DataType::U8:
      return ResolveRowsAs(rb, static_cast<const uint8_t*>(index) + at, m, check, rows);
    case ffi::DataType::U16:
      return ResolveRowsAs(rb, static_cast<const uint16_t*>(index) + at, m, check, rows);
    case ffi::DataType::U32:
      return ResolveRowsAs(rb, static_cast<const uint32_t*>(index) + at, m, check, rows);
    case ffi::DataType::U64:
      return ResolveRowsAs(rb, static_cast<const uint64_t*>(index) + at, m, check, rows);
    default: std::fill_n(rows, m, int64_t{-1});  // refused by CheckIndexOperands
  }
}

// Each operand's batch strides (elements), checked against its buffer. `data` is the
// operand laid out like src: src itself for gather, the result for scatter-add.
struct OperandStrides {
  std::array<int64_t, kMaxBatchRank> data{}, offsets{}, index{}, num{}, pad{};
};

// The operands gather and scatter-add share: offsets, index and num_indices, each with
// its batch strides checked against its buffer.
inline ffi::Error CheckIndexOperands(const char* op, const RowLayout& g,
                                     const ffi::AnyBuffer& offsets, const ffi::AnyBuffer& index,
                                     const ffi::AnyBuffer& num,
                                     ffi::Span<const int64_t> offsets_bstrides,
                                     ffi::Span<const int64_t> index_bstrides,
                                     ffi::Span<const int64_t> num_bstrides, OperandStrides& st) {
  if (!IsOffsetType(offsets.element_type()) || !IsOffsetType(num.element_type()))
    return ffi::Error::InvalidArgument(Msg(op, "offsets and num_indices must be int32 or int64"));
  if (!IsIndexType(index.element_type()))
    return ffi::Error::InvalidArgument(Msg(op, "index must have an integer dtype of 8 to 64 bits"));
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
inline ffi::Error CheckPaddedRows(const char* op, const char* what, const RowLayout& g,
                                  size_t count, int64_t* row_elems, int64_t* total_rows) {
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

}  // namespace jax_ext
