// The error vocabulary every handler speaks, in the style of jaxlib's ffi_helpers.h: one
// message shape ("jax_ext <op>: <what>", an InvalidArgument error), checks that return
// ffi::Error, and macros that return the first failure.
//
// A handler is a list of checks followed by the work. The checks run on every call, so the
// passing path builds no string: a message is only assembled once a check has failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jax_ext {

namespace ffi = xla::ffi;

using Dims = ffi::Span<const int64_t>;

// Largest rank the kernels walk: select's collapsed result, gather's src past its batch
// dims, and the batch itself. Their index state lives in fixed arrays of this size, so the
// per-call geometry never allocates.
constexpr int kMaxRank = 64;

// Returns the ffi::Error of `expr` from the enclosing function when it is a failure, as
// jaxlib's FFI_RETURN_IF_ERROR does.
#define JAX_EXT_RETURN_IF_ERROR(...)                                                             \
  do {                                                                                           \
    if (::xla::ffi::Error jax_ext_error_ = (__VA_ARGS__); jax_ext_error_.failure()) [[unlikely]] \
      return jax_ext_error_;                                                                     \
  } while (0)

// `lhs = value of rhs`, where rhs is an ffi::ErrorOr<T>; returns its error instead from
// the enclosing function (which returns ffi::Error), as jaxlib's FFI_ASSIGN_OR_RETURN.
#define JAX_EXT_ASSIGN_OR_RETURN(lhs, rhs) \
  JAX_EXT_ASSIGN_OR_RETURN_IMPL_(JAX_EXT_CONCAT_(jax_ext_or_, __LINE__), lhs, rhs)
#define JAX_EXT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rhs) \
  auto tmp = (rhs);                                   \
  if (tmp.has_error()) [[unlikely]]                   \
    return std::move(tmp).error();                    \
  lhs = std::move(tmp).value()
#define JAX_EXT_CONCAT_INNER_(a, b) a##b
#define JAX_EXT_CONCAT_(a, b) JAX_EXT_CONCAT_INNER_(a, b)

// The one way a handler reports bad input: "jax_ext <op>: <what>".
inline ffi::Error Invalid(std::string_view op, std::string_view what) {
  std::string m = "jax_ext ";
  m.append(op).append(": ").append(what);
  return ffi::Error::InvalidArgument(std::move(m));
}

// The same, as the error of an ffi::ErrorOr<T>.
inline ffi::Unexpected<ffi::Error> Unexpected(std::string_view op, std::string_view what) {
  return ffi::Unexpected<ffi::Error>(Invalid(op, what));
}

inline std::string Str(int64_t v) { return std::to_string(v); }

// "(2, 3)", "(5,)", "()": a shape as Python prints it.
inline std::string ShapeString(Dims s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + Str(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

// `name` (its shape in the message) has rank `rank`, said as `rank_text` ("nbatch + 1").
inline ffi::Error CheckRank(const char* op, const char* name, Dims d, int64_t rank,
                            const char* rank_text) {
  if (static_cast<int64_t>(d.size()) == rank) return ffi::Error::Success();
  return Invalid(op, std::string(name) + " " + ShapeString(d) + " must have rank " + rank_text +
                         " = " + Str(rank));
}

// The dtypes of an op's data operands and its result agree (`what` lists them).
inline ffi::Error CheckSameDtype(const char* op, const char* what, ffi::DataType want,
                                 std::initializer_list<ffi::DataType> got) {
  for (ffi::DataType t : got)
    if (t != want) return Invalid(op, std::string(what) + " differ in dtype");
  return ffi::Error::Success();
}

// The product of `dims`, or an error naming `what` when a dim is negative or the product
// overflows (a shape with a 0 dim never does: it has no elements).
inline ffi::ErrorOr<int64_t> CheckedProduct(const char* op, const char* what, Dims dims) {
  bool empty = false;
  for (int64_t d : dims) {
    if (d < 0) return Unexpected(op, "bad " + std::string(what) + " " + ShapeString(dims));
    empty |= d == 0;
  }
  int64_t p = 1;
  for (int64_t d : dims)
    if (!empty && __builtin_mul_overflow(p, d, &p))
      return Unexpected(op, "bad " + std::string(what) + " " + ShapeString(dims) +
                                ": its size overflows 64 bits");
  return empty ? 0 : p;
}

}  // namespace jax_ext
