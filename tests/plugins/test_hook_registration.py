"""Registering hook plugins: validation at registration, policies and tiers that carry
hookimpls, and the autoload / allow / block switches of plugin discovery."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
from _dists import ModuleFactory
from _hook_helpers import (
    make_tiered,
    num,
    store,
)
from _hook_plugins import NoOpObserver
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.config.env import EnvironmentOverrideWarning
from kv_offload.errors import PluginImportError, PluginValidationError
from kv_offload.plugins import (
    BrokenPluginWarning,
    KVOffloadPluginManager,
    create_plugin_manager,
    get_plugin_manager,
    hookimpl,
)
from kv_offload.plugins import loading as hooks_module
from kv_offload.policies import CachePolicyFactory
from kv_offload_example_tier import ExampleSecondaryTierManager

# -- registration -----------------------------------------------------------------------------


def test_unknown_hook_name_is_rejected_at_registration(pm: KVOffloadPluginManager) -> None:
    m = CPUOffloadingManager(4, plugin_manager=pm)

    class Typo:
        @hookimpl
        def kv_offload_blocks_stored(self) -> None:
            raise AssertionError("never called")

        @hookimpl
        def kv_offload_blocks_stord(self) -> None:
            raise AssertionError("never called")

    with pytest.raises(PluginValidationError) as exc:
        pm.register(Typo(), name="typo")
    message = str(exc.value)
    assert "hook plugin 'typo' is invalid" in message
    assert "unknown hook 'kv_offload_blocks_stord'" in message
    assert "kv_offload_blocks_stored" in message.split("hook names are")[1]  # the valid ones
    assert (exc.value.kind, exc.value.plugin) == ("hook", "typo")
    assert pm.get_plugin("typo") is None
    assert m.hooks.blocks_stored is None  # nothing of it stays behind
    store(m, ReqContext("r"), 1)


def test_unprefixed_hook_name_is_rejected(pm: KVOffloadPluginManager) -> None:
    class Unprefixed:
        @hookimpl
        def blocks_stored(self) -> None:
            pass

    with pytest.raises(PluginValidationError, match="unknown hook 'blocks_stored'"):
        pm.register(Unprefixed())


def test_wrong_argument_name_is_rejected_at_registration(pm: KVOffloadPluginManager) -> None:
    class WrongArgs:
        @hookimpl
        def kv_offload_blocks_evicted(self, manager: Any, blocks: list[OffloadKey]) -> None:
            pass

    with pytest.raises(PluginValidationError) as exc:
        pm.register(WrongArgs(), name="wrong-args")
    message = str(exc.value)
    assert "hook plugin 'wrong-args' is invalid" in message
    assert "kv_offload_blocks_evicted" in message and "'blocks'" in message
    assert pm.get_plugin("wrong-args") is None
    assert not pm.hook.kv_offload_blocks_evicted.get_hookimpls()


def test_module_plugin_and_subset_of_arguments(
    pm: KVOffloadPluginManager, make_module: ModuleFactory
) -> None:
    name = make_module(
        """
        from kv_offload.plugins import hookimpl

        seen = []

        @hookimpl
        def kv_offload_blocks_stored(keys, medium):
            seen.append((len(keys), medium))
        """
    )
    module = __import__(name)
    pm.register(module)
    store(CPUOffloadingManager(4, plugin_manager=pm), ReqContext("r"), 1, 2)
    assert module.seen == [(2, "CPU")]


# -- policies and tiers that implement hooks --------------------------------------------------

HOOKED_POLICY = """
from kv_offload.plugins import hookimpl
from kv_offload_lru import LRUCachePolicy


class HookedLRU(LRUCachePolicy):
    '''LRU that counts the requests it saw start and the blocks stored by its manager.'''

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.events = []

    @hookimpl
    def kv_offload_request_started(self, req_context):
        self.events.append(("started", req_context.req_id))

    @hookimpl
    def kv_offload_blocks_stored(self, keys, medium):
        self.events.append(("stored", medium, len(keys)))

    @hookimpl
    def kv_offload_shutdown(self, manager):
        self.events.append(("shutdown",))
