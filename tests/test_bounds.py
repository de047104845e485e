"""Reference hit ratios (kv_offload.bounds) against brute force on small random traces.

The brute-force Belady finds each victim by scanning every resident block and each block's
next use by scanning the rest of the trace: quadratic, and obviously the rule it states.
"""

from __future__ import annotations

import random

import pytest
from kv_offload import CPUOffloadingManager, ReqContext, make_offload_key
from kv_offload.bounds import belady, gap_share, infinite
from kv_offload.errors import ConfigError
from kv_offload.replay import replay


def brute_belady(requests: list[list[int]], capacity: int) -> int:
    flat = [(r, key) for r, keys in enumerate(requests) for key in keys]

    def next_use(key: int, after: int) -> int:
        for pos in range(after + 1, len(flat)):
            if flat[pos][1] == key:
                return pos
        return len(flat) + 10**6  # never again: any such key is as good a victim

    resident: dict[int, int] = {}  # key -> position of its latest occurrence
    hits = 0
    pos = 0
    for keys in requests:
        start = pos
        n = 0
        while n < len(keys) and keys[n] in resident:
            n += 1
        hits += n
        for i, key in enumerate(keys):
            if key in resident:
                resident[key] = start + i
        to_store = [
            (start + i, key) for i, key in enumerate(keys) if i >= n and key not in resident
        ]
        protected = set(keys[n:])
        shortfall = len(resident) + len(to_store) - capacity
        candidates = [key for key in resident if key not in protected]
        if shortfall <= len(candidates):
            for _ in range(max(0, shortfall)):
                victim = max(candidates, key=lambda key: next_use(key, resident[key]))
                candidates.remove(victim)
                del resident[victim]
            for p, key in to_store:
                resident[key] = p
        pos += len(keys)
    return hits


def brute_infinite(requests: list[list[int]]) -> int:
    seen: set[int] = set()
    hits = 0
    for keys in requests:
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        hits += n
        seen.update(keys)
    return hits


def random_trace(rng: random.Random, n: int, universe: int) -> list[list[int]]:
    """Requests that share prefixes (a small tree of prompts) plus unique tails."""
    roots = [[rng.randrange(universe) for _ in range(rng.randrange(1, 4))] for _ in range(5)]
    fresh = iter(range(universe, 10**9))
    trace = []
    for _ in range(n):
        prefix = list(rng.choice(roots))[: rng.randrange(0, 4)]
        mid = [rng.randrange(universe) for _ in range(rng.randrange(0, 4))]
        tail = [next(fresh) for _ in range(rng.randrange(0, 3))]
        trace.append(list(dict.fromkeys(prefix + mid + tail)))
    return trace


@pytest.mark.parametrize("seed", range(30))
def test_belady_and_infinite_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, rng.randrange(20, 120), rng.choice((6, 15, 40)))
    for capacity in (1, 2, 3, 5, 8, 20):
        result = belady(trace, capacity)
        assert result.hit_blocks == brute_belady(trace, capacity), capacity
        assert result.blocks == sum(map(len, trace))
    assert infinite(trace).hit_blocks == brute_infinite(trace)


def test_belady_is_bounded_by_infinite_and_beats_lru_through_the_manager() -> None:
    rng = random.Random(99)
    trace = random_trace(rng, 400, 60)
    keys = [[make_offload_key(key) for key in request] for request in trace]
    inf = infinite(keys).hit_ratio
    for capacity in (4, 10, 30):
        manager = CPUOffloadingManager(capacity, cache_policy="lru")
        lru = replay(manager, [(ReqContext(f"r{i}"), ks) for i, ks in enumerate(keys)])
        opt = belady(keys, capacity).hit_ratio
        assert lru.hit_ratio <= opt <= inf
    assert belady(keys, 10**6).hit_ratio == inf


def test_a_request_larger_than_the_cache_is_rejected_whole() -> None:
    # [1, 2, 3] cannot fit in 2 blocks: nothing stored, so the repeat is a miss too.
    assert belady([[1, 2, 3], [1, 2, 3]], 2).hit_blocks == 0
    assert belady([[1, 2], [1, 2]], 2).hit_blocks == 2


def test_belady_keeps_the_block_needed_soonest() -> None:
    # After [1], [2], the store of 3 must evict one: 1 is needed next, 2 never again.
    result = belady([[1], [2], [3], [1]], 2)
    assert result.hit_blocks == 1 and result.evictions == 1


def test_bad_capacity_is_a_config_error() -> None:
    for capacity in (0, -3, True, 2.5):
        with pytest.raises(ConfigError, match="capacity must be a positive int"):
            belady([[1]], capacity)  # type: ignore[arg-type]


def test_gap_share() -> None:
    assert gap_share(0.2, 0.1, 0.3) == pytest.approx(0.5)
    assert gap_share(0.1, 0.1, 0.3) == 0.0
    assert gap_share(0.3, 0.3, 0.3) is None
