// Row geometry shared by gather.cc and scatter_add.cc: src seen as rows, the padded result
// rows, the batch; how the handlers read it (from the buffers, or from the attributes of
// programs exported by jax_ext 0.1.0); the exact row arithmetic and the index read.
//
// Per batch element b (flattened over the batch shape; every operand is read at its own
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
#include <initializer_list>
#include <string>
#include <utility>

#include "check.h"
#include "dispatch.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

// offsets and num_indices arrive as int64 (jax_enable_x64) or int32 (the default).
struct IntOperand {
  const void* p;
  bool wide;
  explicit IntOperand(const ffi::AnyBuffer& b)
      : p(b.untyped_data()), wide(b.element_type() == ffi::DataType::S64) {}
  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
  }
};

// Element strides of one operand over the batch dims. Entries past the batch rank are
// never read, so they are left uninitialized.
using BatchStrides = std::array<int64_t, kMaxRank>;

// src seen as rows, the result's padded rows and the batch: what both kernels walk.
struct RowLayout {
  int dim;
  std::array<int64_t, kMaxRank> shape;  // one src; dims 0..dim are read
  int64_t src_size;                     // elements of one src
  int64_t inner;                        // sub-rows per result row
  int64_t last;                         // src_shape[-1]
  int64_t row_len;                      // padded result row length
  int64_t n;                            // indices per batch element
  int brank;                            // 0: no batch
  std::array<int64_t, kMaxRank> bshape;
  int64_t batch;       // prod(bshape)
  int64_t row_elems;   // inner * row_len: elements of one result (or cotangent) row
  int64_t total_rows;  // batch * n
};

// Each operand's batch strides (elements). `data` is the operand laid out like src: src
// itself for gather, the result for scatter-add.
struct OperandStrides {
  BatchStrides data, offsets, index, num, pad;
};

// Element offset of batch element b for one operand.
inline int64_t BatchOffset(const RowLayout& g, const BatchStrides& st, int64_t b) {
  int64_t off = 0;
  for (int d = g.brank - 1; d >= 0; --d) {
    const int64_t q = b / g.bshape[d];
    off += (b - q * g.bshape[d]) * st[d];
    b = q;
  }
  return off;
}

// --- what both ways of reading the geometry share ----------------------------------------

// One src of shape `src_shape`, gathered along `dim` into rows of `row_len` (>= its last
// dim), n of them per batch element.
inline ffi::Error SetRows(const char* op, RowLayout& g, Dims src_shape, int64_t dim,
                          int64_t row_len, int64_t n) {
  const int64_t rank = static_cast<int64_t>(src_shape.size());
  if (rank < 2 || rank > kMaxRank)
    return Invalid(op, "src rank " + Str(rank) + " outside [2, " + Str(kMaxRank) + "]");
  if (dim < 0 || dim > rank - 2)
    return Invalid(op, "dim " + Str(dim) + " outside [0, " + Str(rank - 2) + "] for src shape " +
                           ShapeString(src_shape));
  JAX_EXT_ASSIGN_OR_RETURN(g.src_size, CheckedProduct(op, "src shape", src_shape));
  g.dim = static_cast<int>(dim);
  std::copy_n(src_shape.begin(), dim + 1, g.shape.begin());
  g.last = src_shape[rank - 1];
  g.inner = 1;
  for (int64_t d = dim + 1; d < rank - 1; ++d)
    if (__builtin_mul_overflow(g.inner, src_shape[d], &g.inner))  // possible when last == 0
      return Invalid(op, "src shape " + ShapeString(src_shape) + " overflows 64 bits");
  if (row_len < g.last)
    return Invalid(
        op, "row_len " + Str(row_len) + " is shorter than the last src dimension " + Str(g.last));
  if (n < 0) return Invalid(op, "negative n");
  g.row_len = row_len;
  g.n = n;
  return ffi::Error::Success();
}

// The result rows (batch x n) and the elements of each (inner x row_len), or an error
// naming `what` (the result, or the cotangent) and the factors when they overflow.
inline ffi::Error SetRowCounts(const char* op, const char* what, RowLayout& g) {
  if (__builtin_mul_overflow(g.inner, g.row_len, &g.row_elems) ||
      __builtin_mul_overflow(g.batch, g.n, &g.total_rows))
    return Invalid(op, std::string(what) + " rows overflow: " + Str(g.batch) + " x " + Str(g.n) +
                           " rows of " + Str(g.inner) + " x " + Str(g.row_len) + " elements");
  return ffi::Error::Success();
}

