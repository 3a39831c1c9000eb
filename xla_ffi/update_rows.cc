// update_rows, a training step that costs the rows it touches, in two kernels around the
// optimizer's arithmetic (which stays XLA code between them):
//
//   read:  the distinct rows U a gather with the same offsets, index and num_indices read
//          (the row geometry of rows.h), numbered in order of first occurrence; for the m
//          of them from `first` on (a window: the whole of U where m = n and first = 0),
//          per slot the sum of the gradient rows addressing it, in index order
//          (accumulate.h, as the scatter-add sums), and the slot's row of the table and of
//          each table-shaped state leaf; and |U|. Slots past U are padding: id -1, zero
//          rows.
//   write: the new rows of the table and of each leaf stored at their slots' rows, in
//          place (the results alias the leaves), every other row untouched.
//
// Duplicates are found with a hash of O(n) slots per batch element, never with a marker
// sized by the table. Each touched row is read once and written once, for every leaf.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
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

// Open addressing over a power of two at least twice the slots, holding slot numbers (-1:
// empty); a slot's key is read back from `ids`, so the probed array is 4 bytes an entry
// and stays in the inner caches.
class RowSlots {
 public:
  explicit RowSlots(int64_t n) {
    int64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    mask_ = cap - 1;
    slots_.reset(new int32_t[static_cast<size_t>(cap)]);
  }
  void Clear() { std::fill_n(slots_.get(), mask_ + 1, int32_t{-1}); }
  // The slot (counted from `base`, whose keys `ids` holds) of `key`, or `fresh` (stored
  // for it) when the key is new; *found says which.
  int64_t Find(int64_t key, const int64_t* ids, int64_t base, int64_t fresh, bool* found) {
    uint64_t h = (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> 17;
    for (;; ++h) {
      int32_t& at = slots_[static_cast<int64_t>(h) & mask_];
      if (at < 0) {
        at = static_cast<int32_t>(fresh - base);
        *found = false;
        return fresh;
      }
      if (ids[base + at] == key) {
        *found = true;
        return base + at;
      }
    }
  }

 private:
  int64_t mask_;
  std::unique_ptr<int32_t[]> slots_;
};

// The window of a read: its first slot per batch element (an operand), m slots.
struct Window {
  IntOperand first;
  const BatchStrides& strides;
  int64_t m;
};

// Per batch element b, numbers the distinct rows k = 0, 1, ... in order of first
// occurrence (their flat rows in `uniq`, n per element; `count` how many); each gradient
// row whose row's k lies in the window adds into slot b * m + (k - first), kFirst on its
// first contribution, the others are dropped (-1, as pad rows); `ids` the flat row of each
// window slot (-1 past the distinct rows); `seen` the slots some row reaches.
void FindSlots(const RowLayout& g, const OperandStrides& st, const ffi::AnyBuffer& offsets,
               const ffi::AnyBuffer& index, const ffi::AnyBuffer& num, const Window& w,
               bool check_bounds, int64_t* targets, int64_t* uniq, int64_t* ids, int64_t* count,
               uint64_t* seen) {
  const IntOperand offs(offsets), nums(num);
  RowSlots slots(g.n);
  std::fill_n(targets, g.total_rows, int64_t{-1});
  std::fill_n(ids, g.batch * w.m, int64_t{-1});
  for (int64_t b = 0; b < g.batch; ++b) {
    const RowBase rb = BaseOf(g, offs, BatchOffset(g, st.offsets, b), check_bounds);
    count[b] = 0;
    if (!rb.ok) continue;
    const int64_t k = std::clamp<int64_t>(nums[BatchOffset(g, st.num, b)], 0, g.n);
    const int64_t first = std::max<int64_t>(0, w.first[BatchOffset(g, w.strides, b)]);
    int64_t next = b * g.n;  // the next row's number, counted from b * n
    slots.Clear();
    ForEachIndexRow(rb, index.untyped_data(), index.element_type(), BatchOffset(g, st.index, b), k,
                    check_bounds, [&](int64_t q, int64_t r) {
                      if (r < 0) return;
                      bool found;
                      const int64_t u = slots.Find(rb.base + r, uniq, b * g.n, next, &found);
                      if (!found) uniq[next++] = rb.base + r;
                      const int64_t at = u - b * g.n - first;
                      if (at < 0 || at >= w.m) return;
                      const int64_t s = b * w.m + at;
                      targets[b * g.n + q] = found ? s : (s | kFirst);
                      if (!found) seen[s >> 6] |= uint64_t{1} << (s & 63);
                    });
    count[b] = next - b * g.n;
    for (int64_t at = 0; at < w.m && first + at < count[b]; ++at)
      ids[b * w.m + at] = uniq[b * g.n + first + at];
  }
}

// Copies row ids[s] of each batch element's `leaf` (rows of row_bytes, `rows` of them per
// element) to slot s of `out`, zeros for padding slots.
void ReadRows(ffi::ThreadPool& pool, const int64_t* ids, int64_t slots, int64_t n, int64_t rows,
              int64_t row_bytes, const char* leaf, char* out) {
  const int64_t min_slots =
      std::max<int64_t>(1, kGatherMinChunkBytes / std::max<int64_t>(1, row_bytes));
  ParallelFor(pool, slots, min_slots, [&](int64_t sb, int64_t se) {
    for (int64_t s = sb; s < se; ++s) {
      char* o = out + s * row_bytes;
      if (ids[s] < 0)
        std::memset(o, 0, static_cast<size_t>(row_bytes));
      else
        std::memcpy(o, leaf + ((s / n) * rows + ids[s]) * row_bytes,
                    static_cast<size_t>(row_bytes));
    }
  });
}

// Every leaf has the table's shape; every row result the sums' shape and its leaf's dtype.
ffi::Error CheckLeaves(const char* op, const ffi::AnyBuffer& table,
                       const ffi::RemainingArgs& leaves, ffi::Result<ffi::AnyBuffer> sums,
                       const ffi::RemainingRets& rows) {
  if (rows.size() != leaves.size() + 1)
    return Invalid(op, "expected a row result per leaf and the table: " + Str(leaves.size() + 1) +
                           ", got " + Str(rows.size()));
  for (size_t k = 0; k <= leaves.size(); ++k) {
    auto leaf = k == 0 ? ffi::ErrorOr<ffi::AnyBuffer>(table) : leaves.get<ffi::AnyBuffer>(k - 1);
    auto out = rows.get<ffi::AnyBuffer>(k);
    if (leaf.has_error() || out.has_error()) return Invalid(op, "a leaf or row is not a buffer");
    const ffi::AnyBuffer& l = leaf.value();
    const ffi::AnyBuffer& o = *out.value();
    JAX_EXT_RETURN_IF_ERROR(CheckWholeBytes(op, l.element_type()));
    if (!(l.dimensions() == table.dimensions()))
      return Invalid(op, "leaf " + ShapeString(l.dimensions()) + " differs from the table " +
                             ShapeString(table.dimensions()));
    if (!(o.dimensions() == sums->dimensions()) || o.element_type() != l.element_type())
      return Invalid(op, "row result " + ShapeString(o.dimensions()) + " must have the shape " +
                             ShapeString(sums->dimensions()) + " and its leaf's dtype");
  }
  return ffi::Error::Success();
}

// Stores `v` as the dtype of `out` (int32, where the handler checked that every value
// fits, or int64).
void StoreInts(const std::vector<int64_t>& v, ffi::Result<ffi::AnyBuffer> out) {
  if (out->element_type() == ffi::DataType::S64)
    std::copy(v.begin(), v.end(), static_cast<int64_t*>(out->untyped_data()));
  else
    std::copy(v.begin(), v.end(), static_cast<int32_t*>(out->untyped_data()));
}

// The read kernel once the layout is checked: slots, sums, then each leaf's rows.
ffi::Error ReadRun(ffi::ThreadPool pool, const ffi::AnyBuffer& table, const ffi::AnyBuffer& offsets,
                   const ffi::AnyBuffer& index, const ffi::AnyBuffer& num, const Window& w,
                   const ffi::AnyBuffer& grads, const ffi::RemainingArgs& leaves,
                   ffi::Result<ffi::AnyBuffer> ids_out, ffi::Result<ffi::AnyBuffer> sums,
                   ffi::Result<ffi::AnyBuffer> count_out, const ffi::RemainingRets& rows,
                   const RowLayout& g, const OperandStrides& st, bool check_bounds) {
  const int64_t slots = g.batch * w.m, row_src = g.inner * g.last;
  std::vector<int64_t> targets(static_cast<size_t>(g.total_rows)),
      uniq(static_cast<size_t>(g.total_rows)), ids(static_cast<size_t>(slots)),
      count(static_cast<size_t>(g.batch));
  std::vector<uint64_t> seen(static_cast<size_t>(slots / 64 + 1), 0);
  FindSlots(g, st, offsets, index, num, w, check_bounds, targets.data(), uniq.data(), ids.data(),
            count.data(), seen.data());
  StoreInts(ids, ids_out);
  StoreInts(count, count_out);
  if (slots * row_src == 0 || g.total_rows == 0) {  // no sum to form: zeros
    std::memset(sums->untyped_data(), 0, sums->size_bytes());
  } else {
    const bool stream =
        PrepareResult(sums->untyped_data(), sums->size_bytes(), ScatterStreamBytes());
    JAX_EXT_RETURN_IF_ERROR(
        DispatchAccumulate(table.element_type(), [&](auto acc, auto conv, int64_t lanes) {
          return ScatterRun<decltype(acc), decltype(conv)::value>(
              pool, g, grads.untyped_data(), sums->untyped_data(), slots * row_src, lanes,
              targets.data(), seen.data(), g.total_rows, stream);
        }));
  }
  const int64_t rows_per_src = row_src > 0 ? g.src_size / row_src : 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const ffi::AnyBuffer leaf = k == 0 ? table : leaves.get<ffi::AnyBuffer>(k - 1).value();
    const int64_t row_bytes = row_src * static_cast<int64_t>(ffi::ByteWidth(leaf.element_type()));
    ReadRows(pool, ids.data(), slots, w.m, rows_per_src, row_bytes,
             static_cast<const char*>(leaf.untyped_data()),
             static_cast<char*>(rows.get<ffi::AnyBuffer>(k).value()->untyped_data()));
  }
  return ffi::Error::Success();
}

