"""The cost model's constants: ``costs.json`` beside this file, typed and checked here.

``jax-ext-bench --calibrate --table PATH`` writes the file: every constant is a leaf
``{"value": v, "about": "what it was fitted on, or why it is what it is"}`` in a tree
that mirrors :class:`CostTable`. Times are in seconds. A file with a missing, extra,
negative or non-numeric constant is refused with the path of the offending leaf.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "costs.json")


L = TypeVar("L")
N = TypeVar("N")


@dataclass(frozen=True)
class Sides(Generic[L, N]):
    """A group of constants, for the lax path (L) and for the kernel (N)."""
    lax: L
    native: N


@dataclass(frozen=True)
class Structure:
    """Structural facts and policy, not fitted: where XLA:CPU's loops start using its
    thread pool and where glibc maps a block afresh on every call (bytes), and how much
    cheaper the kernel must be estimated to be chosen (a factor)."""
    pool_min_bytes: int
    mmap_threshold_bytes: int
    native_margin: float


@dataclass(frozen=True)
class SelectSide:
    """A select's loop: a fixed cost for a result under pool_min_bytes (one thread), one
    for a larger result (XLA's thread pool), and a cost per byte read and written."""
    s0_single: float
    s0: float
    s_per_byte: float


@dataclass(frozen=True)
class GatherNative:
    """The kernel's gather loop: a cost per call (s0), per row and per byte moved."""
    s0: float
    s_per_row: float
    s_per_byte: float


@dataclass(frozen=True)
class GatherLax:
    s0: float  # XLA's launch, beyond the kernel's loop
    # XLA's gather loop over the kernel's, at each measured length of the result's last
    # dim: XLA's code changes in steps with that length, so it is measured, not fitted.
    row_ratio: Mapping[int, float]


@dataclass(frozen=True)
class ScatterSide:
    """A scatter-add: per call, per cotangent row, per cotangent byte, per result byte."""
    s0: float
    s_per_row: float
    s_per_ct_byte: float
    s_per_out_byte: float


@dataclass(frozen=True)
class UpdateRowsSide:
    """update_rows' read and write (the optimizer's arithmetic between them costs both
    sides alike): per call, per index (the lax side sorts the ids: times log2 of their
    number there), per byte of the gradient rows and of the rows read and written."""
    s0: float
    s_per_row: float
    s_per_byte: float


@dataclass(frozen=True)
class FreshSide:
    s_per_byte: float  # mapping a result above the mmap threshold, per result byte


@dataclass(frozen=True)
class Materialize:
    """One fused XLA loop writing an operand the kernel needs in memory."""
    s0: float
    s_per_byte: float


@dataclass(frozen=True)
class Corrections:
    """Where tuning found the fitted model systematically wrong (jax_ext.tune on the
    benchmark's programs): factors on the lax side's loop estimate, each with what it was
    learned from in its 'about' text. Not refitted by the calibration."""
    # A select that reads one operand in full (the condition and the other value
    # broadcast): XLA's loop is a copy with a choice per row.
    select_lax_one_full_operand: float
    # A gather whose result a consumer fuses, with rows shorter than
    # gather_fused_short_rows_below elements: XLA emits it element by element inside the
    # consumer's loop, slower than its standalone loop.
    gather_lax_fused_short_rows: float
    gather_fused_short_rows_below: int


@dataclass(frozen=True)
class CostTable:
    machine: str
    structure: Structure
    corrections: Corrections
    select: Sides[SelectSide, SelectSide]
    gather: Sides[GatherLax, GatherNative]
    scatter_add: Sides[ScatterSide, ScatterSide]
    update_rows: Sides[UpdateRowsSide, UpdateRowsSide]
    fresh: Sides[FreshSide, FreshSide]
    materialize: Materialize
    # "select.native.s0" -> what it was fitted on (one description per constant)
    about: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def row_lengths(self) -> tuple[int, ...]:
        return tuple(sorted(self.gather.lax.row_ratio))


class CostTableError(ValueError):
    """A cost table file that does not fit CostTable."""


def _fields(kind: Any) -> tuple[type, dict[str, Any]]:
    """The dataclass behind `kind` and its fields' types (Sides[X]: its fields are X)."""
    cls = typing.get_origin(kind) or kind
    hints = typing.get_type_hints(cls)
    args = typing.get_args(kind)
    types_ = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "about"}
    if args:  # the type arguments in the order of the class's parameters
        bound = dict(zip(getattr(cls, "__parameters__", ()), args))
        types_ = {k: bound.get(v, v) for k, v in types_.items()}
    return cls, types_


