"""The benchmark, ``jax-ext-bench``: jax_ext against the jnp built-ins, side by side, in
one process, and the calibration of implementation "auto"'s cost model
(``jax-ext-bench --calibrate``).

Modules: ``cli`` (the command), ``timing`` (alternating calls), ``report`` (table, machine
header), ``plot``, the cases per op (``select``, ``gather``), whole ``programs``, ``sharded``
cases, the ``overhead`` group (eager calls, tracing, lowering and compiling), the ``kinds``
of rows (single calls, element-wise and sparse programs, overhead), the
``records`` (what a case, a result row and the run's header hold), and ``calibrate``.
``onnx_export`` (``python -m jax_ext.bench.onnx_export``, with the ``onnx`` extra) times
the select jax_ext.onnx exports against the jnp twin's export in onnxruntime.
"""
from __future__ import annotations

from .cli import all_cases, main
from .report import COLUMNS, format_table, machine_info
from .select import select_cases
from .timing import _host_side, measure

__all__ = ["main", "all_cases", "COLUMNS", "format_table", "machine_info", "select_cases",
           "measure", "_host_side"]
