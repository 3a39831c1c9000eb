// Select: out = cond ? x : y over a (collapsed) output shape. Every operand is read
// through its own element strides, 0 where it is broadcast, so broadcast and vmapped
// operands are never materialized. Python collapses dimensions and computes strides;
// this file validates them against the buffers and moves bytes.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "common.h"
#include "geometry_v2.h"
#include "memory.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

// One output row of length n. CS/XS/YS: the inner stride as a compile-time 0 or 1
// (vectorizable), or -1 for a runtime stride.
template <typename T, int CS, int XS, int YS>
void BlendRow(int64_t n, const uint8_t* c, int64_t cs, const T* x, int64_t xs, const T* y,
              int64_t ys, T* o) {
  const int64_t csv = CS >= 0 ? CS : cs, xsv = XS >= 0 ? XS : xs, ysv = YS >= 0 ? YS : ys;
  if constexpr (CS == 0) {
    // One condition for the whole row: a copy (or fill) from one side.
    const T* s = c[0] ? x : y;
    const int64_t ss = c[0] ? xsv : ysv;
    if (ss == 1) {
      std::memcpy(o, s, static_cast<size_t>(n) * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = s[i * ss];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = Pick(c[i * csv], x[i * xsv], y[i * ysv]);
  }
}

// In place (out is x's buffer): touch only blocks holding a false condition, so a
// mostly-true mask writes (and dirties) little memory.
template <typename T, int CS, int YS>
void InPlaceRow(int64_t n, const uint8_t* c, int64_t cs, const T* y, int64_t ys, T* o) {
  const int64_t csv = CS >= 0 ? CS : cs, ysv = YS >= 0 ? YS : ys;
  if constexpr (CS == 0) {
    if (c[0]) return;
    for (int64_t i = 0; i < n; ++i) o[i] = y[i * ysv];
  } else {
    constexpr int64_t kBlock = 256;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      uint8_t all = 1;
      for (int64_t i = b; i < e; ++i) all &= static_cast<uint8_t>(c[i * csv] != 0);
      if (all) continue;
      for (int64_t i = b; i < e; ++i) o[i] = Pick(c[i * csv], o[i], y[i * ysv]);
    }
  }
}

template <typename T>
using BlendFn = void (*)(int64_t, const uint8_t*, int64_t, const T*, int64_t, const T*, int64_t,
                         T*);
template <typename T>
using InPlaceFn = void (*)(int64_t, const uint8_t*, int64_t, const T*, int64_t, T*);

template <typename T>
BlendFn<T> ChooseBlend(int64_t cs, int64_t xs, int64_t ys) {
  if (cs > 1 || xs > 1 || ys > 1) return BlendRow<T, -1, -1, -1>;
  static constexpr BlendFn<T> table[2][2][2] = {
      {{BlendRow<T, 0, 0, 0>, BlendRow<T, 0, 0, 1>}, {BlendRow<T, 0, 1, 0>, BlendRow<T, 0, 1, 1>}},
      {{BlendRow<T, 1, 0, 0>, BlendRow<T, 1, 0, 1>}, {BlendRow<T, 1, 1, 0>, BlendRow<T, 1, 1, 1>}}};
  return table[cs][xs][ys];
}

template <typename T>
InPlaceFn<T> ChooseInPlace(int64_t cs, int64_t ys) {
  if (cs > 1 || ys > 1) return InPlaceRow<T, -1, -1>;
  static constexpr InPlaceFn<T> table[2][2] = {{InPlaceRow<T, 0, 0>, InPlaceRow<T, 0, 1>},
                                               {InPlaceRow<T, 1, 0>, InPlaceRow<T, 1, 1>}};
  return table[cs][ys];
}

// The validated walk: the (collapsed) result shape and each operand's element strides
// over it.
struct SelectLayout {
  int rank;
  std::array<int64_t, kMaxRank> shape;
  std::array<std::array<int64_t, kMaxRank>, 3> strides;  // cond, x, y (elements)
};

// Calls row(n, offsets[3], out_offset) for every maximal run of the innermost
// dimension that lies in the linear output range [begin, end).
template <typename RowCall>
void ForEachRow(const SelectLayout& g, int64_t begin, int64_t end, RowCall&& row) {
  const int last = g.rank - 1;
  const int64_t inner = g.shape[last];
  std::array<int64_t, kMaxRank> idx{};
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

// Largest element offset an operand is read at, or -1 on overflow.
int64_t MaxOffset(const SelectLayout& g, int k) {
  int64_t m = 0;
  for (int d = 0; d < g.rank; ++d) {
    int64_t t;
    if (__builtin_mul_overflow(g.shape[d] - 1, g.strides[k][d], &t) ||
        __builtin_add_overflow(m, t, &m))
      return -1;
  }
  return m;
}

ffi::Error SelectImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::PRED> cond, ffi::AnyBuffer x,
                      ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out,
                      ffi::Span<const int64_t> shape, ffi::Span<const int64_t> cond_strides,
                      ffi::Span<const int64_t> x_strides, ffi::Span<const int64_t> y_strides) {
  const ffi::Span<const int64_t> strides[3] = {cond_strides, x_strides, y_strides};
  const char* names[3] = {"cond", "x", "y"};
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 1 || rank > kMaxRank)
    return ffi::Error::InvalidArgument("jax_ext select: rank " + std::to_string(rank) +
                                       " outside [1, " + std::to_string(kMaxRank) + "]");
  if (x.element_type() != out->element_type() || y.element_type() != out->element_type())
    return ffi::Error::InvalidArgument("jax_ext select: x, y and the result differ in dtype");
  if (IsSubByte(out->element_type()))
    return ffi::Error::InvalidArgument("jax_ext select: sub-byte dtypes are not supported");
  SelectLayout g{};
  g.rank = static_cast<int>(rank);
  int64_t total = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (shape[d] < 0 || __builtin_mul_overflow(total, shape[d], &total))
      return ffi::Error::InvalidArgument("jax_ext select: bad shape " + ShapeString(shape));
    g.shape[d] = shape[d];
  }
  if (total != static_cast<int64_t>(out->element_count()))
    return ffi::Error::InvalidArgument("jax_ext select: shape " + ShapeString(shape) +
                                       " does not match the result's " +
                                       std::to_string(out->element_count()) + " elements");
  const size_t counts[3] = {cond.element_count(), x.element_count(), y.element_count()};
  for (int k = 0; k < 3; ++k) {
    if (static_cast<int64_t>(strides[k].size()) != rank)
      return ffi::Error::InvalidArgument(std::string("jax_ext select: ") + names[k] +
                                         " strides have the wrong rank");
    for (int64_t d = 0; d < rank; ++d) {
      if (strides[k][d] < 0)
        return ffi::Error::InvalidArgument(std::string("jax_ext select: negative stride for ") +
                                           names[k]);
      g.strides[k][d] = strides[k][d];
    }
    if (total > 0) {
      const int64_t m = MaxOffset(g, k);
      if (m < 0 || m >= static_cast<int64_t>(counts[k]))
        return ffi::Error::InvalidArgument(
            std::string("jax_ext select: strides ") + ShapeString(strides[k]) + " over shape " +
            ShapeString(shape) + " read past the end of " + names[k] + " (" +
            std::to_string(counts[k]) + " elements)");
    }
  }
  if (total == 0) return ffi::Error::Success();

  // In place: XLA handed us x's buffer as the output (input_output_aliases), so x must be
  // laid out exactly like the output.
  const bool in_place = out->untyped_data() == x.untyped_data();
  if (in_place) {
    int64_t dense = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (g.shape[d] != 1 && g.strides[1][d] != dense)
        return ffi::Error::InvalidArgument("jax_ext select: aliased x is not dense");
      dense *= g.shape[d];
    }
  }

  // Past the last-level cache, a reused result is written a few KiB at a time: blended
  // into a tile that stays in L1, then streamed out, so its lines are not read before
  // being written (not a result just mapped, whose zeroed lines are in cache). From
  // 64 MiB, as the gather: at 16 MiB on reused buffers regular stores were faster (bf16
  // and int8 2^22 selects 0.99-1.05x -> 1.11-1.18x of jnp.where, the broadcast case
  // 0.71-0.84x -> 1.00-1.24x).
  const bool stream =
      !in_place && PrepareResult(out->untyped_data(), out->size_bytes(), 4 * kStreamBytes);
  const size_t width = ffi::ByteWidth(out->element_type());
  return DispatchWidth(width, [&](auto tag) -> ffi::Error {
    using T = decltype(tag);
    const uint8_t* c = static_cast<const uint8_t*>(cond.untyped_data());
    const T* xp = static_cast<const T*>(x.untyped_data());
    const T* yp = static_cast<const T*>(y.untyped_data());
    T* op = static_cast<T*>(out->untyped_data());
    const int last = g.rank - 1;
    const int64_t cs = g.strides[0][last], xs = g.strides[1][last], ys = g.strides[2][last];
    const int64_t min_chunk = std::max<int64_t>(1, kSelectMinChunkBytes / int64_t(sizeof(T)));
    if (in_place) {
      const InPlaceFn<T> fn = ChooseInPlace<T>(cs, ys);
      ParallelFor(pool, total, min_chunk, [&](int64_t b, int64_t e) {
        ForEachRow(g, b, e, [&](int64_t n, int64_t co, int64_t, int64_t yo, int64_t oo) {
          fn(n, c + co, cs, yp + yo, ys, op + oo);
        });
      });
    } else {
      const BlendFn<T> fn = ChooseBlend<T>(cs, xs, ys);
      constexpr int64_t kTile = 4096 / int64_t(sizeof(T));  // 256 elements or more
      ParallelFor(pool, total, min_chunk, [&](int64_t b, int64_t e) {
        alignas(64) T tile[kTile];
        ForEachRow(g, b, e, [&](int64_t n, int64_t co, int64_t xo, int64_t yo, int64_t oo) {
          if (!stream) return fn(n, c + co, cs, xp + xo, xs, yp + yo, ys, op + oo);
          for (int64_t i = 0; i < n; i += kTile) {
            const int64_t m = std::min(kTile, n - i);
            fn(m, c + co + i * cs, cs, xp + xo + i * xs, xs, yp + yo + i * ys, ys, tile);
            StreamBytes(op + oo + i, tile, m * int64_t(sizeof(T)));
          }
        });
        if (stream) StreamFence();
      });
    }
    return ffi::Error::Success();
  });
}

