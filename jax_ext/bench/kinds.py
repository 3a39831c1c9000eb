"""The kinds of benchmark rows. Three the table keeps together and the plot draws as
groups: a lone call against its jnp built-in, and whole programs whose jax_ext calls are
element-wise selects or row gathers (with their gradients, scatter-adds). A fourth, the
overhead group, gets tables of its own."""
from __future__ import annotations

SINGLE = "single calls"
ELEMENTWISE = "element-wise programs"
SPARSE = "sparse programs"
KINDS = (SINGLE, ELEMENTWISE, SPARSE)
# The overhead group (overhead.py): what jax_ext costs outside its kernels (eager calls,
# tracing, lowering and compiling). Its rows have tables of their own and no plot panel.
OVERHEAD = "overhead"

