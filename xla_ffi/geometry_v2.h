// Geometry for the v2 targets: read from the buffers' dimensions at run time.
//
// The v1 targets take the shapes and element strides as attributes that Python computes
// from the avals. A program exported with symbolic dimensions (jax.export shape
// polymorphism) has no such numbers when it is lowered, so the v2 targets carry only
// what is static (which result dimension each operand dimension lies along, dim, the
// number of batch dims, check_bounds) and derive the rest here from the buffers, then
// hand the v1 implementations exactly the attributes Python would have computed. The
// v1 implementations validate those against the buffers again (no read or write outside
// a buffer), so a v2 call is checked twice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace v2 {

using Dims = ffi::Span<const int64_t>;

inline ffi::Error Bad(const char* op, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string("jax_ext ") + op + " (v2): " + what);
}

inline Dims Of(const std::vector<int64_t>& v) { return Dims(v.data(), v.size()); }

// Dense element strides of a buffer of shape `dims`; false on overflow.
inline bool DenseStrides(Dims dims, std::vector<int64_t>& st) {
  st.assign(dims.size(), 0);
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    if (dims[d] < 0 || __builtin_mul_overflow(acc, dims[d], &acc)) return false;
  }
  return true;
}

// --- select -----------------------------------------------------------------------------

// The v1 attributes of one select call: shape and per-operand element strides over the
// result, with size-1 dims dropped and neighbours every operand walks contiguously merged
// (the same collapse Python does for v1). Always rank >= 1.
struct SelectAttrs {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides[3];
};

// `maps[k][j]`: the result dimension operand k's dimension j lies along (a size-1
// dimension broadcasts; result dimensions an operand does not name are broadcast).
inline ffi::Error SelectFromBuffers(Dims out, const Dims operands[3], const Dims maps[3],
                                    SelectAttrs& g) {
  static const char* names[3] = {"cond", "x", "y"};
  const size_t rank = out.size();
  std::vector<std::vector<int64_t>> st(3, std::vector<int64_t>(rank, 0));
  for (int k = 0; k < 3; ++k) {
    if (maps[k].size() != operands[k].size())
      return Bad("select", std::string(names[k]) + " has rank " +
                               std::to_string(operands[k].size()) + " but its dim map " +
                               ShapeString(maps[k]) + " names " + std::to_string(maps[k].size()) +
                               " dims");
    std::vector<int64_t> dense;
    if (!DenseStrides(operands[k], dense))
      return Bad("select", std::string("bad shape of ") + names[k]);
    std::vector<bool> used(rank, false);
    for (size_t j = 0; j < maps[k].size(); ++j) {
      const int64_t o = maps[k][j];
      if (o < 0 || o >= static_cast<int64_t>(rank) || used[o])
        return Bad("select", std::string(names[k]) + " dim map " + ShapeString(maps[k]) +
                                 " does not fit the result rank " + std::to_string(rank));
      used[o] = true;
      const int64_t n = operands[k][j];
      if (n != 1 && n != out[o])
        return Bad("select", std::string(names[k]) + " " + ShapeString(operands[k]) +
                                 " does not map onto the result " + ShapeString(out) +
                                 " with dims " + ShapeString(maps[k]));
      if (n != 1) st[k][o] = dense[j];
    }
  }
  // collapse
  std::vector<int64_t> sh;
  std::vector<std::vector<int64_t>> cs(3);
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    sh.push_back(out[d]);
    for (int k = 0; k < 3; ++k) cs[k].push_back(st[k][d]);
  }
  for (int64_t i = static_cast<int64_t>(sh.size()) - 2; i >= 0; --i) {
    bool merge = true;
    for (int k = 0; k < 3; ++k) {
      int64_t t;
      if (__builtin_mul_overflow(cs[k][i + 1], sh[i + 1], &t) || cs[k][i] != t) merge = false;
    }
    if (!merge) continue;
    if (__builtin_mul_overflow(sh[i], sh[i + 1], &sh[i])) return Bad("select", "shape overflows");
    sh.erase(sh.begin() + i + 1);
    for (int k = 0; k < 3; ++k) {
      cs[k][i] = cs[k][i + 1];
      cs[k].erase(cs[k].begin() + i + 1);
    }
  }
  if (sh.empty()) {
    sh.push_back(1);
    for (int k = 0; k < 3; ++k) cs[k].assign(1, 0);
  }
  g.shape = std::move(sh);
  for (int k = 0; k < 3; ++k) g.strides[k] = std::move(cs[k]);
  return ffi::Error::Success();
}

