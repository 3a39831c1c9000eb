"""Where measured choices live: the cache file under the user's cache directory, keyed by
the machine (CPU model, cores) and the jax, jaxlib and jax_ext versions.

``JAX_EXT_TUNING=off`` turns the cache off, ``JAX_EXT_CACHE_DIR`` moves it.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from .model import fmt_s

_OFF = ("0", "off", "false", "no")
_FORMAT = 1
_lock = threading.Lock()


def enabled_by_env() -> bool:
    return os.environ.get("JAX_EXT_TUNING", "on").strip().lower() not in _OFF


def cache_dir() -> str:
    """JAX_EXT_CACHE_DIR, else $XDG_CACHE_HOME/jax_ext, else ~/.cache/jax_ext."""
    env = os.environ
    return _cache_dir(env.get("JAX_EXT_CACHE_DIR"), env.get("XDG_CACHE_HOME"),
                      env.get("HOME"))


@functools.lru_cache(maxsize=16)  # asked at every auto call site's lowering
def _cache_dir(explicit: str | None, xdg: str | None, home: str | None) -> str:
    # (`home` only keys the cache: expanduser reads $HOME itself)
    if explicit:
        return explicit
    base = xdg or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jax_ext")


def cache_path() -> str:
    return os.path.join(cache_dir(), "tuning.json")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@functools.cache  # looked up at every auto call site's lowering; fixed for the process
def machine_key() -> str:
    """What a measured choice holds for: this CPU and core count, these versions."""
    import jax
    import jaxlib

    from .._version import __version__
    return (f"{cpu_model()} x{cores()}; jax {jax.__version__}; jaxlib "
            f"{getattr(jaxlib, '__version__', '?')}; jax_ext {__version__}")


@dataclass(frozen=True)
class Tuned:
    """One site's measured choice: the program's median time with the site native and
    with it lax, over `rounds` alternating pairs of calls."""
    impl: str
    native_s: float
    lax_s: float
    rounds: int

    def reason(self) -> str:
        return (f"tuned: {fmt_s(self.native_s)} vs lax {fmt_s(self.lax_s)}, "
                f"{self.rounds} rounds")


class Store:
    """The cache file: {"format": 1, "machines": {machine_key: {site: Tuned}}}."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.machines: dict[str, dict[str, Tuned]] = self._read()

    def _read(self) -> dict[str, dict[str, Tuned]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                tree = json.load(f)
            if tree.get("format") != _FORMAT:
                return {}
            return {m: {k: Tuned(**v) for k, v in sites.items()}
                    for m, sites in tree["machines"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}  # no file yet, or one this version cannot read: start afresh

    def sites(self, machine: str) -> dict[str, Tuned]:
        return self.machines.get(machine, {})

    def update(self, machine: str, choices: Mapping[str, Tuned]) -> None:
        """Adds `choices` and writes the file atomically, merged with what another
        process may have written since it was read."""
        self.machines = self._read()
        self.machines.setdefault(machine, {}).update(choices)
        tree = {"format": _FORMAT, "machines": {m: {k: asdict(v) for k, v in s.items()}
                                                for m, s in self.machines.items()}}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(tree, f, indent=1)
        os.replace(tmp, self.path)


_store: Store | None = None


def store() -> Store:
    global _store
    with _lock:
        if _store is None or _store.path != cache_path():
            _store = Store(cache_path())
        return _store