// ids and count: int32 or int64, int32 only where every flat row of one table fits it.
ffi::Error CheckIds(const char* op, const ffi::AnyBuffer& table, int64_t srank, int64_t dim,
                    ffi::Result<ffi::AnyBuffer> ids, ffi::Result<ffi::AnyBuffer> count) {
  const ffi::DataType t = ids->element_type();
  if ((t != ffi::DataType::S32 && t != ffi::DataType::S64) || count->element_type() != t)
    return Invalid(op, "ids and count must both be int32 or both int64");
  const Dims td = table.dimensions();
  const int64_t nbatch = static_cast<int64_t>(td.size()) - srank;
  int64_t rows = 1;  // one table's flat rows
  for (int64_t d = 0; d <= dim; ++d)
    if (__builtin_mul_overflow(rows, td[nbatch + d], &rows)) rows = INT64_MAX;
  if (t == ffi::DataType::S32 && rows > INT32_MAX)
    return Invalid(op, "int32 ids cannot hold " + Str(rows) + " rows");
  return ffi::Error::Success();
}

// read(offsets, index, num_indices, first, grads, table, *leaves) -> (ids, sums, count,
// table rows, *leaf rows): shapes from the buffers (the window's m from ids'), the
// attributes only dim, nbatch and check_bounds. Every operand and result carries the whole
// batch (nothing broadcast but offsets, num_indices and first).
ffi::Error ReadImpl(ffi::ThreadPool pool, ffi::AnyBuffer offsets, ffi::AnyBuffer index,
                    ffi::AnyBuffer num, ffi::AnyBuffer first, ffi::AnyBuffer grads,
                    ffi::AnyBuffer table, ffi::RemainingArgs leaves,
                    ffi::Result<ffi::AnyBuffer> ids, ffi::Result<ffi::AnyBuffer> sums,
                    ffi::Result<ffi::AnyBuffer> count, ffi::RemainingRets rows, int64_t dim,
                    int64_t nbatch, bool check_bounds) {
  const char* op = "update_rows_read";
  const Dims td = table.dimensions(), gd = grads.dimensions(), sd = sums->dimensions();
  RowLayout g;
  OperandStrides st;
  BatchStrides fst;
  JAX_EXT_RETURN_IF_ERROR(
      BatchFromBuffers(op, nbatch, {td, ids->dimensions(), sd, count->dimensions()}, g));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t srank, RankPastBatch(op, "table", td, nbatch, dim));
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "table", td, srank, "nbatch + rest", g, st.data));
  int64_t n;
  JAX_EXT_RETURN_IF_ERROR(
      IndexStrides(op, offsets.dimensions(), index.dimensions(), num.dimensions(), dim, g, st, &n));
  JAX_EXT_RETURN_IF_ERROR(BatchStridesOf(op, "first", first.dimensions(), 0, "nbatch", g, fst));
  JAX_EXT_RETURN_IF_ERROR(CheckRank(op, "ids", ids->dimensions(), nbatch + 1, "nbatch + 1"));
  JAX_EXT_RETURN_IF_ERROR(CheckRank(op, "count", count->dimensions(), nbatch, "nbatch"));
  for (int64_t j = 0; j < nbatch; ++j)
    if (td[j] != g.bshape[j] || index.dimensions()[j] != g.bshape[j] ||
        ids->dimensions()[j] != g.bshape[j] || count->dimensions()[j] != g.bshape[j])
      return Invalid(op, "the table, index, ids and count must carry the whole batch");
  const int64_t m = ids->dimensions()[nbatch];
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t row_len,
                           PaddedRowLength(op, "grads", gd, "table", td, dim, n, g));
  JAX_EXT_RETURN_IF_ERROR(SetRows(op, g, td.last(srank), dim, row_len, n));
  JAX_EXT_RETURN_IF_ERROR(SetRowCounts(op, "grads", g));
  JAX_EXT_ASSIGN_OR_RETURN(const int64_t unused,
                           PaddedRowLength(op, "sums", sd, "table", td, dim, m, g));
  if (unused != g.last) return Invalid(op, "sums must hold unpadded rows");
  JAX_EXT_RETURN_IF_ERROR(CheckIds(op, table, srank, dim, ids, count));
  JAX_EXT_RETURN_IF_ERROR(
      CheckSameDtype(op, "the table and the sums", table.element_type(), {sums->element_type()}));
  JAX_EXT_RETURN_IF_ERROR(
      CheckDtypeOrWire(op, "grads and the table", table.element_type(), grads.element_type()));
  if (first.element_type() != ffi::DataType::S32 && first.element_type() != ffi::DataType::S64)
    return Invalid(op, "first must be int32 or int64");
  JAX_EXT_RETURN_IF_ERROR(CheckIndexDtypes(op, offsets, index, num));
  JAX_EXT_RETURN_IF_ERROR(CheckLeaves(op, table, leaves, sums, rows));
  if (g.n > INT32_MAX) return Invalid(op, "more than 2^31 - 1 indices per batch element");
  if (g.batch == 0) return ffi::Error::Success();
  return ReadRun(pool, table, offsets, index, num, Window{IntOperand(first), fst, m}, grads, leaves,
                 ids, sums, count, rows, g, st, check_bounds);
}