// v2: the same kernel; shape and strides come from the buffers (geometry_v2.h), the
// attributes only say which result dimension each operand dimension lies along.
ffi::Error SelectV2Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::PRED> cond, ffi::AnyBuffer x,
                        ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Span<const int64_t> cond_dims, ffi::Span<const int64_t> x_dims,
                        ffi::Span<const int64_t> y_dims) {
  const v2::Dims operands[3] = {cond.dimensions(), x.dimensions(), y.dimensions()};
  const v2::Dims maps[3] = {cond_dims, x_dims, y_dims};
  v2::SelectAttrs g;
  JAX_EXT_RETURN_IF_ERROR(v2::SelectFromBuffers(out->dimensions(), operands, maps, g));
  return SelectImpl(pool, cond, x, y, out, v2::Of(g.shape), v2::Of(g.strides[0]),
                    v2::Of(g.strides[1]), v2::Of(g.strides[2]));
}

// select(cond, x, y) -> result: the operands of both targets, written once.
auto SelectOperands() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::PRED>>()  // cond: XLA rejects any other dtype before the call
      .Arg<ffi::AnyBuffer>()          // x
      .Arg<ffi::AnyBuffer>()          // y
      .Ret<ffi::AnyBuffer>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SelectHandler, SelectImpl,
                              SelectOperands()
                                  .Attr<ffi::Span<const int64_t>>("shape")
                                  .Attr<ffi::Span<const int64_t>>("cond_strides")
                                  .Attr<ffi::Span<const int64_t>>("x_strides")
                                  .Attr<ffi::Span<const int64_t>>("y_strides"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SelectV2Handler, SelectV2Impl,
                              SelectOperands()
                                  .Attr<ffi::Span<const int64_t>>("cond_dims")
                                  .Attr<ffi::Span<const int64_t>>("x_dims")
                                  .Attr<ffi::Span<const int64_t>>("y_dims"));

}  // namespace jax_ext
