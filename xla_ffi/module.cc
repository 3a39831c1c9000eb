// The Python extension: hands each FFI handler to Python as a capsule.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/api.h"
#include "xla/ffi/api/c_api.h"

#include "check.h"

namespace nb = nanobind;

// Defined with XLA_FFI_DEFINE_HANDLER_SYMBOL in select.cc, gather.cc, scatter_add.cc and
// update_rows.cc.
namespace jax_ext {
XLA_FFI_DECLARE_HANDLER_SYMBOL(SelectHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GatherHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ScatterAddHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(UpdateRowsReadHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(UpdateRowsWriteHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SelectShapeAttrsHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GatherShapeAttrsHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ScatterAddShapeAttrsHandler);
}  // namespace jax_ext

namespace {
nb::capsule Capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jax_ext, m) {
  // The largest rank the kernels walk: Python routes a call past it to lax at lowering.
  m.attr("MAX_RANK") = jax_ext::kMaxRank;
  // A serialized (jax.export) program names its targets, so a target's operands and
  // attributes never change meaning: a change gets a new name, and every released name
  // stays registered.
  m.def("registrations", []() {
    nb::dict d;
    // The handlers: shapes read from the buffers, attributes only what the buffers cannot
    // say. Every program jax_ext lowers calls these.
    d["jax_ext_select_v2"] = Capsule(jax_ext::SelectHandler);
    d["jax_ext_gather_v2"] = Capsule(jax_ext::GatherHandler);
    d["jax_ext_scatter_add_v2"] = Capsule(jax_ext::ScatterAddHandler);
    // update_rows: its two kernels, around the optimizer's arithmetic.
    d["jax_ext_update_rows_read_v1"] = Capsule(jax_ext::UpdateRowsReadHandler);
    d["jax_ext_update_rows_write_v1"] = Capsule(jax_ext::UpdateRowsWriteHandler);
    // Programs exported by jax_ext 0.1.0 with static shapes: shapes and strides as
    // attributes, checked against the buffers, then the same kernels.
    d["jax_ext_select_v1"] = Capsule(jax_ext::SelectShapeAttrsHandler);
    d["jax_ext_gather_v1"] = Capsule(jax_ext::GatherShapeAttrsHandler);
    d["jax_ext_scatter_add_v1"] = Capsule(jax_ext::ScatterAddShapeAttrsHandler);
    return d;
  });
}