// One leaf of the write: (*batch, rows, E) in, its new rows (*batch, n, E) and its result.
struct WriteLeaf {
  const char* rows;
  char* out;
  int64_t row_bytes;
};

// Each leaf and its new rows: the leaf (*batch, R, E) and its result alike, the rows
// (*batch, n, E) of its dtype. Sets R.
ffi::Error CheckWriteLeaves(const char* op, const ffi::RemainingArgs& args,
                            const ffi::RemainingRets& rets, Dims ids, int64_t nbatch,
                            std::vector<WriteLeaf>& out, int64_t* rows) {
  const size_t k = rets.size();
  if (k == 0 || args.size() != 2 * k)
    return Invalid(op, "expected leaves, their new rows and a result per leaf");
  for (size_t j = 0; j < k; ++j) {
    auto leaf = args.get<ffi::AnyBuffer>(j), upd = args.get<ffi::AnyBuffer>(k + j);
    auto res = rets.get<ffi::AnyBuffer>(j);
    if (leaf.has_error() || upd.has_error() || res.has_error())
      return Invalid(op, "a leaf, row or result is not a buffer");
    const Dims ld = leaf->dimensions(), ud = upd->dimensions();
    JAX_EXT_RETURN_IF_ERROR(CheckRank(op, "a leaf", ld, nbatch + 2, "nbatch + 2"));
    JAX_EXT_RETURN_IF_ERROR(CheckWholeBytes(op, leaf->element_type()));
    bool ok = ud.size() == ld.size() && ud[nbatch] == ids[nbatch] && ud.back() == ld.back() &&
              upd->element_type() == leaf->element_type() && (res.value()->dimensions() == ld) &&
              res.value()->element_type() == leaf->element_type();
    for (int64_t d = 0; d < nbatch && ok; ++d) ok = ld[d] == ids[d] && ud[d] == ids[d];
    if (!ok || (j > 0 && ld[nbatch] != *rows))
      return Invalid(op, "leaf " + ShapeString(ld) + ", its rows " + ShapeString(ud) + " and ids " +
                             ShapeString(ids) + " do not fit");
    *rows = ld[nbatch];
    const int64_t row_bytes =
        ld.back() * static_cast<int64_t>(ffi::ByteWidth(leaf->element_type()));
    char* dst = static_cast<char*>(res.value()->untyped_data());
    if (dst != leaf->untyped_data())  // not aliased: start from the leaf's bits
      std::memcpy(dst, leaf->untyped_data(), leaf->size_bytes());
    out.push_back({static_cast<const char*>(upd->untyped_data()), dst, row_bytes});
  }
  return ffi::Error::Success();
}

