import atexit
import os
import shutil
import tempfile

import jax

# Strict mode (its children included): a fallback of jax_ext raises instead of quietly
# changing behaviour (jax_ext._compat.fallback), so a jax release that moves what one
# relies on fails here. Set before jax_ext is imported; CI runs this suite.
os.environ["JAX_EXT_STRICT"] = "1"

# The suite (its children included) never reads or writes the user's tuning cache; each
# pytest process (xdist's workers too) removes its own folder when it exits.
os.environ["JAX_EXT_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_ext_test_cache_")
atexit.register(shutil.rmtree, os.environ["JAX_EXT_CACHE_DIR"], ignore_errors=True)

# The scatter-add streams a result from 16 MiB, or from half the last-level cache where
# that is larger (xla_ffi/memory.h): fixed at 16 MiB for the suite (its children included),
# so that the tests of large results reach the streaming stores on every machine.
os.environ["JAX_EXT_SCATTER_STREAM_BYTES"] = str(16 << 20)

# 64-bit dtypes (float64, int64, uint64, complex128) are part of the contract.
jax.config.update("jax_enable_x64", True)

# JAX_EXT_FUTURE_DEFAULTS=1: jax's announced future defaults, all on (tests/future_defaults.py;
# the child processes the tests start read the same variable).
import future_defaults  # noqa: E402

future_defaults.apply()

from hypothesis import HealthCheck, settings  # noqa: E402

# "ci": bounded time on a 2-core machine; "long": local soak (HYPOTHESIS_PROFILE=long).
settings.register_profile("ci", deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _children_import_this_jax_ext():
    """Tests start child Pythons (hostile inputs, sharding, examples) from other working
    directories. They must import the jax_ext this process tests: under `python -m pytest`
    from a source checkout with a build copied in, that is the checkout, which a child
    would not find (it would take an installed, possibly stale, copy instead)."""
    import importlib.util
    import site
    spec = importlib.util.find_spec("jax_ext")
    if spec is None or not spec.submodule_search_locations:
        return
    parent = os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))
    sites = {os.path.abspath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if parent in sites:
        return  # an installed package: children find it anyway
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([parent] + paths)


_children_import_this_jax_ext()


def pytest_sessionstart(session):
    """Under .ci/sanitize.sh: the imported native module must be the sanitized build."""
    want = os.environ.get("JAX_EXT_EXPECT_SANITIZED")
    if not want:
        return
    import jax_ext
    from jax_ext import _jax_ext
    assert jax_ext.native_available(), "sanitized run: the native module did not load"
    assert os.path.samefile(_jax_ext.__file__, want), (_jax_ext.__file__, want)
    with open("/proc/self/maps") as f:
        assert "libasan" in f.read(), "sanitized run: libasan is not loaded"


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="run the big-buffer tests (> 2^31 bytes, several GiB of memory)")
    parser.addoption("--without-impl", action="append", default=[],
                     choices=["native", "lax", "auto"],
                     help="deselect the tests parametrized with this implementation "
                          "(.ci/sanitize.sh: the lax path never reaches native code)")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml's addopts): a worker per core this process may run on, at
    most 8 (each worker's tests start child processes of their own with 4-8 devices)."""
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def _module_fixture_marker(fixturedef, request):
    """The file that says a module-scoped fixture of this run has been set up: one per
    run (xdist's workers share the run's id), or None outside a module fixture."""
    if fixturedef.scope != "module" or fixturedef.argname.startswith("_xunit"):
        return None  # setup_module() is cheap; only the child-process fixtures matter
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None  # one process: pytest itself sets each module fixture up once
    folder = os.path.join(tempfile.gettempdir(), f"jax_ext_fixtures_{run}")
    os.makedirs(folder, exist_ok=True)
    param = getattr(request, "param_index", 0)
    return os.path.join(folder, f"{request.module.__name__}.{fixturedef.argname}.{param}")


def pytest_fixture_setup(fixturedef, request):
    """A module-scoped fixture here runs a child process (a sharding or device matrix, up
    to minutes). pyproject.toml's `--dist loadfile` keeps a module's tests on one worker,
    so each runs once per run; were the suite's distribution ever to split a module (a
    pytest or pytest-xdist release that changes how work is handed out), this fails the
    second setup instead of quietly paying for the child twice."""
    marker = _module_fixture_marker(fixturedef, request)
    if marker is None:
        return None
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        raise RuntimeError(
            f"the module fixture {os.path.basename(marker)} was set up on a second xdist "
            "worker in one run: the tests of one module must stay on one worker "
            "(pyproject.toml's --dist loadfile)") from None
    os.close(fd)
    return None


def _only_the_gpu_subset_off_the_cpu(items):
    """On a GPU or TPU (jax's default backend), the tests outside the `gpu` subset skip:
    they need what only the CPU has (the kernels on the default device, forced host
    devices in child processes). .ci/gpu-check runs the subset (`pytest -m gpu`)."""
    import pytest
    backend = jax.default_backend()
    if backend == "cpu":
        return
    skip = pytest.mark.skip(reason=f"needs the CPU backend (jax's default here is {backend}); "
                            "the GPU subset is marked gpu")
    for item in items:
        if item.get_closest_marker("gpu") is None:
            item.add_marker(skip)


def _without_impls(config, items):
    """--without-impl lax: the tests whose `impl` parameter is lax are deselected (the
    sanitized leg runs what reaches the native module; the lax path has no native code)."""
    drop = set(config.getoption("--without-impl"))
    if not drop:
        return
    keep, gone = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        impl = spec.params.get("impl") if spec is not None else None
        (gone if impl in drop else keep).append(item)
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    import pytest
    _without_impls(config, items)
    _only_the_gpu_subset_off_the_cpu(items)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="big-buffer test: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
