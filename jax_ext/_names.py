"""Every name jax_ext gives to jax and XLA, written once.

A name here is part of what users and serialized programs see: primitive names appear in
jaxprs, FFI target names in exported programs (``jax.export``), operand names in messages
and in :func:`jax_ext.explain`. ``tests/test_names.py`` checks the targets against what the
compiled module registers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# implementation("auto" | "native" | "lax") and the environment variable JAX_EXT_IMPL.
ImplementationName = Literal["auto", "native", "lax"]
IMPLEMENTATIONS: tuple[ImplementationName, ...] = ("auto", "native", "lax")
IMPL_ENV = "JAX_EXT_IMPL"


@dataclass(frozen=True)
class OpNames:
    """The names of one operation.

    Attributes:
        op: the operation as :func:`jax_ext.explain` reports it.
        primitive: the jax primitive's name.
        operands: the primitive's operands, in order (messages and explain name them so).
        targets: every FFI target name released for it, oldest first. A released target
            keeps its operands and attributes forever (exported programs name it); a
            change gets a new name. The lowering emits the last.
    """
    op: str
    primitive: str
    operands: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def target(self) -> str:
        """The target new programs call."""
        return self.targets[-1]

    @property
    def shard_primitives(self) -> tuple[str, str]:
        """The unpartitioned primitives that custom_partitioning re-binds per shard: the
        native one, and the lax one (see _lowering.register)."""
        return (self.primitive + "_shard", self.primitive + "_shard_lax")


SELECT = OpNames("select", "jax_ext_select", ("cond", "x", "y"),
                 ("jax_ext_select_v1", "jax_ext_select_v2"))
GATHER = OpNames("gather", "jax_ext_gather",
                 ("src", "offsets", "index", "num_indices", "pad_value"),
                 ("jax_ext_gather_v1", "jax_ext_gather_v2"))
SCATTER_ADD = OpNames("scatter_add", "jax_ext_scatter_add",
                      ("cotangent", "offsets", "index", "num_indices"),
                      ("jax_ext_scatter_add_v1", "jax_ext_scatter_add_v2"))
OPS: tuple[OpNames, ...] = (SELECT, GATHER, SCATTER_ADD)

# One shard's computation of a partitioned call (_lowering: lowered by jax_ext itself).
SHARD_LOCAL = "jax_ext_shard_local"

# Every FFI target jax_ext registers, and every primitive it binds.
TARGETS: tuple[str, ...] = tuple(t for o in OPS for t in o.targets)
PRIMITIVES: frozenset[str] = frozenset(
    n for o in OPS for n in (o.primitive,) + o.shard_primitives) | {SHARD_LOCAL}
