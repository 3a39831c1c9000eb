"""Every name jax_ext gives to jax and XLA, and what it knows about each op, written once.

A name here is part of what users and serialized programs see: primitive names appear in
jaxprs, FFI target names in exported programs (``jax.export``), operand names in messages
and in :func:`jax_ext.explain`. ``tests/test_names.py`` checks the targets against what the
compiled module registers, ``tests/test_tables.py`` the tables the C++ holds as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# implementation("auto" | "native" | "lax") and the environment variable JAX_EXT_IMPL.
ImplementationName = Literal["auto", "native", "lax"]
IMPLEMENTATIONS: tuple[ImplementationName, ...] = ("auto", "native", "lax")
IMPL_ENV = "JAX_EXT_IMPL"


# Dtypes narrower than a byte, packed in XLA buffers: no kernel takes them (XLA's FFI
# names all but the 6-bit floats, which it cannot describe at all), and they cross devices
# as uint8 (_partition.wire_dtype).
SUB_BYTE = frozenset({"int1", "uint1", "int2", "uint2", "int4", "uint4", "float4_e2m1fn",
                      "float6_e2m3fn", "float6_e3m2fn"})
# Dtypes jax has as arrays (the 6-bit floats, from jax 0.11) that XLA:CPU cannot gather: it
# aborts the process on a constant of one (jnp.take's fill value is one) and fails to
# compile some fusions of them. gather refuses them with a TypeError instead.
NOT_GATHERED = frozenset({"float6_e2m3fn", "float6_e3m2fn"})


# How a kernel walks its operands, which sets what counts against its rank limit
# (_lowering.kernel_limit): "collapsed" walks the result with its size-1 dims dropped;
# "batched" walks `nbatch` leading batch dims (a static param) and the rest of each operand
# apart.
Walk = Literal["collapsed", "batched"]


@dataclass(frozen=True)
class OpSpec:
    """Everything jax_ext knows about one operation, in one place: the lowering, auto, the
    cost model, the native dtype support and the tests read it here.

    Attributes:
        op: the operation as :func:`jax_ext.explain` reports it, and the name of its
            section in ``auto/costs.json`` and of its estimator in ``auto/model.py``.
        primitive: the jax primitive's name (also what its error messages start with).
        operands: the primitive's operands, in order (messages and explain name them so).
        targets: every FFI target name released for it, oldest first. A released target
            keeps its operands and attributes forever (exported programs name it); a
            change gets a new name. The lowering emits the last (update_rows, whose step
            runs two kernels, emits both: UPDATE_ROWS_READ and UPDATE_ROWS_WRITE).
        front_end: the Python module with its public front-end(s), or None where the
            primitive is bound by another op's rules only (the scatter-add).
        rules: the Python module with the primitive's rules (abstract evaluation,
            lowerings, partitioning, JVP, transpose, batching), registered at its end.
        source: its C++ file in ``xla_ffi/``.
        walk: how the kernel walks its operands (see ``Walk``).
        fused_operands: the operands whose producers auto looks at (small ones -- scalars,
            broadcast rows, index vectors -- are read from memory on both sides at little
            cost).
        lax_fuses: whether XLA fuses the lax path with its neighbours (XLA's scatter
            neither fuses nor is fused away, so producers and consumers cost both sides
            alike).
        native_dtypes: the dtype names of the first operand the kernel computes with, or
            None where it only moves bytes (every whole-byte dtype). Others take lax.
    """
    op: str
    primitive: str
    operands: tuple[str, ...]
    targets: tuple[str, ...]
    front_end: str | None
    rules: str
    source: str
    walk: Walk
    fused_operands: tuple[str, ...]
    lax_fuses: bool = True
    native_dtypes: frozenset[str] | None = None

    @property
    def target(self) -> str:
        """The target new programs call."""
        return self.targets[-1]

    @property
    def shard_primitives(self) -> tuple[str, str]:
        """The unpartitioned primitives that custom_partitioning re-binds per shard: the
        native one, and the lax one (see _lowering.register)."""
        return (self.primitive + "_shard", self.primitive + "_shard_lax")

    def native_dtype(self, dtype_name: str) -> bool:
        """Does the kernel compute with this dtype of its first operand?"""
        return self.native_dtypes is None or dtype_name in self.native_dtypes


SELECT = OpSpec("select", "jax_ext_select", ("cond", "x", "y"),
                ("jax_ext_select_v1", "jax_ext_select_v2"),
                front_end="jax_ext._select", rules="jax_ext._select_rules",
                source="select.cc", walk="collapsed",
                fused_operands=("cond", "x", "y"))
GATHER = OpSpec("gather", "jax_ext_gather",
                ("src", "offsets", "index", "num_indices", "pad_value"),
                ("jax_ext_gather_v1", "jax_ext_gather_v2"),
                front_end="jax_ext._gather", rules="jax_ext._gather_rules",
                source="gather.cc", walk="batched",
                fused_operands=("src",))
# The scatter-add adds: its dtypes are the cases of DispatchAccumulate in accumulate.h
# (tests/test_tables.py ties the two).
SCATTER_ADD = OpSpec("scatter_add", "jax_ext_scatter_add",
                     ("cotangent", "offsets", "index", "num_indices"),
                     ("jax_ext_scatter_add_v1", "jax_ext_scatter_add_v2"),
                     front_end=None, rules="jax_ext._scatter_add",
                     source="scatter_add.cc", walk="batched",
                     fused_operands=(), lax_fuses=False,
                     native_dtypes=frozenset({
                         "float32", "float64", "complex64", "complex128", "float16",
                         "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                         "uint32", "uint64"}))
# update_rows: a training step on the rows a gather read. Two kernels run around the
# optimizer's arithmetic, which stays XLA code: the read (distinct rows, gradient sums,
# the rows of the table and its state) and the write (the new rows, in place). Its table
# computes (the gradient sums): floating dtypes the scatter-add adds natively.
UPDATE_ROWS_READ = "jax_ext_update_rows_read_v1"
UPDATE_ROWS_WRITE = "jax_ext_update_rows_write_v1"
UPDATE_ROWS = OpSpec("update_rows", "jax_ext_update_rows",
                     ("table", "offsets", "index", "num_indices", "grads"),
                     (UPDATE_ROWS_READ, UPDATE_ROWS_WRITE),
                     front_end="jax_ext._update_rows", rules="jax_ext._update_rows_rules",
                     source="update_rows.cc", walk="batched",
                     fused_operands=(), lax_fuses=False,
                     native_dtypes=frozenset({"float32", "float64", "float16", "bfloat16"}))
OPS: tuple[OpSpec, ...] = (SELECT, GATHER, SCATTER_ADD, UPDATE_ROWS)

# One shard's computation of a partitioned call (_lowering: lowered by jax_ext itself).
SHARD_LOCAL = "jax_ext_shard_local"
# A value tied to another's sharding (_shard_like: a gradient sharded as its table).
SHARD_LIKE = "jax_ext_shard_like"

# Every FFI target jax_ext registers, and every primitive it binds.
TARGETS: tuple[str, ...] = tuple(t for o in OPS for t in o.targets)
PRIMITIVES: frozenset[str] = frozenset(
    n for o in OPS for n in (o.primitive,) + o.shard_primitives) | {SHARD_LOCAL, SHARD_LIKE}