"""


@pytest.fixture
def hooked_policy(make_module: ModuleFactory) -> Iterator[str]:
    name = make_module(HOOKED_POLICY)
    CachePolicyFactory.register_cache_policy("hooked-lru-test", name, "HookedLRU")
    yield "hooked-lru-test"
    CachePolicyFactory.unregister_cache_policy("hooked-lru-test")


def test_policy_with_hookimpls_is_registered_and_unregistered_at_shutdown(
    pm: KVOffloadPluginManager, hooked_policy: str
) -> None:
    m = CPUOffloadingManager(4, cache_policy=hooked_policy, plugin_manager=pm)
    policy: Any = m.policy
    assert policy in pm.get_plugins()
    ctx = ReqContext("r")
    m.on_new_request(ctx)
    store(m, ctx, 1, 2)
    m.shutdown()
    assert policy not in pm.get_plugins()
    assert policy.events == [("started", "r"), ("stored", "CPU", 2), ("shutdown",)]


def test_policy_without_hookimpls_is_not_registered(pm: KVOffloadPluginManager) -> None:
    CPUOffloadingManager(4, cache_policy="lru", plugin_manager=pm)
    CPUOffloadingManager(4, cache_policy="arc", plugin_manager=pm)
    assert pm.get_plugins() == set()


def test_policy_with_invalid_hookimpl_fails_the_manager(
    pm: KVOffloadPluginManager, make_module: ModuleFactory
) -> None:
    name = make_module(
        """
        from kv_offload.plugins import hookimpl
        from kv_offload_lru import LRUCachePolicy

        class BadHookLRU(LRUCachePolicy):
            @hookimpl
            def kv_offload_blocks_evicted(self, victims):
                pass
        """
    )
    CachePolicyFactory.register_cache_policy("bad-hook-lru-test", name, "BadHookLRU")
    try:
        with pytest.raises(PluginValidationError, match=r"(?s)BadHookLRU@.*'victims'"):
            CPUOffloadingManager(4, cache_policy="bad-hook-lru-test", plugin_manager=pm)
    finally:
        CachePolicyFactory.unregister_cache_policy("bad-hook-lru-test")
    assert pm.get_plugins() == set()


class VictimCacheTier(ExampleSecondaryTierManager):
    """A tier that reacts to CPU evictions: the blocks the CPU tier just dropped become the
    most recently used here, so this tier's own LRU keeps them longest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evictions: list[list[OffloadKey]] = []

    @hookimpl
    def kv_offload_blocks_evicted(self, keys: list[OffloadKey], medium: str) -> None:
        if medium == "CPU":
            self.evictions.append(list(keys))
            self.touch(keys, ReqContext("victim-cache"))


def test_tier_reacting_to_cpu_evictions(pm: KVOffloadPluginManager) -> None:
    m = make_tiered(pm, num_blocks=2, tier_cls=VictimCacheTier, capacity_blocks=3)
    tier = m.tiers[0]
    assert isinstance(tier, VictimCacheTier)
    assert tier in pm.get_plugins()
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3)  # the CPU tier evicts 1; the tier now ranks 1 above 2
    m.on_schedule_end()
    assert [[num(key) for key in batch] for batch in tier.evictions] == [[1]]
    store(m, ctx, 4)  # CPU evicts 2, which the tier now ranks above 3 (still in the CPU)
    m.on_schedule_end()  # the cascade of 4 fills the tier: it drops its LRU block, 1
    assert [[num(key) for key in batch] for batch in tier.evictions] == [[1], [2]]
    # A plain LRU tier would hold 2 3 4 in cascade order; this one ranks 2 above 3.
    assert [num(key) for key in tier._rows] == [3, 2, 4]
    m.shutdown()
    assert tier not in pm.get_plugins()
    assert pm.get_plugins() == set()