// --- gather and scatter-add ------------------------------------------------------------

// The v1 attributes of one gather or scatter-add call.
struct GatherAttrs {
  std::vector<int64_t> src_shape;    // one src
  std::vector<int64_t> batch_shape;  // the full batch shape, [1] without batch dims
  int64_t row_len = 0, n = 0;
};

// The full batch shape from the leading `nbatch` dims of every operand: per dim, the
// extent of those that are not 1 (they must agree). nbatch is checked against the
// operands' ranks before anything is sized by it.
inline ffi::Error BatchShape(const char* op, int64_t nbatch, std::initializer_list<Dims> all,
                             std::vector<int64_t>& bshape) {
  if (nbatch < 0) return Bad(op, "negative nbatch = " + std::to_string(nbatch));
  if (nbatch > kMaxRank)
    return Bad(op, "nbatch = " + std::to_string(nbatch) + " is above the kernels' limit of " +
                       std::to_string(kMaxRank) + " batch dims");
  for (Dims d : all)
    if (static_cast<int64_t>(d.size()) < nbatch)
      return Bad(op, "nbatch = " + std::to_string(nbatch) + ": an operand " + ShapeString(d) +
                         " has fewer dims");
  bshape.assign(static_cast<size_t>(nbatch), 1);
  for (Dims d : all) {
    for (int64_t j = 0; j < nbatch; ++j) {
      if (d[j] == 1) continue;
      if (bshape[j] != 1 && bshape[j] != d[j])
        return Bad(op, "batch dim " + std::to_string(j) + " differs between operands (" +
                           std::to_string(bshape[j]) + " and " + std::to_string(d[j]) + ")");
      bshape[j] = d[j];
    }
  }
  if (bshape.empty()) bshape.push_back(1);
  return ffi::Error::Success();
}

// Element strides of an operand along the batch dims: its dense stride, 0 where it is
// broadcast (extent 1). Checks the operand's rank is nbatch + rest.
inline ffi::Error BatchStrides(const char* op, const char* name, Dims d, int64_t nbatch,
                               int64_t rest, std::vector<int64_t>& out) {
  if (static_cast<int64_t>(d.size()) != nbatch + rest)
    return Bad(op, std::string(name) + " " + ShapeString(d) + " must have rank nbatch + " +
                       std::to_string(rest) + " = " + std::to_string(nbatch + rest));
  if (nbatch == 0) {
    out.assign(1, 0);
    return ffi::Error::Success();
  }
  std::vector<int64_t> dense;
  if (!DenseStrides(d, dense)) return Bad(op, std::string("bad shape of ") + name);
  out.assign(static_cast<size_t>(nbatch), 0);
  for (int64_t j = 0; j < nbatch; ++j) out[j] = d[j] == 1 ? 0 : dense[j];
  return ffi::Error::Success();
}

// One operand of a gather or scatter-add call: its name in messages, its dims and its
// rank past the batch dims.
struct Operand {
  const char* name;
  Dims dims;
  int64_t rest;
};