def _number(node: Any, kind: Any, where: str, about: dict[str, str]) -> Any:
    if not (isinstance(node, dict) and set(node) == {"value", "about"}):
        raise CostTableError(f"cost table: {where} must be {{'value': ..., 'about': ...}}")
    v = node["value"]
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or v < 0 or (kind is int and not float(v).is_integer())):
        raise CostTableError(f"cost table: {where} must be a non-negative {kind.__name__}, "
                             f"got {v!r}")
    if not isinstance(node["about"], str) or not node["about"]:
        raise CostTableError(f"cost table: {where} needs an 'about' text")
    about[where] = node["about"]
    return kind(v)


def _build(kind: Any, node: Any, where: str, about: dict[str, str]) -> Any:
    """The dataclass `kind` from its JSON tree, checking every key on the way."""
    if not isinstance(node, dict):
        raise CostTableError(f"cost table: {where or 'the file'} must be an object")
    cls, fields = _fields(kind)
    extra, missing = set(node) - set(fields), set(fields) - set(node)
    if extra or missing:
        raise CostTableError(f"cost table: {where or 'the file'}: missing {sorted(missing)}, "
                             f"unknown {sorted(extra)}")
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        out[name] = _value(kind, node[name], f"{where}.{name}".lstrip("."), about)
    return cls(**out)


def _value(kind: Any, node: Any, where: str, about: dict[str, str]) -> Any:
    if kind is str:
        if not isinstance(node, str):
            raise CostTableError(f"cost table: {where} must be a string")
        return node
    if kind in (int, float):
        return _number(node, kind, where, about)
    if dataclasses.is_dataclass(typing.get_origin(kind) or kind):
        return _build(kind, node, where, about)
    # Mapping[int, float]: lengths as keys
    if not isinstance(node, dict) or not node:
        raise CostTableError(f"cost table: {where} must be a non-empty object")
    try:
        keyed = {int(k): v for k, v in node.items()}
    except ValueError:
        raise CostTableError(f"cost table: {where} keys must be integers") from None
    return types.MappingProxyType({k: _number(v, float, f"{where}.{k}", about)
                                   for k, v in sorted(keyed.items())})


def from_tree(tree: Mapping[str, Any]) -> CostTable:
    """A CostTable from the JSON tree (as costs.json holds it), checked."""
    about: dict[str, str] = {}
    table: CostTable = _build(CostTable, dict(tree), "", about)
    return dataclasses.replace(table, about=types.MappingProxyType(about))


def leaves(table: CostTable) -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every constant, in the file's order."""
    def walk(obj: Any, where: str) -> Iterator[tuple[str, float]]:
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if f.name not in ("about", "machine"):
                    yield from walk(getattr(obj, f.name), f"{where}.{f.name}".lstrip("."))
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                yield f"{where}.{k}", v
        else:
            yield where, obj
    return walk(table, "")


def to_tree(table: CostTable) -> dict[str, Any]:
    """The JSON tree of a table (the inverse of from_tree)."""
    tree: dict[str, Any] = {"machine": table.machine}
    for path, v in leaves(table):
        *parents, last = path.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = {"value": v, "about": table.about[path]}
    return tree


def from_flat(machine: str, values: Mapping[str, float], about: Mapping[str, str]
              ) -> CostTable:
    """A CostTable from dotted paths ("select.native.s0") -> value and -> description,
    as the calibration produces them; checked like a file."""
    tree: dict[str, Any] = {"machine": machine}
    for path, v in values.items():
        *parents, last = path.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = {"value": v, "about": about.get(path, "")}
    return from_tree(tree)


def dumps(table: CostTable) -> str:
    return json.dumps(to_tree(table), indent=1) + "\n"


def load(path: str = PATH) -> CostTable:
    with open(path, encoding="utf-8") as f:
        return from_tree(json.load(f))


@functools.cache
def shipped() -> CostTable:
    """The table in the package (read once)."""
    return load()
