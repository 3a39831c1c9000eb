"""Every jax import that is private or differs between jax versions lives here (those of
sharding in ``_compat_sharding.py``, its other half), and every fallback jax_ext takes
when jax surprises it goes through `fallback` below."""
from __future__ import annotations

import inspect
import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import jax
import numpy as np

# Every private or unstable jax name jax_ext uses (jax._src, jax.interpreters, jax.core,
# jax.experimental), with what it is for and why no public name serves at both ends of the
# supported window. Each was resolved and used on every jax release in
# PRIVATE_NAMES_CHECKED_ON; tests/test_private_names.py reads jax_ext's sources and fails
# on one missing here, and resolves each on the jax under test (CI: both ends), naming the
# one that is gone.
PRIVATE_NAMES_CHECKED_ON = ("0.10.2", "0.12.1")
PRIVATE_NAMES: dict[str, str] = {
    "jax._src.config.enum_state":
        "the implementation() setting must join jit's cache key and trace context; jax has "
        "no public way to define such a config option",
    "jax._src.config.string_or_object_state":
        "the tuning state must join jit's cache key (a function traced before tune() is "
        "traced again after); no public string state does",
    "jax._src.core.ShardingTypeError":
        "the error jax's own ops raise for conflicting shardings under explicit axes; not "
        "exported publicly, and users catch jax's type",
    "jax._src.core.auto_insert_reshard":
        "makes invariant operands varying before a bind inside shard_map (pvary, whose "
        "transpose sums a replicated operand's gradient); lax.pcast needs explicit axes",
    "jax._src.core.standard_vma_rule":
        "types a result inside shard_map with its operands' varying axes and raises jax's "
        "own error where they differ, as lax's primitives do",
    "jax._src.dispatch.prim_requires_devices_during_lowering":
        "custom_partitioning needs the device assignment while lowering; jax's own cuDNN "
        "kernels register there; no public switch",
    "jax._src.lax.lax._convert_element_type":
        "a conversion that keeps weak typing (jnp's promotion); lax.convert_element_type "
        "always gives a strong type",
    "jax.core.ShapedArray":
        "the abstract value of one shard's computation (an aval, which ShapeDtypeStruct "
        "is not)",
    "jax.core.Tracer":
        "names a traced check_bounds 'a traced value' in its error message; no public test "
        "tells a tracer from a concrete array",
    "jax._src.lib.mlir.dialects.sdy":
        "a Shardy sharding group ties a gradient's sharding to its table's on auto mesh "
        "axes, where nothing else carries the table's rows to the gradient; jax 0.12 "
        "removed shard_alike, its public spelling",
    "jax.experimental.custom_partitioning.custom_partitioning":
        "the only way a custom call lowers per shard with local shapes and a Shardy rule",
    "jax.interpreters.ad.UndefinedPrimal":
        "the type of a transpose rule's linear operand (annotations only)",
    "jax.interpreters.ad.Zero":
        "jax's symbolic zero tangent, which JVP and transpose rules receive and return",
    "jax.interpreters.ad.is_undefined_primal":
        "which operands a transpose rule is linear in; jax.extend has no rule API",
    "jax.interpreters.ad.primitive_jvps":
        "registers a primitive's JVP rule; jax.extend has no rule API",
    "jax.interpreters.ad.primitive_transposes":
        "registers a primitive's transpose rule; jax.extend has no rule API",
    "jax.interpreters.batching.fancy_primitive_batchers":
        "registers a primitive's batching rule with the axis data (primitive_batchers is a "
        "compatibility shim)",
    "jax.interpreters.mlir.LoweringRule":
        "the type of a lowering rule (annotations)",
    "jax.interpreters.mlir.ShardingContext":
        "tells a jit lowering that will be partitioned from a shard_map body or pmap (the "
        "lowering context's axis context)",
    "jax.interpreters.mlir.LoweringRuleContext":
        "the context a lowering rule receives (avals, module, platforms)",
    "jax.interpreters.mlir.ir":
        "the MLIR bindings jax lowers with: the custom call's operands, and what auto "
        "reads about producers",
    "jax.interpreters.mlir.core_call_lowering":
        "emits a traced lax implementation as one private function that every identical "
        "site calls (the lax path's lowering stays linear in the call sites); jax offers "
        "no public way to outline a call inside a lowering rule",
    "jax.interpreters.mlir.jaxpr_subcomp":
        "its frames hold the jaxprs being lowered, from which auto reads a call's "
        "consumers; jax exposes them nowhere else (a fallback where it moves)",
    "jax.interpreters.mlir.lower_fun":
        "lowers the lax implementation inside a lowering rule",
    "jax.interpreters.mlir.register_lowering":
        "registers a primitive's lowering rule",
    "jax.interpreters.xla.apply_primitive":
        "a primitive's eager implementation (compile and run its one equation)",
}

