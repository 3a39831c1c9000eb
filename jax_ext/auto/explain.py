"""What ran at each jax_ext call site, and why: :class:`Decision` and :func:`explain`.

The lowering records one Decision per call site it lowers for CPU while a
``recording()`` block is open; ``explain`` opens one around a fresh lowering.
"""
from __future__ import annotations

import contextlib
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


def record(ctx: Any, op: str, impl: str, requested: str, reason: str,
           est_native_s: float | None = None, est_lax_s: float | None = None,
           site: str | None = None) -> None:
    """Called by the lowering for every call site it lowers for CPU."""
    sink = getattr(_log, "sink", None)
    if sink is not None:
        sink.append(Decision(op, impl, requested, reason, _user_frame(ctx), est_native_s,
                             est_lax_s, site))


@contextlib.contextmanager
def recording() -> Iterator[list[Decision]]:
    old = getattr(_log, "sink", None)
    _log.sink = []
    try:
        yield _log.sink
    finally:
        _log.sink = old


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

    Returns:
        One :class:`Decision` per call site, in lowering order.
    """
    import jax
    donate = donated_leaves(fn, args, kwargs)
    # A jit nested in ours would see its arguments as values of ours, never donated: its
    # own function is traced instead, with its donations.
    traced, dyn = traceable(getattr(fn, "__wrapped__", fn) if donate else fn, args, kwargs)
    with recording() as decisions:
        jax.jit(traced, donate_argnums=donate).trace(*dyn).lower(lowering_platforms=("cpu",))
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
