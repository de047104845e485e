"""The lazy-deletion key queue shared by LRU and ARC, against a plain list of live keys."""

from __future__ import annotations

import random
import sys

import pytest
from kv_offload.policies import key_queue
from kv_offload.policies.key_queue import KeyQueue


def check(queue: KeyQueue[int], live: list[int]) -> None:
    assert list(queue) == live
    assert len(queue) - len(live) == sum(queue.stale.values())
    assert all(count > 0 for count in queue.stale.values())


def test_peek_front_changes_no_key_and_drops_the_tombstones_it_passes() -> None:
    live = {1, 2, 3, 4}
    queue: KeyQueue[int] = KeyQueue(live)
    queue.extend([1, 2, 3, 4])
    queue.requeue([1])  # 1's first entry is now a tombstone
    live.discard(3)
    queue.forget(3)
    before = list(queue)
    assert queue.peek_front(2) == [2, 4]  # passed the tombstones of 1 and 3
    assert list(queue) == before == [2, 4, 1]  # the live keys, in the same order
    assert queue.stale == {}  # ... and the tombstones it passed are gone for good
    assert len(queue) == 3
    queue.drop_front(2)
    check(queue, [1])


def test_pop_front_without_tombstones_is_plain() -> None:
    queue: KeyQueue[int] = KeyQueue(set(range(5)))
    queue.extend(range(5))
    assert queue.peek_front(3) == [0, 1, 2]
    assert queue.pop_front(3) == [0, 1, 2]
    check(queue, [3, 4])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slack", [-sys.maxsize, 256])
@pytest.mark.parametrize("cut_slack", [0, 1024])
def test_random_operations_match_a_list(
    seed: int, slack: int, cut_slack: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_queue, "COMPACT_SLACK", slack)
    monkeypatch.setattr(key_queue, "_CUT_SLACK", cut_slack)  # 0: the taken prefix is cut often
    rng = random.Random(seed)
    live: list[int] = []
    members: set[int] = set()
    queue: KeyQueue[int] = KeyQueue(members)
    fresh = iter(range(10**6))
    for _ in range(2000):
        op = rng.random()
        if op < 0.35 or not live:
            new = [next(fresh) for _ in range(rng.randrange(1, 4))]
            members.update(new)
            queue.extend(new)
            live += new
        elif op < 0.6:
            keys = rng.sample(live, min(len(live), rng.randrange(1, 4)))
            queue.requeue(keys)
            live = [key for key in live if key not in keys] + keys
        elif op < 0.75:
            keys = rng.sample(live, min(len(live), rng.randrange(1, 3)))
            members.difference_update(keys)
            queue.forget_many(keys)
            live = [key for key in live if key not in keys]
        elif op < 0.85:
            n = rng.randrange(1, len(live) + 1)
            members.difference_update(live[:n])
            assert queue.pop_front(n) == live[:n]
            live = live[n:]
        else:  # a peek that is not followed by its drop (an eviction whose check failed)
            n = rng.randrange(1, len(live) + 1)
            assert queue.peek_front(n) == live[:n]
        check(queue, live)
