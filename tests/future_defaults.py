"""jax's announced future defaults, turned on together for a run of the suite.

jax says these options will change their defaults (`jax_auto_pcast` becomes False) or
become the only mode (`jax_remat3`, `jax_custom_vjp3`). With JAX_EXT_FUTURE_DEFAULTS=1 in
the environment, tests/conftest.py sets them all before any test runs, and the child
processes the tests start (tests/vma_checks.py, ...) do the same through `apply`, so a flip
is caught before a jax release ships it. CI runs the tests that concern them this way on
the newest jax (.ci/run); a jax that lacks one of the options fails the run, as a removed
option must be dropped from here once jax has flipped it."""
import os

ENV = "JAX_EXT_FUTURE_DEFAULTS"
OPTIONS = {"jax_auto_pcast": False, "jax_remat3": True, "jax_custom_vjp3": True}


def requested() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def apply() -> None:
    """Sets every option of OPTIONS where the environment asks for it."""
    if not requested():
        return
    import jax
    missing = sorted(k for k in OPTIONS if k not in jax.config.values)
    if missing:
        raise RuntimeError(f"{ENV}=1, but jax {jax.__version__} has no option {missing}")
    for name, value in OPTIONS.items():
        jax.config.update(name, value)


def auto_pcast() -> bool:
    """jax_auto_pcast's value in this process."""
    import jax
    return bool(jax.config.values.get("jax_auto_pcast", True))
