"""The three kinds of benchmark rows, which the table keeps together and the plot draws
as groups: a lone call against its jnp built-in, and whole programs whose jax_ext calls
are element-wise selects or row gathers (with their gradients, scatter-adds)."""
from __future__ import annotations

SINGLE = "single calls"
ELEMENTWISE = "element-wise programs"
SPARSE = "sparse programs"
KINDS = (SINGLE, ELEMENTWISE, SPARSE)

