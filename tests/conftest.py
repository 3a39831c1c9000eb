import os

import jax

# 64-bit dtypes (float64, int64, uint64, complex128) are part of the contract.
jax.config.update("jax_enable_x64", True)

from hypothesis import HealthCheck, settings  # noqa: E402

# "ci": bounded time on a 2-core machine; "long": local soak (HYPOTHESIS_PROFILE=long).
settings.register_profile("ci", deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="run the big-buffer tests (> 2^31 bytes, several GiB of memory)")


def pytest_collection_modifyitems(config, items):
    import pytest
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="big-buffer test: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
