"""Request-scoped policy callbacks: on_request_access and on_store_miss, through the manager.

A policy that overrides them sees exactly which keys each call of the request flow asked for
and which missed; a policy that does not (LRU, ARC) is never called, which is checked by
replacing the base class's no-ops with recorders.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _dists import ModuleFactory
from _policy_harness import k, run_request
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.plugins import ExperimentalPluginWarning
from kv_offload.policies import CachePolicy
from kv_offload.policies.base import splits_victims
from kv_offload.policies.factory import CachePolicyFactory
from kv_offload_lru import LRUCachePolicy

recorded: list[tuple[str, list[OffloadKey], str]] = []


class Recording(LRUCachePolicy):
    """LRU that records the callbacks, with the policy's state at that moment."""

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        recorded.append(("access", list(keys), req_context.req_id))

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        assert all(self.get(key) is None for key in keys), "reported before insert_many"
        recorded.append(("miss", list(keys), req_context.req_id))


@pytest.fixture
def recording() -> Any:
    CachePolicyFactory.register_cache_policy("recording-lru", __name__, "Recording")
    recorded.clear()
    yield
    CachePolicyFactory.unregister_cache_policy("recording-lru")


def test_callbacks_see_every_requested_key_and_the_misses(recording: None) -> None:
    manager = CPUOffloadingManager(4, cache_policy="recording-lru")
    run_request(manager, [k(1), k(2)], "a")
    assert recorded == [("access", [k(1), k(2)], "a"), ("miss", [k(1), k(2)], "a")]
    recorded.clear()
    run_request(manager, [k(3), k(2)], "b")  # k2 is resident behind the first miss
    assert recorded == [("access", [k(3), k(2)], "b"), ("miss", [k(3)], "b")]
    recorded.clear()
    run_request(manager, [k(1), k(2), k(5)], "c")  # two hits, then a miss
    assert recorded == [
        ("access", [k(1), k(2)], "c"),
        ("access", [k(5)], "c"),
        ("miss", [k(5)], "c"),
    ]
    recorded.clear()
    run_request(manager, [k(1), k(2)], "d")  # all hits: no store, no miss
    assert recorded == [("access", [k(1), k(2)], "d")]


def test_rejected_store_reports_access_and_miss_but_bad_input_reports_nothing(
    recording: None,
) -> None:
    manager = CPUOffloadingManager(2, cache_policy="recording-lru")
    ctx = ReqContext(req_id="r")
    assert manager.prepare_store([k(1), k(2), k(3)], ctx) is None  # cannot fit
    assert recorded == [("access", [k(1), k(2), k(3)], "r"), ("miss", [k(1), k(2), k(3)], "r")]
    recorded.clear()
    with pytest.raises(Exception, match="more than once"):
        manager.prepare_store([k(1), k(1)], ctx)
    with pytest.raises(Exception, match="not in the CPU cache"):
        manager.prepare_load([k(9)], ctx)
    assert recorded == []


def test_a_store_admission_hook_filters_before_on_store_miss(recording: None) -> None:
    from kv_offload.plugins import create_plugin_manager, hookimpl

    class OnlyEven:
        @hookimpl
        def kv_offload_store_admission(self, manager: Any, keys: Any, req_context: Any) -> Any:
            return [key for key in keys if key[7] % 2 == 0]

    plugins = create_plugin_manager()
    plugins.register(OnlyEven())
    manager = CPUOffloadingManager(8, cache_policy="recording-lru", plugin_manager=plugins)
    run_request(manager, [k(1), k(2), k(3), k(4)], "a")
    assert recorded == [("access", [k(1), k(2), k(3), k(4)], "a"), ("miss", [k(2), k(4)], "a")]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_policies_that_do_not_override_them_are_never_called(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []

    def access(self: CachePolicy, keys: list[OffloadKey], req_context: ReqContext) -> None:
        called.append("access")

    def miss(self: CachePolicy, keys: list[OffloadKey], req_context: ReqContext) -> None:
        called.append("miss")

    # Recorders in place of the base class's no-ops: a manager that called the inherited
    # methods (instead of skipping them) would record here.
    monkeypatch.setattr(CachePolicy, "on_request_access", access)
    monkeypatch.setattr(CachePolicy, "on_store_miss", miss)
    manager = CPUOffloadingManager(3, cache_policy=policy)
    for i in range(20):
        run_request(manager, [k(0), k(1 + i % 5), k(100 + i)], f"r{i}")
    assert manager.get_stats().hits > 0
    assert called == []


# -- which eviction method the manager asks ----------------------------------------------


class LoggedEvictLRU(LRUCachePolicy):
    """Wraps ``evict()`` alone, as a subclass that logs victims would."""

    def evict(self, n: int, protected: set[OffloadKey]) -> Any:
        return super().evict(n, protected)


class SplitAgainLRU(LoggedEvictLRU):
    """...and a subclass of that which implements ``evict_split`` again."""

    def evict_split(self, n: int, protected: set[OffloadKey]) -> Any:
        return super().evict_split(n, protected)


@pytest.mark.parametrize(
    ("policy_cls", "splits"),
    [
        (LRUCachePolicy, True),  # implements both: the lists are asked for
        (LoggedEvictLRU, False),  # its evict() override must keep being called
        (SplitAgainLRU, True),
        (CachePolicy, False),  # the default evict_split only splits evict()'s pairs
    ],
)
def test_the_manager_asks_evict_split_only_below_the_last_evict_override(
    policy_cls: type[CachePolicy], splits: bool
) -> None:
    assert splits_victims(policy_cls) is splits


PAIRS_ONLY = """
from kv_offload_arc import ARCCachePolicy
from kv_offload_lru import LRUCachePolicy, PrefixLRUCachePolicy


def pairs_only(base):
    class PairsOnly(base):  # an evict() override: the manager asks evict(), as for vLLM's
        def evict(self, n, protected):
            return super().evict(n, protected)

    return PairsOnly


PairsLRU = pairs_only(LRUCachePolicy)
PairsPrefixLRU = pairs_only(PrefixLRUCachePolicy)
PairsARC = pairs_only(ARCCachePolicy)
"""
PAIRS_CLASS = {"lru": "PairsLRU", "prefix-lru": "PairsPrefixLRU", "arc": "PairsARC"}


@pytest.mark.parametrize("policy", ["lru", "prefix-lru", "arc"])
def test_evict_and_evict_split_give_the_same_victims(
    policy: str, make_module: ModuleFactory
) -> None:
    """Two managers driven alike, one policy answering evict(), the other evict_split()."""
    module = make_module(PAIRS_ONLY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        pairs = CPUOffloadingManager(
            40,
            cache_policy=PAIRS_CLASS[policy],
            cache_policy_module_path=module,
            enable_events=True,
        )
    managers = [pairs, CPUOffloadingManager(40, cache_policy=policy, enable_events=True)]
    assert not splits_victims(type(managers[0].policy))
    assert splits_victims(type(managers[1].policy))
    for i in range(300):
        keys = [k(i * 7 % 97 + j) for j in range(i % 9 + 1)]
        hits = [run_request(m, keys, f"r{i}") for m in managers]
        events = [m.take_events() for m in managers]
        assert hits[0] == hits[1] and events[0] == events[1]
    stats = [m.get_stats() for m in managers]
    assert stats[0] == stats[1] and stats[0].evictions > 1000
