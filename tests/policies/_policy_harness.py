"""Helpers for tests that drive a policy directly, the way the manager does, and hold it to
its reference implementation (``kv_offload_lru.reference``, ``kv_offload_arc.reference``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from kv_offload import CPUOffloadingManager, LookupResult, OffloadKey, ReqContext, make_offload_key
from kv_offload.block_status import PENDING_REF_CNT, BlockStatus, bind_block_status
from kv_offload.policies import CachePolicy

CTX = ReqContext(req_id="test")
P = TypeVar("P", bound=CachePolicy)


def k(i: int) -> OffloadKey:
    return make_offload_key(i)


class Blocks:
    """A ref-count table plus its BlockStatus class; ``new`` hands out the next slot."""

    def __init__(self, size: int) -> None:
        self.refs = [PENDING_REF_CNT] * size
        self.cls = bind_block_status(self.refs)
        self.next = 0

    def new(self, ref_cnt: int = PENDING_REF_CNT) -> BlockStatus:
        """A new block, pending (as freshly allocated) unless told otherwise."""
        block = self.cls(self.next)
        self.refs[block] = ref_cnt
        self.next += 1
        return block


class PolicyHarness(Generic[P]):
    """Drives a policy like the manager does: evict when full, insert, mark stored idle."""

    def __init__(self, policy: P, capacity: int, slots: int = 100_000) -> None:
        self.capacity = capacity
        self.policy = policy
        self.blocks = Blocks(slots)

    def store(self, keys: Iterable[OffloadKey]) -> None:
        """Store the keys that are not resident, evicting as needed; assert it succeeds."""
        policy = self.policy
        to_store = [key for key in keys if policy.get(key) is None]
        shortfall = len(policy) + len(to_store) - self.capacity  # type: ignore[arg-type]
        if shortfall > 0:
            assert policy.evict(shortfall, set(to_store)) is not None
        blocks = [self.blocks.new() for _ in to_store]
        policy.insert_many(to_store, blocks)
        for block in blocks:
            self.blocks.refs[block] = 0

    def set_ref(self, key: OffloadKey, ref_cnt: int) -> None:
        """Pin (n > 0), mark pending (-1) or release (0) a resident block."""
        self.blocks.refs[self.block(key)] = ref_cnt

    def ref(self, key: OffloadKey) -> int:
        return self.blocks.refs[self.block(key)]

    def block(self, key: OffloadKey) -> BlockStatus:
        block = self.policy.get(key)
        assert block is not None
        return block


def match_reference(
    policy: CachePolicy,
    ref: CachePolicy,
    capacity: int,
    seed: int,
    same_state: Callable[[], None],
    steps: int = 3000,
) -> None:
    """Random stores, touches, evictions, pins, removals and clears on both, each call as the
    manager makes it (stored keys distinct and absent); after every step the victims, the
    blocks ``get`` returns and ``same_state()`` must agree."""
    rng = random.Random(seed)
    blocks = Blocks(100_000)
    universe = rng.choice((2 * capacity, 5 * capacity))
    for _ in range(steps):
        op = rng.random()
        keys = list(dict.fromkeys(k(rng.randrange(universe)) for _ in range(rng.randrange(1, 6))))
        if op < 0.42:
            to_store = [key for key in keys if policy.get(key) is None]
            shortfall = len(policy) + len(to_store) - capacity  # type: ignore[arg-type]
            if shortfall > 0:
                victims = policy.evict(shortfall, set(keys))
                assert victims == ref.evict(shortfall, set(keys))
                if victims is None:
                    continue
            new = [blocks.new(rng.choice((0, 0, 0, 0, PENDING_REF_CNT))) for _ in to_store]
            policy.insert_many(to_store, new)
            insert_many = getattr(ref, "insert_many", None)  # a reference that needs the batch
            if insert_many is not None:
                insert_many(to_store, new)
            else:
                for key, block in zip(to_store, new):
                    ref.insert(key, block)
        elif op < 0.72:
            policy.touch(keys, CTX)
            ref.touch(keys, CTX)
        elif op < 0.82:
            n = rng.randrange(1, 4)
            assert policy.evict(n, set(keys)) == ref.evict(n, set(keys))
        elif op < 0.9:
            for key in keys:
                resident = policy.get(key)
                if resident is not None:
                    blocks.refs[resident] = rng.choice((PENDING_REF_CNT, 0, 0, 2))
        elif op < 0.99:
            for key in keys:
                policy.remove(key)
                ref.remove(key)
        else:
            policy.clear()
            ref.clear()
        for key in keys:
            assert policy.get(key) is ref.get(key)
        same_state()


def run_request(manager: CPUOffloadingManager, keys: list[OffloadKey], req_id: str = "r") -> int:
    """The replay flow of one request through a manager; returns the number of prefix hits."""
    ctx = ReqContext(req_id=req_id)
    manager.on_new_request(ctx)
    hits = 0
    for key in keys:
        if manager.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], ctx)
        manager.complete_load(keys[:hits], ctx)
        manager.touch(keys[:hits], ctx)
    if hits < len(keys):
        out = manager.prepare_store(keys[hits:], ctx)
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    return hits
