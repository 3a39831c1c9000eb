// Select: out = cond ? x : y over the layout of strided.h. The handler reads the shapes
// from the buffers; the adapter for programs exported by jax_ext 0.1.0 checks their shape
// and stride attributes instead. Both then run SelectRun.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "cpu.h"
#include "dispatch.h"
#include "memory.h"
#include "parallel.h"
#include "strided.h"
#include "xla/ffi/api/ffi.h"

namespace jax_ext {
namespace {

// Branch-free choice: reads both sides (they are always in bounds) so loops vectorize.
template <typename T>
inline T Pick(uint8_t c, T x, T y) {
  const T m = static_cast<T>(-static_cast<T>(c != 0));
  return static_cast<T>((x & m) | (y & static_cast<T>(~m)));
}
template <>
inline U128 Pick<U128>(uint8_t c, U128 x, U128 y) {
  const uint64_t m = -static_cast<uint64_t>(c != 0);
  return {(x.lo & m) | (y.lo & ~m), (x.hi & m) | (y.hi & ~m)};
}

// One output row of length n. CS/XS/YS: the inner stride as a compile-time 0 or 1
// (vectorizable), or -1 for a runtime stride.
template <typename T, int CS, int XS, int YS>
inline __attribute__((always_inline)) void BlendRow(int64_t n, const uint8_t* c, int64_t cs,
                                                    const T* x, int64_t xs, const T* y, int64_t ys,
                                                    T* o) {
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
inline __attribute__((always_inline)) void InPlaceRow(int64_t n, const uint8_t* c, int64_t cs,
                                                      const T* y, int64_t ys, T* o) {
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

// The loops compiled twice: for the baseline the wheels target (SSE2 on x86-64) and, on
// x86-64, for AVX2, chosen at run time. XLA compiles its own loops for the machine it runs
// on, so a kernel held to the baseline's vectors loses to it on memory-bound loops that
// the wider vectors speed up (see docs/performance.md, "The select's loops for AVX2").
struct Baseline {
  template <typename T, int CS, int XS, int YS>
  static void Blend(int64_t n, const uint8_t* c, int64_t cs, const T* x, int64_t xs, const T* y,
                    int64_t ys, T* o) {
    BlendRow<T, CS, XS, YS>(n, c, cs, x, xs, y, ys, o);
  }
  template <typename T, int CS, int YS>
  static void InPlace(int64_t n, const uint8_t* c, int64_t cs, const T* y, int64_t ys, T* o) {
    InPlaceRow<T, CS, YS>(n, c, cs, y, ys, o);
  }
};
#if defined(JAX_EXT_X86_AVX2)
struct Avx2 {
  template <typename T, int CS, int XS, int YS>
  JAX_EXT_TARGET_AVX2 static void Blend(int64_t n, const uint8_t* c, int64_t cs, const T* x,
                                        int64_t xs, const T* y, int64_t ys, T* o) {
    BlendRow<T, CS, XS, YS>(n, c, cs, x, xs, y, ys, o);
  }
  template <typename T, int CS, int YS>
  JAX_EXT_TARGET_AVX2 static void InPlace(int64_t n, const uint8_t* c, int64_t cs, const T* y,
                                          int64_t ys, T* o) {
    InPlaceRow<T, CS, YS>(n, c, cs, y, ys, o);
  }
};
#endif

template <typename Isa, typename T>
BlendFn<T> BlendFor(int64_t cs, int64_t xs, int64_t ys) {
  if (cs > 1 || xs > 1 || ys > 1) return Isa::template Blend<T, -1, -1, -1>;
  static constexpr BlendFn<T> table[2][2][2] = {
      {{Isa::template Blend<T, 0, 0, 0>, Isa::template Blend<T, 0, 0, 1>},
       {Isa::template Blend<T, 0, 1, 0>, Isa::template Blend<T, 0, 1, 1>}},
      {{Isa::template Blend<T, 1, 0, 0>, Isa::template Blend<T, 1, 0, 1>},
       {Isa::template Blend<T, 1, 1, 0>, Isa::template Blend<T, 1, 1, 1>}}};
  return table[cs][xs][ys];
}

template <typename Isa, typename T>
InPlaceFn<T> InPlaceFor(int64_t cs, int64_t ys) {
  if (cs > 1 || ys > 1) return Isa::template InPlace<T, -1, -1>;
  static constexpr InPlaceFn<T> table[2][2] = {
      {Isa::template InPlace<T, 0, 0>, Isa::template InPlace<T, 0, 1>},
      {Isa::template InPlace<T, 1, 0>, Isa::template InPlace<T, 1, 1>}};
  return table[cs][ys];
}

template <typename T>
BlendFn<T> ChooseBlend(int64_t cs, int64_t xs, int64_t ys) {
#if defined(JAX_EXT_X86_AVX2)
  if (HasAvx2()) return BlendFor<Avx2, T>(cs, xs, ys);
#endif
  return BlendFor<Baseline, T>(cs, xs, ys);
}

template <typename T>
InPlaceFn<T> ChooseInPlace(int64_t cs, int64_t ys) {
#if defined(JAX_EXT_X86_AVX2)
  if (HasAvx2()) return InPlaceFor<Avx2, T>(cs, ys);
#endif
  return InPlaceFor<Baseline, T>(cs, ys);
}

// A checked select call, typed by element width T.
template <typename T>
struct SelectCall {
  const StridedLayout& g;
  const uint8_t* c;
  const T* x;
  const T* y;
  T* out;
  int64_t total;       // result elements
  int64_t cs, xs, ys;  // innermost strides

  int64_t MinChunk() const {
    return std::max<int64_t>(1, kSelectMinChunkBytes / int64_t(sizeof(T)));
  }
};

// Writes the result over x's own buffer: only the false positions change.
template <typename T>
void SelectInPlace(ffi::ThreadPool& pool, const SelectCall<T>& s) {
  const InPlaceFn<T> fn = ChooseInPlace<T>(s.cs, s.ys);
  ParallelFor(pool, s.total, s.MinChunk(), [&](int64_t b, int64_t e) {
    ForEachRow(s.g, b, e, [&](int64_t n, int64_t co, int64_t, int64_t yo, int64_t oo) {
      fn(n, s.c + co, s.cs, s.y + yo, s.ys, s.out + oo);
    });
  });
}

// Writes a fresh result. With `stream` (a reused result past the last-level cache) each row
// is blended a few KiB at a time into a tile that stays in L1, then streamed out, so the
// result's lines are not read before being written.
template <typename T>
void SelectBlend(ffi::ThreadPool& pool, const SelectCall<T>& s, bool stream) {
  const BlendFn<T> fn = ChooseBlend<T>(s.cs, s.xs, s.ys);
  constexpr int64_t kTile = 4096 / int64_t(sizeof(T));  // 256 elements or more
  ParallelFor(pool, s.total, s.MinChunk(), [&](int64_t b, int64_t e) {
    alignas(64) T tile[kTile];
    ForEachRow(s.g, b, e, [&](int64_t n, int64_t co, int64_t xo, int64_t yo, int64_t oo) {
      if (!stream) return fn(n, s.c + co, s.cs, s.x + xo, s.xs, s.y + yo, s.ys, s.out + oo);
      for (int64_t i = 0; i < n; i += kTile) {
        const int64_t m = std::min(kTile, n - i);
        fn(m, s.c + co + i * s.cs, s.cs, s.x + xo + i * s.xs, s.xs, s.y + yo + i * s.ys, s.ys,
           tile);
        StreamBytes(s.out + oo + i, tile, m * int64_t(sizeof(T)));
      }
    });
    if (stream) StreamFence();
  });
}

// In place, XLA handed over x's buffer as the result (input_output_aliases): x must then
// be laid out exactly like the result, or the kernel would read x where it is written.
ffi::Error CheckAliasedX(const StridedLayout& g) {
  int64_t dense = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    if (g.shape[d] != 1 && g.strides[1][d] != dense)
      return Invalid("select", "aliased x is not dense");
    dense *= g.shape[d];
  }
  return ffi::Error::Success();
}

// What both targets run once the layout is known: dtype checks, then the kernel.
ffi::Error SelectRun(ffi::ThreadPool pool, ffi::Buffer<ffi::PRED> cond, ffi::AnyBuffer x,
                     ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out, const StridedLayout& g) {
  const ffi::DataType dt = out->element_type();
  JAX_EXT_RETURN_IF_ERROR(
      CheckSameDtype("select", "x, y and the result", dt, {x.element_type(), y.element_type()}));
  JAX_EXT_RETURN_IF_ERROR(CheckWholeBytes("select", dt));
  const int64_t total = static_cast<int64_t>(out->element_count());
  if (total == 0) return ffi::Error::Success();
  const bool in_place = out->untyped_data() == x.untyped_data();
  if (in_place) JAX_EXT_RETURN_IF_ERROR(CheckAliasedX(g));
  const bool stream =
      !in_place && PrepareResult(out->untyped_data(), out->size_bytes(), kStreamCopyBytes);
  return DispatchWidth("select", ffi::ByteWidth(dt), [&](auto tag) -> ffi::Error {
    using T = decltype(tag);
    const int last = g.rank - 1;
    const SelectCall<T> s{g,
                          static_cast<const uint8_t*>(cond.untyped_data()),
                          static_cast<const T*>(x.untyped_data()),
                          static_cast<const T*>(y.untyped_data()),
                          static_cast<T*>(out->untyped_data()),
                          total,
                          g.strides[0][last],
                          g.strides[1][last],
                          g.strides[2][last]};
    if (in_place)
      SelectInPlace(pool, s);
    else
      SelectBlend(pool, s, stream);
    return ffi::Error::Success();
  });
}

// The handler: shapes from the buffers, the attributes say which result dimension each
// operand dimension lies along.
ffi::Error SelectImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::PRED> cond, ffi::AnyBuffer x,
                      ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out, Dims cond_dims,
                      Dims x_dims, Dims y_dims) {
  StridedLayout g;
  JAX_EXT_RETURN_IF_ERROR(FromBuffers(out->dimensions(),
                                      {cond.dimensions(), x.dimensions(), y.dimensions()},
                                      {cond_dims, x_dims, y_dims}, g));
  return SelectRun(pool, cond, x, y, out, g);
}

// Programs exported by jax_ext 0.1.0: the collapsed shape and strides as attributes,
// checked against the buffers.
ffi::Error SelectShapeAttrsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::PRED> cond, ffi::AnyBuffer x,
                                ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out, Dims shape,
                                Dims cond_strides, Dims x_strides, Dims y_strides) {
  StridedLayout g;
  JAX_EXT_RETURN_IF_ERROR(
      FromStrideAttrs(shape, {cond_strides, x_strides, y_strides}, out->element_count(),
                      {cond.element_count(), x.element_count(), y.element_count()}, g));
  return SelectRun(pool, cond, x, y, out, g);
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    SelectHandler, SelectImpl,
    SelectOperands().Attr<Dims>("cond_dims").Attr<Dims>("x_dims").Attr<Dims>("y_dims"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SelectShapeAttrsHandler, SelectShapeAttrsImpl,
                              SelectOperands()
                                  .Attr<Dims>("shape")
                                  .Attr<Dims>("cond_strides")
                                  .Attr<Dims>("x_strides")
                                  .Attr<Dims>("y_strides"));

}  // namespace jax_ext
