// Select's geometry: the result walked as a few long rows, each operand read through its
// own element strides (0 where it is broadcast), so broadcast and vmapped operands are
// never materialized.
//
// The handler reads it from the buffers: the result's dims, each operand's dims and its
// dim map (which result dim each operand dim lies along). Size-1 dims are dropped and
// neighbours every operand walks contiguously are merged, so the kernel sees the fewest,
// longest rows. A layout built so reads nothing outside the operands by construction.
// Programs exported by jax_ext 0.1.0 pass the collapsed shape and strides as attributes
// instead (FromStrideAttrs); those are checked against the buffers before use.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "check.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {

// The (collapsed) result shape and each operand's element strides over it. Entries past
// `rank` are never read, so they are left uninitialized.
struct StridedLayout {
  int rank;
  std::array<int64_t, kMaxRank> shape;
  std::array<std::array<int64_t, kMaxRank>, 3> strides;  // cond, x, y (elements)
};

inline constexpr const char* kSelectOperands[3] = {"cond", "x", "y"};

// Checks operand k's dim map against its dims and the result's: one distinct result dim
// per operand dim, and each operand dim 1 (broadcast) or the result's extent.
inline ffi::Error CheckDimMap(int k, Dims out, Dims dims, Dims map) {
  const char* name = kSelectOperands[k];
  const int64_t rank = static_cast<int64_t>(out.size());
  if (map.size() != dims.size())
    return Invalid("select", std::string(name) + " has rank " + Str(dims.size()) +
                                 " but its dim map " + ShapeString(map) + " names " +
                                 Str(map.size()) + " dims");
  for (size_t j = 0; j < map.size(); ++j) {
    // Pairwise distinctness: operand ranks are small, and the result's rank (size-1 dims
    // included) is unbounded, so no table indexed by result dim.
    bool ok = map[j] >= 0 && map[j] < rank;
    for (size_t i = 0; i < j && ok; ++i) ok = map[i] != map[j];
    if (!ok)
      return Invalid("select", std::string(name) + " dim map " + ShapeString(map) +
                                   " does not fit the result rank " + Str(rank));
    if (dims[j] != 1 && dims[j] != out[map[j]])
      return Invalid("select", std::string(name) + " " + ShapeString(dims) +
                                   " does not map onto the result " + ShapeString(out) +
                                   " with dims " + ShapeString(map));
  }
  return ffi::Error::Success();
}

// The result dims of size other than 1, in order (`kept`), at most kMaxRank of them.
inline ffi::Error KeptDims(Dims out, StridedLayout& g, std::array<int64_t, kMaxRank>& kept) {
  g.rank = 0;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    if (g.rank == kMaxRank)
      return Invalid("select", "the result " + ShapeString(out) + " has more than " +
                                   Str(kMaxRank) + " dims of size other than 1");
    kept[g.rank] = static_cast<int64_t>(d);
    g.shape[g.rank++] = out[d];
  }
  return ffi::Error::Success();
}

// Operand k's dense strides, placed on the kept result dims its dims lie along (0 on the
// others: broadcast). Its dim map has been checked (CheckDimMap).
inline void PlaceStrides(int k, Dims dims, Dims map, const std::array<int64_t, kMaxRank>& kept,
                         StridedLayout& g) {
  std::fill_n(g.strides[k].begin(), g.rank, int64_t{0});
  int64_t dense = 1;  // no overflow: the product of a buffer's dims is its element count
  for (int64_t j = static_cast<int64_t>(dims.size()) - 1; j >= 0; --j) {
    if (dims[j] == 1) continue;
    const int64_t c = std::lower_bound(kept.begin(), kept.begin() + g.rank, map[j]) - kept.begin();
    g.strides[k][c] = dense;
    dense *= dims[j];
  }
}

// Merges each dim into the one before it where every operand walks the pair contiguously
// (the outer stride is the inner one times the inner extent), in place; rank >= 1 after.
inline void Collapse(StridedLayout& g) {
  int m = 0;
  for (int d = 0; d < g.rank; ++d) {
    bool merge = m > 0;
    for (int k = 0; k < 3 && merge; ++k)
      merge = g.strides[k][m - 1] == g.strides[k][d] * g.shape[d];
    if (merge) {
      g.shape[m - 1] *= g.shape[d];  // at most the result's element count
      for (int k = 0; k < 3; ++k) g.strides[k][m - 1] = g.strides[k][d];
      continue;
    }
    g.shape[m] = g.shape[d];
    for (int k = 0; k < 3; ++k) g.strides[k][m] = g.strides[k][d];
    ++m;
  }
  g.rank = std::max(m, 1);
  if (m == 0) {  // every dim had size 1: one element
    g.shape[0] = 1;
    for (int k = 0; k < 3; ++k) g.strides[k][0] = 0;
  }
}

