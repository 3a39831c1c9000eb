"""What ran at each jax_ext call site, and why: :class:`Decision` and :func:`explain`.

The lowering records one Decision per call site it lowers for CPU while a
``recording()`` block is open; ``explain`` opens one around a fresh lowering.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

@dataclass(frozen=True)
class Decision:
    """How one jax_ext call site was lowered, as :func:`explain` reports it.

    Attributes:
        op: ``"select"``, ``"gather"`` or ``"scatter_add"`` (a gather's gradient).
        impl: what runs there: ``"native"`` (the C++ kernel) or ``"lax"``.
        requested: the implementation in force where the op was traced: ``"auto"``,
            ``"native"`` or ``"lax"``.
        reason: why; under ``"auto"`` it starts with the two estimates
            (``est. native 3.1 ms vs lax 7.9 ms``), then what each operand comes from and
            what reads the result.
        where: ``file:line`` of the user's call, when known, else ``"?"``.
        est_native_s: under ``"auto"``, the cost model's estimate of the kernel's time at
            this site in seconds, including materializing what the lax path would fuse;
            None where no estimate was made (a forced implementation, a symbolic size).
        est_lax_s: the same for the lax path.
        site: the call site's fingerprint under ``"auto"`` (what :func:`jax_ext.tune`
            stores a measured choice under), else None.
    """
    op: str
    impl: str
    requested: str
    reason: str
    where: str
    est_native_s: float | None = None
    est_lax_s: float | None = None
    site: str | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.op} -> {self.impl} ({self.requested}: {self.reason})"


_log = threading.local()


def _user_frame(ctx: Any) -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
    bench = os.path.join(here, "bench")  # the benchmark's programs are user code
    # jax gives no traceback when its tracebacks are off
    for fr in getattr(getattr(ctx, "traceback", None), "frames", None) or ():
        f = fr.file_name
        if ((f.startswith(here) and not f.startswith(bench))
                or f"{os.sep}jax{os.sep}" in f or f.startswith("<frozen")):
            continue
        return f"{os.path.basename(f)}:{fr.line_num}"
    return "?"


class Notes:
    """What a call site's Decision adds to its reason once it is settled: how a call
    partitioned over a mesh is laid out, decided while the program is lowered (explicit
    axes) or only while XLA compiles it (custom_partitioning, `compiled=True`)."""

    def __init__(self) -> None:
        self._sink: list[Decision] | None = None
        self._i = -1
        self._texts: list[str] = []

    def add(self, text: str) -> None:
        if text in self._texts:  # XLA may ask for a shard's program more than once
            return
        self._texts.append(text)
        if self._sink is not None:
            d = self._sink[self._i]
            self._sink[self._i] = dataclasses.replace(d, reason=f"{d.reason}; {text}")

    def compiled(self) -> None:
        """The layout is decided when XLA compiles: explain compiles the program."""
        if getattr(_log, "sink", None) is not None:
            _log.compile = True


def record(ctx: Any, op: str, impl: str, requested: str, reason: str,
           est_native_s: float | None = None, est_lax_s: float | None = None,
           site: str | None = None, notes: Notes | None = None) -> None:
    """Called by the lowering for every call site it lowers for CPU."""
    sink = getattr(_log, "sink", None)
    if sink is not None:
        if notes is not None and notes._texts:
            reason = "; ".join([reason, *notes._texts])
        sink.append(Decision(op, impl, requested, reason, _user_frame(ctx), est_native_s,
                             est_lax_s, site))
        if notes is not None:
            notes._sink, notes._i = sink, len(sink) - 1


@contextlib.contextmanager
def recording() -> Iterator[list[Decision]]:
    old = getattr(_log, "sink", None), getattr(_log, "compile", False)
    _log.sink, _log.compile = [], False
    try:
        yield _log.sink
    finally:
        _log.sink, _log.compile = old


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Decision]:
    """How each jax_ext call site in ``fn(*args, **kwargs)`` is lowered on CPU.

    ``fn`` is traced and lowered afresh for CPU (never run, never a cached lowering), the
    way ``jax.jit`` would trace it. Under implementation ``"auto"`` each decision carries
    the cost model's two estimates and the reason (see :class:`Decision`)::

        for d in jax_ext.explain(jax.grad(loss), params, batch):
            print(d)  # model.py:41: gather -> native (auto: est. native 3.1 ms vs lax 7.9 ms; ...)

    Args:
        fn: a function, or a ``jax.jit``-ed one with its ``static_argnums`` /
            ``static_argnames``: pass the arguments as you would call it, static ones
            included, e.g. ``explain(jax.jit(f, static_argnums=1), x, 3)``. Its
            ``donate_argnums`` are kept (a select on a donated ``then`` runs lax, see
            ``select``).
        *args: the arguments, as for the call. Arrays (anything with ``shape`` and
            ``dtype``, ``jax.ShapeDtypeStruct`` included) are traced; every other leaf
            (an int, a string, None) is passed to ``fn`` as the Python value itself, as
            jit passes a static argument.
        **kwargs: keyword arguments, as for the call.

    A call site partitioned over several devices adds how: a gather from a table sharded
    along its rows says whether the table stays sharded (each device gathers the rows it
    holds and the devices sum them as integers) or is copied, and the bytes each way
    moves. Where XLA's compiler lays such a call out (auto mesh axes), ``explain``
    compiles the program too.

    Returns:
        One :class:`Decision` per call site, in lowering order.
    """
    import jax
    donate = donated_leaves(fn, args, kwargs)
    # A jit nested in ours would see its arguments as values of ours, never donated: its
    # own function is traced instead, with its donations.
    traced, dyn = traceable(getattr(fn, "__wrapped__", fn) if donate else fn, args, kwargs)
    with recording() as decisions:
        lowered = jax.jit(traced, donate_argnums=donate).trace(*dyn).lower(
            lowering_platforms=("cpu",))
        if _log.compile:  # a call partitioned over a mesh is laid out by XLA's compiler
            lowered.compile()
    return list(decisions)


def donated_leaves(fn: Callable[..., Any], args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    """Which array leaves of (args, kwargs), counted as `traceable` counts them, a jitted
    `fn` donates, read from its trace (jit's own ``args_info``); () for a function that is
    not jitted, or where jit traces other leaves than the arrays (a Python number passed
    as a traced argument), which only leaves a donated call explained as not donated."""
    import jax
    trace = getattr(fn, "trace", None)
    if trace is None:
        return ()
    info = jax.tree.leaves(trace(*args, **kwargs).args_info)
    leaves = jax.tree.leaves((tuple(args), dict(kwargs)))
    if len(info) != sum(hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves):
        return ()
    return tuple(k for k, a in enumerate(info) if getattr(a, "donated", False))


def traceable(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
              ) -> tuple[Callable[..., Any], list[Any]]:
    """`fn` as a function of the array leaves of (args, kwargs) alone, and those leaves.

    Arrays (anything with a shape and a dtype) are traced; every other leaf (an int, a
    string, None: what jit's static arguments are) is bound as a Python value, so a jitted
    function receives its static arguments as it would when called. A fresh function:
    jitting it is never a cached lowering, so every decision is made (and recorded)."""
    import jax
    leaves, tree = jax.tree.flatten((tuple(args), dict(kwargs)))
    dyn = [k for k, v in enumerate(leaves) if hasattr(v, "shape") and hasattr(v, "dtype")]

    def traced(*dyn_leaves: Any) -> Any:
        full = list(leaves)
        for k, v in zip(dyn, dyn_leaves):
            full[k] = v
        a, kw = jax.tree.unflatten(tree, full)
        return fn(*a, **kw)
    return traced, [leaves[k] for k in dyn]
