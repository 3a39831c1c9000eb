// The Python extension: hands each FFI handler to Python as a capsule.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/api.h"
#include "xla/ffi/api/c_api.h"

#include "common.h"

namespace nb = nanobind;

// Defined with XLA_FFI_DEFINE_HANDLER_SYMBOL in select.cc, gather.cc and scatter_add.cc.
namespace jax_ext {
XLA_FFI_DECLARE_HANDLER_SYMBOL(SelectHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GatherHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ScatterAddHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SelectV2Handler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GatherV2Handler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ScatterAddV2Handler);
}  // namespace jax_ext

namespace {
nb::capsule Capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jax_ext, m) {
  // The largest rank the kernels walk: Python routes a call past it to lax at lowering.
  m.attr("MAX_RANK") = jax_ext::kMaxRank;
  // Target names carry a version: a serialized (jax.export) program names them, so a
  // change in a handler's operands or attributes gets a new name, never a new meaning.
  m.def("registrations", []() {
    nb::dict d;
    d["jax_ext_select_v1"] = Capsule(jax_ext::SelectHandler);
    d["jax_ext_gather_v1"] = Capsule(jax_ext::GatherHandler);
    d["jax_ext_scatter_add_v1"] = Capsule(jax_ext::ScatterAddHandler);
    // v2: sizes read from the buffers at run time (shape-polymorphic jax.export).
    d["jax_ext_select_v2"] = Capsule(jax_ext::SelectV2Handler);
    d["jax_ext_gather_v2"] = Capsule(jax_ext::GatherV2Handler);
    d["jax_ext_scatter_add_v2"] = Capsule(jax_ext::ScatterAddV2Handler);
    return d;
  });
}
