"""The store-admission decision hook: what it sees, what it decides, and what a bad answer
does."""

from __future__ import annotations

from collections import Counter

import pytest
from _hook_helpers import (
    HIT,
    MISS,
    PENDING,
    k,
    ks,
    make_tiered,
    num,
    store,
)
from _hook_plugins import SeenTwiceAdmission
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.errors import HookError
from kv_offload.plugins import KVOffloadPluginManager, hookimpl
from kv_offload.replay import replay

# -- store admission --------------------------------------------------------------------------


def test_seen_twice_admission_stores_a_block_the_second_time_it_is_offered(
    pm: KVOffloadPluginManager,
) -> None:
    pm.register(SeenTwiceAdmission(), name="seen-twice")
    m = CPUOffloadingManager(8, plugin_manager=pm)
    ctx = ReqContext("r")
    first = m.prepare_store(ks(1, 2), ctx)
    assert first is not None and first.keys_to_store == []
    assert m.num_free_blocks == 8 and [m.lookup(key, ctx) for key in ks(1, 2)] == [MISS] * 2
    second = m.prepare_store(ks(0, 1, 2, 3), ctx)
    assert second is not None and second.keys_to_store == ks(1, 2)  # caller's order
    m.complete_store(second.keys_to_store, ctx)
    assert store(m, ctx, 0, 1, 2, 3) == ks(0, 3)  # 1, 2 are stored: not offered again
    assert m.get_stats().stored_blocks == 4


def test_seen_twice_admission_in_a_replay(pm: KVOffloadPluginManager) -> None:
    plugin = SeenTwiceAdmission()
    pm.register(plugin)
    offered: Counter[OffloadKey] = Counter()

    class Spy:
        @hookimpl(tryfirst=True)
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> None:
            offered.update(keys)

    pm.register(Spy())
    stored: list[OffloadKey] = []

    class StoredLog:
        @hookimpl
        def kv_offload_blocks_stored(self, keys: list[OffloadKey]) -> None:
            stored.extend(keys)

    pm.register(StoredLog())
    # Three requests share a prefix; each repeats one earlier suffix block.
    requests = [
        (ReqContext("r1"), ks(0, 1, 2)),
        (ReqContext("r2"), ks(0, 1, 3)),
        (ReqContext("r3"), ks(0, 1, 2, 3)),
    ]
    result = replay(CPUOffloadingManager(16, plugin_manager=pm), requests)
    # r1 offers 0 1 2 (first time each); r2 misses 0 (never stored), offers 0 1 3 and gets
    # 0 1 in; r3 hits 0 1 and offers 2 3, each for the second time.
    assert [num(key) for key in stored] == [0, 1, 2, 3]
    assert all(offered[key] == 2 for key in stored)
    assert result.hit_blocks == 2
    assert result.stored_blocks == 4


def test_admission_keeps_the_callers_order_and_ignores_foreign_keys(
    pm: KVOffloadPluginManager,
) -> None:
    class Picky:
        @hookimpl
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey]:
            return [k(99), *reversed(keys[1:])]

    pm.register(Picky())
    m = CPUOffloadingManager(8, plugin_manager=pm)
    out = m.prepare_store(ks(1, 2, 3), ReqContext("r"))
    assert out is not None and out.keys_to_store == ks(2, 3)
    assert m.ref_count(k(99)) is None


def test_admission_first_answer_wins_latest_registered_first(
    pm: KVOffloadPluginManager,
) -> None:
    class Answer:
        def __init__(self, answer: list[int] | None) -> None:
            self.answer = answer
            self.asked = 0

        @hookimpl
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey] | None:
            self.asked += 1
            return None if self.answer is None else [key for key in keys if num(key) in self.answer]

    first, second, abstain = Answer([1]), Answer([2]), Answer(None)
    for plugin in (first, second, abstain):
        pm.register(plugin)
    m = CPUOffloadingManager(8, plugin_manager=pm)
    out = m.prepare_store(ks(1, 2, 3), ReqContext("r"))
    assert out is not None and out.keys_to_store == ks(2)
    assert (abstain.asked, second.asked, first.asked) == (1, 1, 0)


def test_admission_can_refuse_a_promotion(pm: KVOffloadPluginManager) -> None:
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)  # 1 and 2 now live only in the tier
    m.on_schedule_end()
    pm.register(SeenTwiceAdmission())
    assert m.lookup(k(1), ctx) is MISS  # offered once: refused, nothing evicted
    assert m.get_stats().tiers[0].refused_promotions == 1
    assert m.lookup(k(3), ctx) is HIT
    assert m.lookup(k(1), ctx) is PENDING  # offered twice
    m.on_schedule_end()
    assert m.lookup(k(1), ctx) is HIT


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (3, "int 3"),
        # Issue 37 #11: a str is iterable, and taken as keys it rejected every key silently.
        ("yes", "str 'yes'"),
        (b"yes", "bytes b'yes'"),
        ([1, 2], "list [1, 2]"),
        ({"k": True}, "dict {'k': True}"),
    ],
    ids=["int", "str", "bytes", "list-of-ints", "dict"],
)
@pytest.mark.parametrize("stack", ["cpu", "tiered"])
def test_admission_returning_garbage_is_a_hook_error_without_effect(
    pm: KVOffloadPluginManager, stack: str, answer: object, shown: str
) -> None:
    class Garbage:
        @hookimpl
        def kv_offload_store_admission(self) -> object:
            return answer

    pm.register(Garbage(), name="garbage")
    m = CPUOffloadingManager(8, plugin_manager=pm) if stack == "cpu" else make_tiered(pm)
    before = m.get_stats()
    with pytest.raises(HookError, match="hook plugin 'garbage' broke the") as info:
        m.prepare_store(ks(1), ReqContext("r"))
    assert info.value.plugin == "garbage"
    assert f"kv_offload_store_admission contract: it returned {shown}" in str(info.value)
    assert m.get_stats() == before