// The layout of out = select(operands) from the buffers' dims and the dim maps.
inline ffi::Error FromBuffers(Dims out, const Dims (&dims)[3], const Dims (&maps)[3],
                              StridedLayout& g) {
  for (int k = 0; k < 3; ++k) JAX_EXT_RETURN_IF_ERROR(CheckDimMap(k, out, dims[k], maps[k]));
  std::array<int64_t, kMaxRank> kept;
  JAX_EXT_RETURN_IF_ERROR(KeptDims(out, g, kept));
  for (int k = 0; k < 3; ++k) PlaceStrides(k, dims[k], maps[k], kept, g);
  Collapse(g);
  return ffi::Error::Success();
}

// Largest element offset operand k is read at, or -1 on overflow.
inline int64_t MaxOffset(const StridedLayout& g, int k) {
  int64_t m = 0;
  for (int d = 0; d < g.rank; ++d) {
    int64_t t;
    if (__builtin_mul_overflow(g.shape[d] - 1, g.strides[k][d], &t) ||
        __builtin_add_overflow(m, t, &m))
      return -1;
  }
  return m;
}

// Operand k's stride attribute: one non-negative stride per dim, and every element it
// names inside the operand's `count` elements.
inline ffi::Error CheckStrideAttr(int k, Dims strides, int64_t total, size_t count,
                                  StridedLayout& g) {
  const char* name = kSelectOperands[k];
  if (static_cast<int64_t>(strides.size()) != g.rank)
    return Invalid("select", std::string(name) + " strides have the wrong rank");
  for (int d = 0; d < g.rank; ++d) {
    if (strides[d] < 0) return Invalid("select", std::string("negative stride for ") + name);
    g.strides[k][d] = strides[d];
  }
  const int64_t m = total > 0 ? MaxOffset(g, k) : 0;
  if (m < 0 || (total > 0 && m >= static_cast<int64_t>(count)))
    return Invalid("select", "strides " + ShapeString(strides) + " over shape " +
                                 ShapeString(Dims(g.shape.data(), g.rank)) +
                                 " read past the end of " + name + " (" + Str(count) +
                                 " elements)");
  return ffi::Error::Success();
}

// The layout from the attributes of a program exported by jax_ext 0.1.0 (the already
// collapsed shape and per-operand strides), checked against the buffers' element counts.
inline ffi::Error FromStrideAttrs(Dims shape, const Dims (&strides)[3], size_t out_count,
                                  const size_t (&counts)[3], StridedLayout& g) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 1 || rank > kMaxRank)
    return Invalid("select", "rank " + Str(rank) + " outside [1, " + Str(kMaxRank) + "]");
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t total, CheckedProduct("select", "shape", shape));
  if (total != static_cast<int64_t>(out_count))
    return Invalid("select", "shape " + ShapeString(shape) + " does not match the result's " +
                                 Str(out_count) + " elements");
  g.rank = static_cast<int>(rank);
  std::copy(shape.begin(), shape.end(), g.shape.begin());
  for (int k = 0; k < 3; ++k)
    JAX_EXT_RETURN_IF_ERROR(CheckStrideAttr(k, strides[k], total, counts[k], g));
  return ffi::Error::Success();
}

// Calls row(n, cond_offset, x_offset, y_offset, out_offset) for every maximal run of the
// innermost dimension that lies in the linear output range [begin, end).
template <typename RowCall>
void ForEachRow(const StridedLayout& g, int64_t begin, int64_t end, RowCall&& row) {
  const int last = g.rank - 1;
  const int64_t inner = g.shape[last];
  std::array<int64_t, kMaxRank> idx;
  int64_t rest = begin / inner, col = begin % inner;
  std::array<int64_t, 3> off{};
  for (int d = last - 1; d >= 0; --d) {
    idx[d] = rest % g.shape[d];
    rest /= g.shape[d];
    for (int k = 0; k < 3; ++k) off[k] += idx[d] * g.strides[k][d];
  }
  while (begin < end) {
    const int64_t n = std::min(inner - col, end - begin);
    row(n, off[0] + col * g.strides[0][last], off[1] + col * g.strides[1][last],
        off[2] + col * g.strides[2][last], begin);
    begin += n;
    col = 0;
    for (int d = last - 1; d >= 0; --d) {  // odometer step over the outer dimensions
      ++idx[d];
      for (int k = 0; k < 3; ++k) off[k] += g.strides[k][d];
      if (idx[d] < g.shape[d]) break;
      for (int k = 0; k < 3; ++k) off[k] -= idx[d] * g.strides[k][d];
      idx[d] = 0;
    }
  }
}

}  // namespace jax_ext