// The dtypes of the operands both ops share: offsets and num_indices int32 or int64, the
// index any integer of 8 to 64 bits.
inline ffi::Error CheckIndexDtypes(const char* op, const ffi::AnyBuffer& offsets,
                                   const ffi::AnyBuffer& index, const ffi::AnyBuffer& num) {
  auto is_offset = [](ffi::DataType t) {
    return t == ffi::DataType::S64 || t == ffi::DataType::S32;
  };
  if (!is_offset(offsets.element_type()) || !is_offset(num.element_type()))
    return Invalid(op, "offsets and num_indices must be int32 or int64");
  if (!IsIndexType(index.element_type()))
    return Invalid(op, "index must have an integer dtype of 8 to 64 bits");
  return ffi::Error::Success();
}

// --- from the buffers ------------------------------------------------------------------
// A layout read from the buffers reads nothing outside them by construction: each
// operand's batch strides are its own dense strides over extents that agree with the
// batch, and what is read per batch element is the operand's own trailing dims.

// The batch: the leading `nbatch` dims of every operand; per dim, the extent of those that
// are not 1 (they must agree). nbatch is checked against the operands' ranks before
// anything is sized by it.
inline ffi::Error BatchFromBuffers(const char* op, int64_t nbatch, std::initializer_list<Dims> all,
                                   RowLayout& g) {
  if (nbatch < 0) return Invalid(op, "negative nbatch = " + Str(nbatch));
  if (nbatch > kMaxRank)
    return Invalid(op, "nbatch = " + Str(nbatch) + " is above the kernels' limit of " +
                           Str(kMaxRank) + " batch dims");
  for (Dims d : all)
    if (static_cast<int64_t>(d.size()) < nbatch)
      return Invalid(
          op, "nbatch = " + Str(nbatch) + ": an operand " + ShapeString(d) + " has fewer dims");
  g.brank = static_cast<int>(nbatch);
  std::fill_n(g.bshape.begin(), nbatch, int64_t{1});
  for (Dims d : all) {
    for (int64_t j = 0; j < nbatch; ++j) {
      if (d[j] == 1 || d[j] == g.bshape[j]) continue;
      if (g.bshape[j] != 1)
        return Invalid(op, "batch dim " + Str(j) + " differs between operands (" +
                               Str(g.bshape[j]) + " and " + Str(d[j]) + ")");
      g.bshape[j] = d[j];
    }
  }
  JAX_EXT_ASSIGN_OR_RETURN(g.batch,
                           CheckedProduct(op, "batch shape", Dims(g.bshape.data(), nbatch)));
  return ffi::Error::Success();
}

// The rank of `data` (src, or scatter-add's result) past the batch, which must have a dim
// `dim` before its last.
inline ffi::ErrorOr<int64_t> RankPastBatch(const char* op, const char* name, Dims data,
                                           int64_t nbatch, int64_t dim) {
  const int64_t srank = static_cast<int64_t>(data.size()) - nbatch;
  if (srank < 2 || dim < 0 || dim > srank - 2)
    return Unexpected(op, std::string(name) + " " + ShapeString(data) + " with nbatch " +
                              Str(nbatch) + " has no dim " + Str(dim) + " before its last");
  return srank;
}

// An operand's batch strides: its dense stride along each batch dim, 0 where it is
// broadcast (extent 1). Checks that its rank is the batch rank + `rest` (`rank_text`).
inline ffi::Error BatchStridesOf(const char* op, const char* name, Dims d, int64_t rest,
                                 const char* rank_text, const RowLayout& g, BatchStrides& st) {
  JAX_EXT_RETURN_IF_ERROR(CheckRank(op, name, d, g.brank + rest, rank_text));
  int64_t dense = 1;
  for (int64_t j = static_cast<int64_t>(d.size()) - 1; j >= 0; --j) {
    if (j < g.brank) st[j] = d[j] == 1 ? 0 : dense;
    if (__builtin_mul_overflow(dense, d[j], &dense))  // only a buffer with no elements
      return Invalid(op, std::string("bad shape of ") + name + " " + ShapeString(d));
  }
  return ffi::Error::Success();
}

