// Scatter-add, gather's transpose with respect to src (the row geometry is in rows.h): ct
// rows that gathered real data are added into a zeroed output laid out like src (batch
// dims broadcast: several batch elements accumulate into one output), padding columns and
// padded rows are dropped. The adds, in ct order per output element whatever the thread
// count, are accumulate.h's.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "accumulate.h"
#include "check.h"
#include "dispatch.h"
#include "memory.h"
#include "parallel.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

// The output row (in units of row_src elements) each ct row adds into, -1 when the row is
// dropped, kFirst set on the first (in ct order) that reaches its row; `seen` marks the
// output rows some ct row reaches.
void FindTargets(const RowLayout& g, const OperandStrides& st, const ffi::AnyBuffer& offsets,
                 const ffi::AnyBuffer& index, const ffi::AnyBuffer& num, bool check_bounds,
                 int64_t row_src, int64_t* targets, uint64_t* seen) {
  const IntOperand offs(offsets), nums(num);
  for (int64_t b = 0; b < g.batch; ++b) {
    const RowBase rb = BaseOf(g, offs, BatchOffset(g, st.offsets, b), check_bounds);
    if (!rb.ok) continue;
    const int64_t k = std::clamp<int64_t>(nums[BatchOffset(g, st.num, b)], 0, g.n);
    const int64_t ob = BatchOffset(g, st.data, b) / row_src;  // src_size is a multiple
    int64_t* tb = targets + b * g.n;
    auto mark = [&](int64_t q, int64_t r) {
      if (r < 0) return;
      const int64_t t = ob + rb.base + r;
      uint64_t& w = seen[t >> 6];
      const uint64_t bit = uint64_t{1} << (t & 63);
      tb[q] = (w & bit) ? t : (t | kFirst);
      w |= bit;
    };
    ForEachIndexRow(rb, index.untyped_data(), index.element_type(), BatchOffset(g, st.index, b), k,
                    check_bounds, mark);
  }
}

// What both targets run once the layout is known: dtype checks, where each ct row goes,
// then the adds.
ffi::Error ScatterAddRun(ffi::ThreadPool pool, ffi::AnyBuffer ct, ffi::AnyBuffer offsets,
                         ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::Result<ffi::AnyBuffer> out,
                         const RowLayout& g, const OperandStrides& st, bool check_bounds) {
  const ffi::DataType dt = out->element_type();
  // ct may arrive as its wire values (the collective that gathered it moved integers).
  JAX_EXT_RETURN_IF_ERROR(
      CheckDtypeOrWire("scatter_add", "the cotangent and the result", dt, ct.element_type()));
  JAX_EXT_RETURN_IF_ERROR(CheckIndexDtypes("scatter_add", offsets, index, num));
  // An unsupported dtype is turned away before anything is allocated or mapped.
  JAX_EXT_RETURN_IF_ERROR(
      DispatchAccumulate(dt, [](auto, auto, int64_t) { return ffi::Error::Success(); }));
  const int64_t out_elems = static_cast<int64_t>(out->element_count());
  if (out_elems == 0) return ffi::Error::Success();
  // With empty src rows or no ct rows nothing is added: the result is zeros. (total_rows
  // and row_len are then not bounded by the cotangent's size, so nothing is sized by them.)
  const int64_t row_src = g.inner * g.last;
  if (row_src == 0 || g.total_rows == 0) {
    std::memset(out->untyped_data(), 0, out->size_bytes());
    return ffi::Error::Success();
  }
  std::vector<int64_t> targets(static_cast<size_t>(g.total_rows), -1);
  std::vector<uint64_t> seen(static_cast<size_t>(out_elems / row_src / 64 + 1), 0);
  FindTargets(g, st, offsets, index, num, check_bounds, row_src, targets.data(), seen.data());
  const bool stream = PrepareResult(out->untyped_data(), out->size_bytes(), ScatterStreamBytes());
  return DispatchAccumulate(dt, [&](auto acc, auto conv, int64_t lanes) {
    return ScatterRun<decltype(acc), decltype(conv)::value>(
        pool, g, ct.untyped_data(), out->untyped_data(), out_elems, lanes, targets.data(),
        seen.data(), static_cast<int64_t>(targets.size()), stream);
  });
}