# -- plugin discovery switches (fake entry points; real distributions: test_hook_discovery) --

PLUGIN_MODULE = """
from kv_offload.plugins import hookimpl

stored = []

@hookimpl
def kv_offload_blocks_stored(keys):
    stored.append(len(keys))
"""


@pytest.fixture
def fake_entry_points(
    make_module: ModuleFactory, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Entry points ``alpha``, ``beta`` (working) and ``broken`` in ``kv_offload.hooks``;
    returns their module names. The switches' environment variables start unset."""
    modules = {
        "alpha": make_module(PLUGIN_MODULE, prefix="kvo_hook_alpha"),
        "beta": make_module(PLUGIN_MODULE, prefix="kvo_hook_beta"),
        "broken": make_module("raise ImportError('no native lib')\n", prefix="kvo_hook_broken"),
    }
    eps = [
        metadata.EntryPoint(name, module, hooks_module.HOOK_ENTRY_POINT_GROUP)
        for name, module in modules.items()
    ]

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(hooks_module, "metadata", types.SimpleNamespace(entry_points=entry_points))
    for var in (hooks_module.AUTOLOAD_DISABLE_ENV, hooks_module.ALLOW_ENV, hooks_module.BLOCK_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(hooks_module.BLOCK_ENV, "broken")
    return modules


def loaded(pm: KVOffloadPluginManager, modules: dict[str, str]) -> dict[str, tuple[bool, bool]]:
    return {
        name: (pm.get_plugin(name) is not None, module in sys.modules)
        for name, module in modules.items()
        if name != "broken"
    }


def test_env_autoload_loads_entry_points(fake_entry_points: dict[str, str]) -> None:
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}
    store(CPUOffloadingManager(4, plugin_manager=pm), ReqContext("r"), 1, 2, 3)
    assert sys.modules[fake_entry_points["alpha"]].stored == [3]


def test_env_disable_autoload(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}
    assert pm.get_plugins() == set()


def test_env_allow_list(fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "beta")
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}


def test_env_allow_list_replaces_the_allow_argument(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment's list is final (issue 10, item 7): it never widens to ``allow=``."""
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "beta")
    with pytest.warns(EnvironmentOverrideWarning, match=r"KV_OFFLOAD_PLUGINS=beta overrides "):
        pm = create_plugin_manager(allow=["alpha"])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}


def test_env_block_list_never_imports(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_BLOCK_PLUGINS", "alpha, broken")
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "alpha beta")  # blocking beats allowing
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}
    assert pm.is_blocked("alpha")
    assert pm.register(types.SimpleNamespace(), name="alpha") is None  # stays blocked


def test_autoload_false_ignores_entry_points(fake_entry_points: dict[str, str]) -> None:
    pm = create_plugin_manager(autoload=False, plugins=[NoOpObserver()])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}
    assert len(pm.get_plugins()) == 1


def test_broken_entry_point_is_skipped_unless_enabled(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KV_OFFLOAD_BLOCK_PLUGINS")
    with pytest.warns(BrokenPluginWarning, match="hook plugin 'broken'.*skipped"):
        pm = create_plugin_manager()
    assert pm.get_plugin("alpha") is not None and "broken" in pm.skipped
    with pytest.raises(PluginImportError) as exc:
        create_plugin_manager(allow=["alpha", "broken"])
    assert (exc.value.kind, exc.value.plugin) == ("hook", "broken")
    assert "hook plugin 'broken'" in str(exc.value)
    assert "KV_OFFLOAD_BLOCK_PLUGINS=broken" in str(exc.value)


def test_default_plugin_manager_is_shared_and_autoloaded(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks_module, "_default", None)
    pm = get_plugin_manager()
    assert pm is get_plugin_manager()
    assert pm.get_plugin("alpha") is not None
    m = CPUOffloadingManager(4)
    assert m.plugin_manager is pm
    other = create_plugin_manager(autoload=False)
    assert CPUOffloadingManager(4, plugin_manager=other).plugin_manager is other
