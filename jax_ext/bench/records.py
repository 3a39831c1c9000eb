"""The records of a benchmark run: a case, the row its measurement becomes, and the run's
header (``meta``), as the JSON file holds them.

They are plain dicts (tests and the JSON read their fields by name); a case's keys, in
the order they are written, start every row of the table and of the JSON file. A row is
that dict merged with the measurements, some of whose names are made per side
(``native_ratio``, ``lax_s``, ...), so a row is typed as a JSON record.
"""
# No `from __future__ import annotations` here: TypedDict reads NotRequired from the
# evaluated annotations.
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

import jax
import numpy.typing as npt

# jax types what jax.jit, jax.grad and jax.vmap return loosely, and the benchmark calls
# them only with the arguments its own case made.
JaxFn = Callable[..., Any]
# make()'s result: ours and the reference, both jitted, and the arguments both take.
Made = tuple[JaxFn, JaxFn, tuple[jax.Array, ...]]
# Numpy copies of a case's arguments (the "fresh" pattern's source, onnxruntime's input).
Host = tuple[npt.NDArray[Any], ...]
# onnxruntime's side of a gather: its call, its numpy arguments, and the check that its
# result agrees with ours.
Ort = tuple[Callable[..., Any], Host, Callable[[npt.NDArray[Any], npt.NDArray[Any]], bool]]
Shape = tuple[int, ...]
# A result row: its case's fields and its measurements, by name.
Row = dict[str, Any]


class Case(TypedDict):
    name: str
    op: str  # "select", "gather", "gather_grad", "program", "eager" or "lowering"
    dtype: str
    elements: int
    bytes: int  # read and written, for GB/s
    make: Callable[[], Made]
    chain: bool  # donated: each call's results are the next call's operands from the second
    kind: str  # one of kinds.KINDS
    x64: NotRequired[bool]  # made, traced and timed with x64 on
    onnx: NotRequired[Callable[[Host], Ort | None]]  # None without onnxruntime
    copy_bytes: NotRequired[int]  # numpy copies this many bytes alongside, a yardstick
    exact: NotRequired[bool]  # False: the two sides agree within rounding
    impls: NotRequired[bool]  # also timed under forced native, forced lax and tuned
    patterns: NotRequired[tuple[str, ...]]  # timed in these calling patterns, not --pattern's
    # a case that times itself rather than calls (the overhead group's lowering rows):
    # its rows, without the memory state (which the caller adds)
    measure: NotRequired[Callable[[], list[Row]]]
    sites: NotRequired[list[int]]  # the lowering rows' numbers of call sites
    device_memory: NotRequired[bool]  # report each side's per-device temp (memory_analysis)


class Meta(TypedDict):
    """The machine and versions (report.machine_info), then the run's settings."""
    implementation: str
    date: str
    cpu: str
    cores: int | None
    machine: str
    jax: str
    jaxlib: str
    numpy: str
    onnxruntime: str | None
    onnxruntime_absent: NotRequired[str]  # why onnxruntime is None (its column absent)
    jax_ext: str
    native: bool
    malloc_env: dict[str, str]
    # the benchmark's, not the calibration's
    quick: NotRequired[bool]
    run: NotRequired[str]  # which cases: the default selection, the full sweep, --only's
    rounds: NotRequired[int]
    patterns: NotRequired[list[str]]
    # each memory state timed, with the allocator settings its processes ran under
    memory: NotRequired[dict[str, dict[str, str]]]
    tune_budget_s: NotRequired[float | None]
    loadavg_start: NotRequired[list[float]]
    loadavg_end: NotRequired[list[float]]
    # the overhead group's lowering rows: their two numbers of call sites, repetitions
    sites: NotRequired[list[int]]
    overhead_repeats: NotRequired[int]