// The batch strides of offsets, index and num_indices, each checked against the batch;
// offsets hold dim + 1 values per batch element. Sets *n, the index's last dim.
inline ffi::Error IndexStrides(const char* op, Dims offsets, Dims index, Dims num, int64_t dim,
                               const RowLayout& g, OperandStrides& st, int64_t* n) {
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "offsets", offsets, 1, "nbatch + 1", g, st.offsets));
  if (offsets[g.brank] != dim + 1)
    return Invalid(op, "offsets " + ShapeString(offsets) + " must hold dim + 1 = " + Str(dim + 1) +
                           " values per batch element");
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "index", index, 1, "nbatch + 1", g, st.index));
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "num_indices", num, 0, "nbatch", g, st.num));
  *n = index[g.brank];
  return ffi::Error::Success();
}

// `rows` (the gather's result or the scatter-add's cotangent) holds the full batch, then
// n rows of `data`'s dims between dim and its last, each of some length L. Returns L.
inline ffi::ErrorOr<int64_t> PaddedRowLength(const char* op, const char* what, Dims rows,
                                             const char* data_name, Dims data, int64_t dim,
                                             int64_t n, const RowLayout& g) {
  const int64_t nb = g.brank, mid = static_cast<int64_t>(data.size()) - nb - dim - 2;
  bool ok = static_cast<int64_t>(rows.size()) == nb + 1 + mid + 1 && rows[nb] == n;
  for (int64_t j = 0; j < nb && ok; ++j) ok = rows[j] == g.bshape[j];
  for (int64_t j = 0; j < mid && ok; ++j) ok = rows[nb + 1 + j] == data[nb + dim + 1 + j];
  if (ok) return rows[rows.size() - 1];
  std::string want = "(";
  for (int64_t j = 0; j < nb; ++j) want += Str(g.bshape[j]) + ", ";
  want += Str(n);
  for (int64_t j = 0; j < mid; ++j) want += ", " + Str(data[nb + dim + 1 + j]);
  return Unexpected(op, std::string(what) + " " + ShapeString(rows) + " does not fit " + data_name +
                            " " + ShapeString(data) + " and n = " + Str(n) + ": expected " + want +
                            ", L) with L >= " + Str(data[data.size() - 1]));
}

// --- from the attributes of programs exported by jax_ext 0.1.0 ---------------------------
// They carry src_shape, row_len, n, the batch shape and every operand's batch strides;
// each is checked against the buffers before the kernels use it.

inline ffi::Error BatchFromAttr(const char* op, Dims batch_shape, RowLayout& g) {
  const int64_t brank = static_cast<int64_t>(batch_shape.size());
  if (brank < 1 || brank > kMaxRank)
    return Invalid(op, "batch rank " + Str(brank) + " outside [1, " + Str(kMaxRank) + "]");
  g.brank = static_cast<int>(brank);
  JAX_EXT_ASSIGN_OR_RETURN(g.batch, CheckedProduct(op, "batch shape", batch_shape));
  std::copy(batch_shape.begin(), batch_shape.end(), g.bshape.begin());
  return ffi::Error::Success();
}

// Reading `slice` elements at every batch offset of `strides` stays inside a buffer of
// `count` elements. Copies the strides into `st`.
inline ffi::Error CheckStrideAttr(const char* op, const char* name, const RowLayout& g,
                                  Dims strides, int64_t slice, size_t count, BatchStrides& st) {
  if (static_cast<int64_t>(strides.size()) != g.brank)
    return Invalid(op, std::string(name) + " batch strides " + ShapeString(strides) +
                           " do not match the batch rank " + Str(g.brank));
  int64_t m = 0;  // the largest batch offset
  for (int d = 0; d < g.brank; ++d) {
    if (strides[d] < 0) return Invalid(op, std::string("negative batch stride for ") + name);
    st[d] = strides[d];
    int64_t t;
    if (g.bshape[d] > 0 && (__builtin_mul_overflow(g.bshape[d] - 1, strides[d], &t) ||
                            __builtin_add_overflow(m, t, &m)))
      return Invalid(op, std::string(name) + " batch strides overflow");
  }
  if (g.batch == 0 || slice == 0) return ffi::Error::Success();
  int64_t need;
  if (__builtin_add_overflow(m, slice, &need) || need > static_cast<int64_t>(count))
    return Invalid(op, std::string(name) + ": batch strides " + ShapeString(strides) +
                           " over batch " + ShapeString(Dims(g.bshape.data(), g.brank)) + " read " +
                           Str(slice) + " elements past the end of its " + Str(count) +
                           " elements");
  return ffi::Error::Success();
}

