"""LRU policy (kv-offload-lru): exact LRU order, the evict() contract, bounded bookkeeping.

The policy keeps its order in the core's lazy-deletion key queue, so most tests check it
against the shipped reference LRU on one ``OrderedDict`` (``kv_offload_lru.reference``),
including with the queue rebuilding itself on every call.
"""

from __future__ import annotations

import random
import sys

import pytest
from _policy_harness import CTX, Blocks, k, match_reference
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.policies import key_queue
from kv_offload_lru import LRUCachePolicy
from kv_offload_lru.reference import ReferenceLRUCachePolicy


def filled(keys: list[int], blocks: Blocks) -> LRUCachePolicy:
    policy = LRUCachePolicy(max(len(keys), 1))
    policy.insert_many([k(i) for i in keys], [blocks.new(0) for _ in keys])
    return policy


def order(policy: LRUCachePolicy) -> list[OffloadKey]:
    """Resident keys, least recent first, read off the queue's live entries."""
    return policy.order


def check_invariants(policy: LRUCachePolicy) -> None:
    """Every resident key has exactly one live entry (its last); every other entry is stale."""
    queue = policy._queue
    assert len(queue) - len(policy) == sum(queue.stale.values())
    assert all(count > 0 for count in queue.stale.values())
    assert sorted(order(policy)) == sorted(policy._blocks)


def test_touch_makes_the_first_key_of_a_request_most_recent() -> None:
    policy = filled([1, 2, 3, 4], Blocks(10))
    policy.touch([k(2), k(1), k(9)], CTX)  # k9 is absent: ignored
    assert order(policy) == [k(3), k(4), k(1), k(2)]
    check_invariants(policy)


def test_evict_takes_the_least_recent_first() -> None:
    policy = filled([1, 2, 3, 4], Blocks(10))
    policy.touch([k(1)], CTX)
    victims = policy.evict(2, set())
    assert victims is not None and [key for key, _ in victims] == [k(2), k(3)]
    assert policy.get(k(2)) is None and order(policy) == [k(4), k(1)]
    check_invariants(policy)


def test_evict_skips_busy_and_protected_blocks_which_keep_their_place() -> None:
    blocks = Blocks(10)
    policy = LRUCachePolicy(5)
    keys = [k(i) for i in range(5)]
    statuses = [blocks.new(ref_cnt) for ref_cnt in (2, -1, 0, 0, 0)]  # pinned, pending, idle...
    policy.insert_many(keys, statuses)
    victims = policy.evict(2, {k(2)})
    assert victims == [(k(3), statuses[3]), (k(4), statuses[4])]
    assert order(policy) == [k(0), k(1), k(2)]
    check_invariants(policy)


def test_evict_is_all_or_nothing() -> None:
    blocks = Blocks(10)
    policy = LRUCachePolicy(4)
    policy.insert_many([k(0), k(1), k(2)], [blocks.new(1), blocks.new(0), blocks.new(0)])
    policy.touch([k(1)], CTX)  # a stale entry in front, dropped or kept: invisible
    before = order(policy)
    assert policy.evict(3, set()) is None
    assert policy.evict(2, {k(2)}) is None
    assert order(policy) == before and len(policy) == 3
    assert policy.evict(4, set()) is None  # more than resident
    check_invariants(policy)


def test_evict_zero_returns_an_empty_list() -> None:
    policy = filled([1], Blocks(4))
    assert policy.evict(0, set()) == []
    assert len(policy) == 1


def test_remove_then_reinsert_starts_a_fresh_entry() -> None:
    blocks = Blocks(10)
    policy = filled([1, 2, 3], blocks)
    policy.remove(k(1))
    policy.remove(k(7))  # absent: a no-op
    assert policy.get(k(1)) is None
    new = blocks.new(0)
    policy.insert(k(1), new)
    assert policy.get(k(1)) is new and order(policy) == [k(2), k(3), k(1)]
    victims = policy.evict(3, set())
    assert victims is not None and [key for key, _ in victims] == [k(2), k(3), k(1)]
    assert len(policy._queue) == 0 and not policy._queue.stale


def test_clear_forgets_everything() -> None:
    policy = filled([1, 2, 3], Blocks(10))
    policy.touch([k(1)], CTX)
    policy.clear()
    assert len(policy) == 0 and policy.get(k(1)) is None
    assert not len(policy._queue) and not policy._queue.stale


def test_a_hot_key_touched_forever_keeps_the_queue_bounded() -> None:
    policy = filled(list(range(100)), Blocks(200))
    for _ in range(20_000):
        policy.touch([k(7)], CTX)
    bound = len(policy) + len(policy) // 4 + key_queue.COMPACT_SLACK + 1
    assert len(policy._queue) <= bound
    assert order(policy)[-1] == k(7) and order(policy)[0] == k(0)
    check_invariants(policy)


# -- against a plain reference ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("compact_slack", [-sys.maxsize, 256])
def test_matches_the_reference_on_random_workloads(
    seed: int, compact_slack: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no slack at all the queue rebuilds itself on every call, which must be invisible.
    monkeypatch.setattr(key_queue, "COMPACT_SLACK", compact_slack)
    c = random.Random(seed).choice((3, 8, 25))
    policy = LRUCachePolicy(c)
    ref = ReferenceLRUCachePolicy(c)

    def same_state() -> None:
        assert order(policy) == list(ref.blocks)
        assert len(policy) == len(ref.blocks)
        check_invariants(policy)

    match_reference(policy, ref, c, seed, same_state)


# -- through the manager -----------------------------------------------------------------


def test_manager_resolves_lru_by_default() -> None:
    manager = CPUOffloadingManager(10)
    assert isinstance(manager.policy, LRUCachePolicy)


def test_bookkeeping_at_20000_blocks_stays_under_150_bytes_per_block() -> None:
    """Measured the way benchmarks/replay.py does, at one of its capacities; the figure moves
    with the capacity (benchmarks/memory.py), this guards the structure against regressions."""
    import gc
    import tracemalloc

    keys = [k(i) for i in range(60_000)]
    CPUOffloadingManager(16).shutdown()  # plugin discovery and imports are not bookkeeping
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        manager = CPUOffloadingManager(20_000)
        ctx = ReqContext(req_id="r")
        for start in range(0, len(keys), 16):  # three times the capacity: eviction churn
            batch = keys[start : start + 16]
            out = manager.prepare_store(batch, ctx)
            assert out is not None
            manager.complete_store(out.keys_to_store, ctx)
            manager.touch(keys[max(0, start - 4000) : start - 3990], ctx)
        gc.collect()
        per_block = (tracemalloc.get_traced_memory()[0] - before) / manager.num_resident_blocks
    finally:
        tracemalloc.stop()
    assert manager.num_resident_blocks == 20_000
    assert per_block <= 150, per_block
