"""jax's persistent compilation cache across processes: a sharded program that uses jax_ext,
compiled in one process, is read from the cache in the next, with the same bits, on every
path (tests/cache_checks.py runs the programs in child processes on 4 host devices).

Under jit with sharded operands, jax_ext partitions its calls itself (the kernels, and the
lax gather, whose bits XLA's partitioning would not keep) with jax's custom_partitioning,
whose callback's address is part of the cache key unless
`jax_remove_custom_partitioning_ptr_from_cache_key` is set (docs/scaling-out.md).
Programs under shard_map need no setting."""
import json
import os
import subprocess
import sys

import pytest

import jax_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(cache, out, setting, which):
    env = dict(os.environ)
    env.pop("JAX_EXT_IMPL", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cache_checks.py"), str(cache),
                           str(out), setting, which], env=env, cwd=HERE, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"cache_checks.py failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _two_runs(tmp_path, setting, which):
    """The same programs in two fresh processes sharing one cache directory: the second
    process's results, hits, and the cache entries each process left."""
    cache = tmp_path / "cache"
    first = _run(cache, tmp_path / "first.json", setting, which)
    entries = sorted(os.listdir(cache))
    second = _run(cache, tmp_path / "second.json", setting, which)
    for name, rec in first["results"].items():
        assert rec["forward_exact"] and rec["grad_close"], (name, rec)
        assert second["results"][name] == rec, name  # the same bits from the cache
    return first, second, entries, sorted(os.listdir(cache))


@pytest.mark.skipif(not jax_ext.native_available(), reason="the kernels' partitioning needs "
                    "the native module")
def test_every_program_is_read_from_the_cache_with_the_setting(tmp_path):
    first, second, entries, after = _two_runs(tmp_path, "on", "all")
    assert len(first["results"]) == 6
    assert after == entries, "the second process compiled again: " + str(
        sorted(set(after) - set(entries)))
    assert second["hits"] >= len(entries) > 0


def test_shard_map_programs_need_no_setting(tmp_path):
    first, second, entries, after = _two_runs(tmp_path, "off", "shard_map")
    assert set(first["results"]) == {"shard_map[native]", "shard_map[lax]", "shard_map[auto]"}
    assert after == entries, sorted(set(after) - set(entries))
    assert second["hits"] >= len(entries) > 0


@pytest.mark.skipif(not jax_ext.native_available(), reason="the kernels' partitioning needs "
                    "the native module")
def test_a_partitioned_call_misses_the_cache_without_the_setting(tmp_path):
    """jax's behaviour, which docs/scaling-out.md tells users about: this test fails, and
    the docs are to change, when a jax release drops the address from the key."""
    _, _, entries, after = _two_runs(tmp_path, "off", "all")
    assert len(after) > len(entries), "the second process read every program from the cache"