// The stride attributes of offsets, index and num_indices.
inline ffi::Error CheckIndexStrideAttrs(const char* op, const RowLayout& g,
                                        const ffi::AnyBuffer& offsets, const ffi::AnyBuffer& index,
                                        const ffi::AnyBuffer& num, Dims offsets_bstrides,
                                        Dims index_bstrides, Dims num_bstrides,
                                        OperandStrides& st) {
  JAX_EXT_RETURN_IF_ERROR(CheckStrideAttr(op, "offsets", g, offsets_bstrides, g.dim + 1,
                                          offsets.element_count(), st.offsets));
  JAX_EXT_RETURN_IF_ERROR(
      CheckStrideAttr(op, "index", g, index_bstrides, g.n, index.element_count(), st.index));
  JAX_EXT_RETURN_IF_ERROR(
      CheckStrideAttr(op, "num_indices", g, num_bstrides, 1, num.element_count(), st.num));
  return ffi::Error::Success();
}

// `what` (the result, or the cotangent) holds batch x n x inner x row_len elements.
inline ffi::Error CheckPaddedRowCount(const char* op, const char* what, RowLayout& g,
                                      size_t count) {
  int64_t total;
  if (SetRowCounts(op, what, g).failure() ||
      __builtin_mul_overflow(g.total_rows, g.row_elems, &total) ||
      total != static_cast<int64_t>(count))
    return Invalid(op, std::string(what) + " has " + Str(count) + " elements, expected " +
                           Str(g.batch) + " x " + Str(g.n) + " x " + Str(g.inner) + " x " +
                           Str(g.row_len));
  return ffi::Error::Success();
}

// --- rows and the index ----------------------------------------------------------------

// Per batch element: where its rows start in src (flat row index into the
// (prod(shape[:dim+1]), inner * last) view of one src), or that every row is pad.
struct RowBase {
  bool ok;       // outer offsets valid (or clamped)
  int64_t base;  // flat index of row (offsets[0..dim-1], 0)
  int64_t odim;  // offsets[dim]
  int64_t rows;  // src_shape[dim]
};

inline RowBase BaseOf(const RowLayout& g, IntOperand offsets, int64_t at, bool check) {
  RowBase rb{true, 0, offsets[at + g.dim], g.shape[g.dim]};
  int64_t p = 0;
  for (int k = 0; k < g.dim; ++k) {
    int64_t o = offsets[at + k];
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

// For t < m: emit(t, r) with the row r (RowOf) of index element at + t of `index` (dtype
// `type`), or emit(t, -1) for a padded row. The only code typed by index dtype.
template <typename Emit>
inline void ForEachIndexRow(const RowBase& rb, const void* index, ffi::DataType type, int64_t at,
                            int64_t m, bool check, Emit&& emit) {
  const bool known = DispatchIndex(type, [&](auto tag) {
    const auto* ix = static_cast<const decltype(tag)*>(index) + at;
    for (int64_t t = 0; t < m; ++t) {
      int64_t r;
      emit(t, RowOf(rb, ix[t], check, &r) ? r : int64_t{-1});
    }
  });
  if (!known)  // refused by CheckIndexDtypes before any kernel runs
    for (int64_t t = 0; t < m; ++t) emit(t, int64_t{-1});
}

// --- the bindings, each piece written once ---------------------------------------------

// The offsets, index and num_indices operands, as both ops take them.
template <typename B>
auto WithIndexOperands(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()   // offsets (int32 or int64)
      .template Arg<ffi::AnyBuffer>()   // index (any integer)
      .template Arg<ffi::AnyBuffer>();  // num_indices (int32 or int64)
}

// The attributes of the handlers: only what the buffers cannot say.
template <typename B>
auto WithRowAttrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("dim")
      .template Attr<int64_t>("nbatch")
      .template Attr<bool>("check_bounds");
}

// The attributes of programs exported by jax_ext 0.1.0, in order; `data_bstrides` names
// the batch strides of the operand laid out like src (src for gather, the result for
// scatter-add).
template <typename B>
auto WithShapeAttrs(B b, const char* data_bstrides) {
  return std::move(b)
      .template Attr<Dims>("src_shape")
      .template Attr<int64_t>("dim")
      .template Attr<int64_t>("row_len")
      .template Attr<int64_t>("n")
      .template Attr<bool>("check_bounds")
      .template Attr<Dims>("batch_shape")
      .template Attr<Dims>(data_bstrides)
      .template Attr<Dims>("offsets_bstrides")
      .template Attr<Dims>("index_bstrides")
      .template Attr<Dims>("num_bstrides");
}

}  // namespace jax_ext