// The handler: shapes from the buffers; the attributes carry only dim, nbatch and
// check_bounds.
ffi::Error ScatterAddImpl(ffi::ThreadPool pool, ffi::AnyBuffer ct, ffi::AnyBuffer offsets,
                          ffi::AnyBuffer index, ffi::AnyBuffer num, ffi::Result<ffi::AnyBuffer> out,
                          int64_t dim, int64_t nbatch, bool check_bounds) {
  const char* op = "scatter_add";
  const Dims cd = ct.dimensions(), od = out->dimensions();
  RowLayout g;
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(BatchFromBuffers(
      op, nbatch, {cd, offsets.dimensions(), index.dimensions(), num.dimensions(), od}, g));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t srank, RankPastBatch(op, "result", od, nbatch, dim));
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "result", od, srank, "nbatch + rest", g, st.data));
  int64_t n;
  JAX_EXT_RETURN_IF_ERROR(
      IndexStrides(op, offsets.dimensions(), index.dimensions(), num.dimensions(), dim, g, st, &n));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t row_len,
                           PaddedRowLength(op, "cotangent", cd, "result", od, dim, n, g));
  JAX_EXT_RETURN_IF_ERROR(SetRows(op, g, od.last(srank), dim, row_len, n));
  JAX_EXT_RETURN_IF_ERROR(SetRowCounts(op, "the cotangent", g));
  return ScatterAddRun(pool, ct, offsets, index, num, out, g, st, check_bounds);
}

// Programs exported by jax_ext 0.1.0: shapes and batch strides as attributes, each checked
// against the buffers.
ffi::Error ScatterAddShapeAttrsImpl(ffi::ThreadPool pool, ffi::AnyBuffer ct, ffi::AnyBuffer offsets,
                                    ffi::AnyBuffer index, ffi::AnyBuffer num,
                                    ffi::Result<ffi::AnyBuffer> out, Dims src_shape, int64_t dim,
                                    int64_t row_len, int64_t n, bool check_bounds, Dims batch_shape,
                                    Dims out_bstrides, Dims offsets_bstrides, Dims index_bstrides,
                                    Dims num_bstrides) {
  const char* op = "scatter_add";
  RowLayout g;
  OperandStrides st;
  JAX_EXT_RETURN_IF_ERROR(SetRows(op, g, src_shape, dim, row_len, n));
  JAX_EXT_RETURN_IF_ERROR(BatchFromAttr(op, batch_shape, g));
  JAX_EXT_RETURN_IF_ERROR(CheckIndexStrideAttrs(op, g, offsets, index, num, offsets_bstrides,
                                                index_bstrides, num_bstrides, st));
  JAX_EXT_RETURN_IF_ERROR(
      CheckStrideAttr(op, "result", g, out_bstrides, g.src_size, out->element_count(), st.data));
  for (const int64_t s : out_bstrides)  // FindTargets counts the result in whole rows
    if (g.src_size > 0 && s % g.src_size != 0)
      return Invalid(op, "the result's batch strides must be multiples of src's size");
  JAX_EXT_RETURN_IF_ERROR(CheckPaddedRowCount(op, "the cotangent", g, ct.element_count()));
  return ScatterAddRun(pool, ct, offsets, index, num, out, g, st, check_bounds);
}

// scatter_add(ct, offsets, index, num_indices) -> result (laid out like src); ct holds
// the padded rows.
auto ScatterAddOperands() {
  return WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::AnyBuffer>())  // ct
      .Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScatterAddHandler, ScatterAddImpl,
                              WithRowAttrs(ScatterAddOperands()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScatterAddShapeAttrsHandler, ScatterAddShapeAttrsImpl,
                              WithShapeAttrs(ScatterAddOperands(), "out_bstrides"));

}  // namespace jax_ext