MIN_JAX = (0, 10, 2)
# The jaxlib whose XLA FFI headers a build compiles against, by the Python it is built for:
# the oldest jaxlib with a wheel for that Python, and the FFI API of its headers. A handler
# built on newer headers can be refused by an older runtime; on a Python where no jaxlib
# older than the one named here installs, the runtime is never older than the headers.
# Each entry holds from its Python on, up to the next entry. pyproject.toml's build
# requirements name the same jaxlibs by environment marker (tests/test_package.py checks
# that they agree); a wheel built on an earlier Python loads on every later one.
OLDEST_JAXLIB: tuple[tuple[tuple[int, int], tuple[int, ...], str], ...] = (
    ((3, 11), MIN_JAX, "0.3"),
    ((3, 15), (0, 11, 1), "0.4"),  # jaxlib 0.10.2 has no wheel for Python 3.15
)


def oldest_jaxlib(python: tuple[int, int] | None = None) -> tuple[tuple[int, ...], str]:
    """(jaxlib version, FFI API) of the headers a build for `python` (default: this one)
    compiles against: the oldest jaxlib that installs there."""
    py = tuple(sys.version_info[:2]) if python is None else python
    return max((jaxlib, api) for first, jaxlib, api in OLDEST_JAXLIB if first <= py)


# The newest minor release CI runs the suite on (the newest jax the package registry
# serves); a newer one warns at import, once. Raise it with the CI environment.
NEWEST_TESTED = (0, 12)
# Set to 1 to silence that warning (for a user who has checked the newer jax themselves).
NO_VERSION_WARNING_ENV = "JAX_EXT_NO_VERSION_WARNING"
# Set to 1 to make every fallback raise instead (the test suite and CI set it).
STRICT_ENV = "JAX_EXT_STRICT"

_log = logging.getLogger("jax_ext")


class FallbackError(RuntimeError):
    """Raised where jax_ext would fall back, while JAX_EXT_STRICT=1 is set."""


def strict() -> bool:
    """Is strict mode on (JAX_EXT_STRICT set to a value other than "" or "0")?"""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def fallback(what: str, exc: BaseException | None = None) -> None:
    """Every fallback of jax_ext goes through here: `what` says what jax_ext does instead
    and `exc` what made it. It logs a debug line on the "jax_ext" logger and carries on;
    in strict mode it raises FallbackError, so a jax release that moved what the
    fallback guards fails the tests instead of changing behaviour quietly."""
    detail = "" if exc is None else f" ({type(exc).__name__}: {exc})"
    _log.debug("jax_ext falls back: %s%s", what, detail)
    if strict():
        raise FallbackError(f"jax_ext would fall back: {what}{detail} ({STRICT_ENV} is set)"
                            ) from exc