// What gather and scatter-add share: the full batch shape over `all` operands; src_shape,
// the dims past the batch of `data` (src itself, or scatter-add's result), which must
// have a dim `dim` before its last; and the batch strides of `data` and then of each of
// `others`, in bstrides[0], bstrides[1], ... Sets *srank, the rank of src.
inline ffi::Error SrcAndBatch(const char* op, int64_t nbatch, int64_t dim,
                              std::initializer_list<Dims> all, const char* data_name, Dims data,
                              std::initializer_list<Operand> others, GatherAttrs& g,
                              std::vector<int64_t>* bstrides, int64_t* srank) {
  JAX_EXT_RETURN_IF_ERROR(BatchShape(op, nbatch, all, g.batch_shape));
  *srank = static_cast<int64_t>(data.size()) - nbatch;
  if (*srank < 2 || dim < 0 || dim > *srank - 2)
    return Bad(op, std::string(data_name) + " " + ShapeString(data) + " with nbatch " +
                       std::to_string(nbatch) + " has no dim " + std::to_string(dim) +
                       " before its last");
  g.src_shape.assign(data.begin() + nbatch, data.end());
  JAX_EXT_RETURN_IF_ERROR(BatchStrides(op, data_name, data, nbatch, *srank, bstrides[0]));
  size_t k = 1;
  for (const Operand& o : others)
    JAX_EXT_RETURN_IF_ERROR(BatchStrides(op, o.name, o.dims, nbatch, o.rest, bstrides[k++]));
  return ffi::Error::Success();
}

// gather(src, offsets, index, num, pad) -> out of shape
// batch + (n, *src_shape[dim+1:-1], row_len).
inline ffi::Error GatherFromBuffers(Dims src, Dims offsets, Dims index, Dims num, Dims pad,
                                    Dims out, int64_t nbatch, int64_t dim, GatherAttrs& g,
                                    std::vector<int64_t> bstrides[5]) {
  const char* op = "gather";
  int64_t srank;
  JAX_EXT_RETURN_IF_ERROR(SrcAndBatch(op, nbatch, dim, {src, offsets, index, num, pad, out}, "src",
                                      src,
                                      {{"offsets", offsets, 1},
                                       {"index", index, 1},
                                       {"num_indices", num, 0},
                                       {"pad_value", pad, 0}},
                                      g, bstrides, &srank));
  g.n = index[nbatch];
  const int64_t orank = 1 + (srank - dim - 2) + 1;
  if (static_cast<int64_t>(out.size()) != nbatch + orank)
    return Bad(op, "result " + ShapeString(out) + " does not fit src " + ShapeString(src));
  for (int64_t j = 0; j < nbatch; ++j)
    if (nbatch > 0 && out[j] != g.batch_shape[j])
      return Bad(op, "result " + ShapeString(out) + " does not carry the full batch");
  bool ok = out[nbatch] == g.n;
  for (int64_t d = dim + 1; d < srank - 1; ++d) ok = ok && out[nbatch + d - dim] == g.src_shape[d];
  if (!ok)
    return Bad(op, "result " + ShapeString(out) + " does not fit src " + ShapeString(src) +
                       " and index " + ShapeString(index));
  g.row_len = out[out.size() - 1];
  return ffi::Error::Success();
}

// scatter_add(ct, offsets, index, num) -> out of shape out_batch + src_shape, where ct
// has shape batch + (n, *src_shape[dim+1:-1], row_len).
inline ffi::Error ScatterFromBuffers(Dims ct, Dims offsets, Dims index, Dims num, Dims out,
                                     int64_t nbatch, int64_t dim, GatherAttrs& g,
                                     std::vector<int64_t> bstrides[4]) {
  const char* op = "scatter_add";
  int64_t srank;
  JAX_EXT_RETURN_IF_ERROR(
      SrcAndBatch(op, nbatch, dim, {ct, offsets, index, num, out}, "result", out,
                  {{"offsets", offsets, 1}, {"index", index, 1}, {"num_indices", num, 0}}, g,
                  bstrides, &srank));
  const int64_t crank = 1 + (srank - dim - 2) + 1;
  if (static_cast<int64_t>(ct.size()) != nbatch + crank)
    return Bad(op, "cotangent " + ShapeString(ct) + " does not fit result " + ShapeString(out));
  g.n = index[nbatch];
  g.row_len = ct[ct.size() - 1];
  return ffi::Error::Success();
}

}  // namespace v2
}  // namespace jax_ext