// write(ids, *leaves, *rows) -> *leaves: row ids[s] of each leaf (of its batch element)
// becomes slot s of its rows; ids of -1 write nothing. Every id is checked before a byte
// is written.
ffi::Error WriteImpl(ffi::ThreadPool pool, ffi::AnyBuffer ids, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, int64_t nbatch) {
  const char* op = "update_rows_write";
  if (nbatch < 0 || nbatch > kMaxRank)
    return Invalid(op, "nbatch = " + Str(nbatch) + " out of range");
  const Dims id = ids.dimensions();
  JAX_EXT_RETURN_IF_ERROR(CheckRank(op, "ids", id, nbatch + 1, "nbatch + 1"));
  if (ids.element_type() != ffi::DataType::S64 && ids.element_type() != ffi::DataType::S32)
    return Invalid(op, "ids must be int32 or int64");
  std::vector<WriteLeaf> leaves;
  int64_t rows = 0;
  JAX_EXT_RETURN_IF_ERROR(CheckWriteLeaves(op, args, rets, id, nbatch, leaves, &rows));
  const int64_t slots = static_cast<int64_t>(ids.element_count()), n = id[nbatch];
  const IntOperand p(ids);
  for (int64_t s = 0; s < slots; ++s)
    if (p[s] < -1 || p[s] >= rows)
      return Invalid(op, "id " + Str(p[s]) + " outside [-1, " + Str(rows) + ")");
  for (const WriteLeaf& w : leaves) {
    const int64_t min_slots =
        std::max<int64_t>(1, kGatherMinChunkBytes / std::max<int64_t>(1, w.row_bytes));
    ParallelFor(pool, slots, min_slots, [&](int64_t sb, int64_t se) {
      for (int64_t s = sb; s < se; ++s)
        if (p[s] >= 0)
          std::memcpy(w.out + ((s / n) * rows + p[s]) * w.row_bytes, w.rows + s * w.row_bytes,
                      static_cast<size_t>(w.row_bytes));
    });
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    UpdateRowsReadHandler, ReadImpl,
    WithRowAttrs(WithIndexOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())
                     .Arg<ffi::AnyBuffer>()  // first
                     .Arg<ffi::AnyBuffer>()  // grads
                     .Arg<ffi::AnyBuffer>()  // table
                     .RemainingArgs()        // table-shaped leaves
                     .Ret<ffi::AnyBuffer>()  // ids
                     .Ret<ffi::AnyBuffer>()  // sums
                     .Ret<ffi::AnyBuffer>()  // count
                     .RemainingRets()));     // rows, table first
XLA_FFI_DEFINE_HANDLER_SYMBOL(UpdateRowsWriteHandler, WriteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // ids
                                  .RemainingArgs()        // leaves, then their rows
                                  .RemainingRets()        // the leaves, aliased
                                  .Attr<int64_t>("nbatch"));

}  // namespace jax_ext