def _version_tuple(v: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def version_warning(jax_version: str, environ: Mapping[str, str]) -> str | None:
    """The warning `import jax_ext` gives on jax `jax_version`, or None: only a minor
    release newer than NEWEST_TESTED warns, and only while the environment does not set
    NO_VERSION_WARNING_ENV to a value other than "" or "0"."""
    if _version_tuple(jax_version)[:2] <= NEWEST_TESTED:
        return None
    if environ.get(NO_VERSION_WARNING_ENV, "") not in ("", "0"):
        return None
    tested = ".".join(map(str, NEWEST_TESTED))
    return (f"jax_ext was tested with jax up to {tested}.x; jax {jax_version} is newer and "
            "may have changed the extension points jax_ext uses (if your tests pass, set "
            f"{NO_VERSION_WARNING_ENV}=1 to silence this warning)")


JAX_VERSION = _version_tuple(jax.__version__)
if JAX_VERSION < MIN_JAX:
    raise ImportError(
        f"jax_ext needs jax >= {'.'.join(map(str, MIN_JAX))}, found jax {jax.__version__}; "
        "upgrade with: pip install -U 'jax>=0.10.2' 'jaxlib>=0.10.2'")
_VERSION_WARNING = version_warning(jax.__version__, os.environ)
if _VERSION_WARNING is not None:
    warnings.warn(_VERSION_WARNING, RuntimeWarning, stacklevel=2)

# Re-exported for the rest of the package (`as` marks the re-export).
from jax.interpreters import ad as ad, batching, mlir as mlir, xla  # noqa: E402
from jax.interpreters.mlir import ir as ir  # noqa: E402  (the MLIR bindings jax lowers with)

# jax leaves the methods of Primitive, the constructor of PartitionSpec and a few
# functions unannotated, so every call of them would be an untyped call. The type checker
# sees them as declared here, typed as jax_ext calls them; at run time they are jax's own.
if TYPE_CHECKING:
    from jax.extend import core as _core
    from typing_extensions import TypeIs

    class Primitive(_core.Primitive):
        """Its rules take and return arrays, avals and params, which jax types nowhere;
        every jax_ext primitive has one result."""
        def bind(self, *args: Any, **params: Any) -> jax.Array: ...
        def abstract_eval(self, *args: Any, **params: Any) -> Any: ...
        def def_impl(self, impl: Callable[..., Any]) -> Any: ...
        def def_abstract_eval(self, abstract_eval: Callable[..., Any]) -> Any: ...
        def def_effectful_abstract_eval(self, effectful_abstract_eval: Callable[..., Any]
                                        ) -> Any: ...

    def PartitionSpec(*partitions: SpecEntry) -> jax.sharding.PartitionSpec: ...
    def ShapeDtypeStruct(shape: Any, dtype: Any) -> jax.ShapeDtypeStruct: ...
    def is_undefined_primal(x: object) -> TypeIs[ad.UndefinedPrimal]: ...
    def apply_primitive(prim: Primitive, *args: Any, **params: Any) -> Any: ...
    def reshard(x: jax.Array, sharding: jax.sharding.NamedSharding) -> jax.Array: ...
else:
    from jax.extend.core import Primitive as Primitive  # noqa: E402
    from jax.sharding import PartitionSpec as PartitionSpec  # noqa: E402
    ShapeDtypeStruct = jax.ShapeDtypeStruct
    is_undefined_primal = ad.is_undefined_primal
    apply_primitive = xla.apply_primitive
    reshard = jax.sharding.reshard

Zero = ad.Zero

# What jax hands the rules: an abstract value (a ShapedArray, with shape, dtype, weak_type
# and sharding), read by attribute. jax's ShapedArray is public but leaves its methods
# (update, str_short, to_tangent_aval) unannotated, and ctx.avals_in is typed as the
# AbstractValue base, which has neither shape nor dtype; so an aval is Any here.
Aval = Any
# What a lowering rule returns (mlir.LoweringRule): the MLIR values of its results.
IrValues = Sequence[ir.Value[Any] | Sequence[ir.Value[Any]]]
# What a PartitionSpec holds for one dim: None, a mesh axis name or a tuple of names.
SpecEntry = str | tuple[str, ...] | None
# A rule's tangent or cotangent: an array, or jax's symbolic Zero.
Tangent = Any
# A transpose rule's operand: an array, or UndefinedPrimal for an input it is linear in.
Primal = jax.Array | ad.UndefinedPrimal
# A batching rule: rule(axis_size, args, dims, **params) -> (out, out_dim), or for a
# primitive of several results (outs, out_dims).
BatchRule = Callable[..., tuple[Any, Any]]


def instantiate_tangent(t: Tangent, primal: Any) -> Tangent:
    """A JVP rule's tangent as an array of the primal's tangent type. jax hands a rule
    the Python scalar a caller passed (jax.jvp(f, (x,), (1.,)) under jit or make_jaxpr)
    unconverted; symbolic zeros stay as they are."""
    if type(t) is Zero or hasattr(t, "dtype"):
        return t
    import jax.numpy as jnp
    return jnp.asarray(t, dtype=jax.typeof(primal).to_tangent_aval().dtype)


def convert_element_type(x: jax.Array, dtype: np.dtype[Any], *, weak_type: bool) -> jax.Array:
    """x as `dtype`, weakly typed when `weak_type`, as jnp's promotion converts operands
    (int32 array beside 0.5 -> weak float32). lax.convert_element_type, the public one,
    always gives a strong type."""
    from jax._src.lax.lax import _convert_element_type
    out: jax.Array = _convert_element_type(x, dtype, weak_type=weak_type)
    return out


def register_batcher(prim: Primitive, rule: BatchRule) -> None:
    """rule(axis_size, args, dims, **params) -> (out, out_dim)."""
    def batcher(axis_data: Any, args: Sequence[Any], bdims: Sequence[int | None],
                **params: Any) -> tuple[Any, Any]:
        # jax calls the batcher even when no operand is batched (e.g. the primal half of
        # a JVP under vmap); the result must then stay unbatched.
        if all(d is None for d in bdims):
            out: Any = prim.bind(*args, **params)
            return out, ([None] * len(out) if prim.multiple_results else None)
        return rule(axis_data.size, args, bdims, **params)

    batching.fancy_primitive_batchers[prim] = batcher


def register_lowering(prim: Primitive, rule: mlir.LoweringRule, *, per_site: bool = False
                      ) -> None:
    """mlir.register_lowering for every platform.

    `per_site`: `rule` must run at every equation of `prim` being lowered, not once per
    (avals, params) as jax's per-module lowering cache would serve it. jax_ext's ops
    need that for what only the call site knows: auto's choice (producers and consumers),
    a donated operand, explain's record. jax marks its own such rules (jit, callbacks,
    custom_vjp) with register_lowering's `cacheable=False`, the one spelling it has. The
    work that does not depend on the site (tracing and lowering the lax implementation)
    is cached by jax_ext instead (_lowering.outlined). Should a jax drop the keyword,
    that is a fallback: the rule is cached, and auto decides once per (avals, params)."""
    kw = _PARTITIONING_KW
    if not per_site:
        mlir.register_lowering(prim, rule, platform=None, **kw)
        return
    try:
        mlir.register_lowering(prim, rule, platform=None, cacheable=False, **kw)
    except TypeError as e:
        fallback(f"jax's register_lowering has no cacheable flag: {prim.name} is lowered "
                 "once per (avals, params), and auto decides once for all such sites", e)
        mlir.register_lowering(prim, rule, platform=None, **kw)


def _lowered_as_is(*avals: Any, **params: Any) -> None:
    return None


# Under jax_partitioning (new in jax 0.12, off by default) jax lowers each op of a program
# on an Explicit mesh inside a shard_map, and asks the op's primitive for a
# `shard_map_collective_rule` (a keyword of register_lowering): None lowers the primitive
# as it is, as jax's call-like primitives (jit, custom_vjp, cond) answer. jax_ext's
# primitives answer so: their lowering partitions the call itself (custom_partitioning
# with a Shardy rule, or the lax ops, each with jax's own rule), as it does with the option
# off. jax 0.10.2 has neither the option nor the keyword.
_PARTITIONING_KW: dict[str, Any] = (
    {"shard_map_collective_rule": _lowered_as_is}
    if "shard_map_collective_rule" in inspect.signature(mlir.register_lowering).parameters
    else {})


# jit's `inline` that inlines a nested jitted function while jax traces, into the
# enclosing jaxpr (what jnp's helpers get). jax 0.11 added jax.Inline, and `inline=True`
# there means Inline.JAX_LATE: the jit equation stays in the jaxpr until lowering, where
# auto's analysis and donation would see one more call level than on jax 0.10.
TRACE_INLINE: Any = getattr(getattr(jax, "Inline", None), "JAX_EARLY", True)


def enclosing_equations(limit: int = 64) -> list[tuple[Any, Any, dict[Any, Any]]]:
    """(jaxpr, eqn, env) for every jaxpr jax is lowering on this thread right now, innermost
    first: jax lowers a jaxpr one equation at a time in ``mlir.jaxpr_subcomp``, and the
    frames of those calls hold them (env: jaxpr variable -> MLIR value). [] when this jax
    lowers some other way (a fallback: then implementation "auto" treats consumers as
    unknown)."""
    code = getattr(getattr(mlir, "jaxpr_subcomp", None), "__code__", None)
    if code is None:
        fallback("no mlir.jaxpr_subcomp to read the enclosing equations from: auto treats "
                 "producers and consumers as unknown")
        return []
    out: list[tuple[Any, Any, dict[Any, Any]]] = []
    f: FrameType | None = sys._getframe(1)
    while f is not None and len(out) < limit:
        if f.f_code is code:
            loc = f.f_locals
            j, e, env = loc.get("jaxpr"), loc.get("eqn"), loc.get("env")
            if j is None or e is None or not isinstance(env, dict):
                fallback("mlir.jaxpr_subcomp has no jaxpr, eqn and env locals: auto treats "
                         "producers and consumers as unknown")
                return []
            out.append((j, e, env))
        f = f.f_back
    return out


_T = TypeVar("_T", covariant=True)


class ConfigState(Protocol[_T]):
    """What jax_ext uses of a jax config state: its value here, and a context manager
    that sets it for a block."""

    @property
    def value(self) -> _T: ...

    def __call__(self, value: Any, /) -> AbstractContextManager[None]: ...


def impl_state(names: Sequence[str]) -> ConfigState[str]:
    """A jax config option 'jax_ext_impl' (jax takes its default from the environment
    variable JAX_EXT_IMPL) that is part of the jit cache key, so a function traced under
    implementation("lax") is not reused under "native". `names`: the values, the default
    first. jax has no public enum state that joins the jit key: enum_state is jax's own."""
    from jax._src import config as jax_config
    return jax_config.enum_state(
        name="jax_ext_impl", enum_values=list(names), default=names[0],
        help="jax_ext: run primitives natively on CPU ('native'), through lax ('lax'), "
             "or chosen per call site by cost and stored tuning ('auto'; see "
             "jax_ext.explain).",
        include_in_jit_key=True, include_in_trace_context=True)


_TUNING_STATE = "jax_ext_tuning_state"


def tuning_state(default: str) -> ConfigState[str]:
    """A jax config state 'jax_ext_tuning_state' holding which measured choices a lowering
    sees (jax_ext.auto.tuning), part of the jit cache key and the trace context, so a
    function traced before jax_ext.tune stored a choice is traced again after. jax has no
    public string state that joins the jit key: string_or_object_state is jax's own."""
    from jax._src import config as jax_config
    return jax_config.string_or_object_state(
        name=_TUNING_STATE, default=default,
        help="jax_ext: which measured call-site choices implementation 'auto' uses "
             "(set by jax_ext.tune and jax_ext.tuning; not a user setting).",
        include_in_jit_key=True, include_in_trace_context=True)


def set_tuning_state(value: str) -> None:
    """The tuning state's process-wide value (what threads outside a tuning() block see)."""
    # jax leaves Config.update unannotated.
    jax.config.update(_TUNING_STATE, value)  # type: ignore[no-untyped-call]


def is_donated_block_argument(value: ir.Value[Any]) -> bool:
    """True when `value` is an argument of the function being lowered that the caller
    donated (jit(..., donate_argnums=...)). Any surprise in the IR means 'no' (a
    fallback: the call then copies instead of updating in place)."""
    try:
        if not isinstance(value, ir.BlockArgument):
            return False
        func = value.owner.owner
        if func.operation.name != "func.func" or "arg_attrs" not in func.attributes:
            return False
        attrs = ir.DictAttr(ir.ArrayAttr(func.attributes["arg_attrs"])[value.arg_number])
        return "jax.buffer_donor" in attrs or "tf.aliasing_output" in attrs
    except Exception as e:
        fallback("an argument's donation could not be read from the IR: not donated", e)
        return False


# --- binding a primitive -----------------------------------------------------------------

def bind(prim: Primitive, *args: Any, **params: Any) -> jax.Array:
    """`prim.bind` with invariant operands made varying where they meet varying ones, as
    jax's lax primitives bind (a no-op outside shard_map and under check_vma=False; what
    jax_auto_pcast=False leaves alone, the abstract evaluation then rejects: see
    _compat_sharding's "varying manual axes")."""
    from jax._src import core as _src_core
    insert: Callable[..., Sequence[Any]] = _src_core.auto_insert_reshard
    out: jax.Array = prim.bind(*insert(*args), **params)  # jax_ext's primitives: one result
    return out
