"""Shared fixtures: throwaway modules on ``sys.path`` and real plugin environments."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _dists import ModuleFactory, PluginEnv
from kv_offload.plugins import KVOffloadPluginManager, create_plugin_manager
from kv_offload.policies import CachePolicyFactory
from kv_offload.tiering import SecondaryTierFactory

#: ``register(name, module_path, class_name)`` of a runtime registration fixture.
Register = Callable[[str, str, str], None]


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleFactory]:
    """A :class:`ModuleFactory`; its modules leave ``sys.path`` and ``sys.modules`` afterwards."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    factory = ModuleFactory(folder)
    yield factory
    for name in factory.created:
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def plugin_env_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], PluginEnv]:
    """``plugin_env_factory(label) -> PluginEnv``: a fresh real virtual environment that sees
    the test environment's packages (see ``tests/_dists.py``)."""

    def make(label: str) -> PluginEnv:
        return PluginEnv(tmp_path_factory.mktemp(label) / "venv")

    return make


@pytest.fixture
def pm() -> KVOffloadPluginManager:
    """A fresh plugin manager with nothing autoloaded."""
    return create_plugin_manager(autoload=False)


def _registrations(register: Register, unregister: Callable[[str], None]) -> Iterator[Register]:
    names: list[str] = []

    def _register(name: str, module_path: str, class_name: str) -> None:
        register(name, module_path, class_name)
        names.append(name)

    yield _register
    for name in names:
        unregister(name)


@pytest.fixture
def register_policy() -> Iterator[Register]:
    """``register_policy(name, module_path, class_name)``; unregistered afterwards."""
    yield from _registrations(
        CachePolicyFactory.register_cache_policy, CachePolicyFactory.unregister_cache_policy
    )


@pytest.fixture
def register_tier() -> Iterator[Register]:
    """``register_tier(name, module_path, class_name)``; unregistered afterwards."""
    yield from _registrations(
        SecondaryTierFactory.register_tier, SecondaryTierFactory.unregister_tier
    )


@pytest.fixture
def quiet_tiering_log() -> Iterator[None]:
    """``kv_offload.tiering`` at CRITICAL: the manager logs each raising ``submit_*`` with a
    traceback, and thousands of those in a fault-injection run would only slow it down (the
    tier counters say how many there were)."""
    logger = logging.getLogger("kv_offload.tiering")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every microsecond, so calls of two threads interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)
