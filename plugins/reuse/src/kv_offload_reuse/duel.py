"""Miniature caches that decide how the policy splits the cache.

ARC moves ``p`` one ghost hit at a time, towards whichever list lost a block most recently.
On prefix traces that local rule settles between regimes that are each far better in their
place: with a small cache, keeping the reused blocks (T2) and cycling first sightings through
T1 as fast as possible (``p = 0``, "frequency") wins by a wide margin, because first reuses
come back long after T1 could have held them and the memory sends them to T2 anyway; with a
large cache the adaptive split wins, because T1 can then hold first sightings until their
first reuse; and where every session comes back many times (long agent sessions), the long
memory sends nearly every block to T2, which then thrashes as one LRU list: there ARC's own
rule (only its ghosts are reuses, "ghosts") keeps T2 a protected set. Where reuse is mostly
recent, plain recency wins; that case is the safety net's (:mod:`kv_offload_reuse.safety`,
an exact LRU), not a miniature's. Which regime applies depends on the trace
and the capacity, so it is measured (set dueling, as in adaptive CPU cache insertion;
miniature simulation as in SHARDS): one small copy of the policy per mode replays the
requests restricted to a hash-sampled 1/R of the keys at 1/R of the capacity, and the cache
follows the one with the most hits, scored over the same horizon as the memory (WINDOW
capacities of stored blocks). Sampling by key keeps each sampled key's full history, so a
miniature cache sees the reuse distances of the real one, scaled by R.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import and_, not_, rshift

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, bind_block_status
from xxhash import xxh3_64_intdigest as stable_hash

__all__ = ["Miniature", "sample_rate"]

#: Blocks a miniature cache holds at least, where the capacity allows.
MINIATURE_BLOCKS = 512
#: Never sample more than one key in this many (the miniatures' cost and memory).
MIN_RATE = 32


def sample_rate(capacity: int) -> int:
    """R, a power of two: at least :data:`MIN_RATE`, and capacity / R near
    :data:`MINIATURE_BLOCKS` for large caches."""
    rate = MIN_RATE
    while capacity // (2 * rate) >= MINIATURE_BLOCKS:
        rate *= 2
    return rate


def sampled(keys: list[OffloadKey], rate: int) -> list[OffloadKey]:
    """The keys whose hash falls in the sample (bits the history table does not use); the
    hash of the key's bytes, the same in every process, so the sample is too."""
    bits = map(and_, map(rshift, map(stable_hash, keys), repeat(40)), repeat(rate - 1))
    return list(compress(keys, map(not_, bits)))


class Miniature:
    """One small copy of the policy with its own slots, driven by a request's sampled keys
    the way the manager drives the real one; ``score`` is its decayed hit count."""

    def __init__(self, policy: CachePolicy, capacity: int, horizon: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.refs = [0] * capacity
        status = bind_block_status(self.refs)
        self.free: list[BlockStatus] = [status(i) for i in range(capacity)]
        self.refs[:] = [0] * capacity  # BlockStatus() marks a slot pending: all idle here
        self.horizon = horizon
        self.score = 0.0

    def request(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        policy = self.policy
        get: Callable[[OffloadKey], BlockStatus | None] = policy.get
        hits = 0
        for key in keys:
            if get(key) is None:
                break
            hits += 1
        if hits:
            policy.touch(keys[:hits], ctx)
        rest = keys[hits:]
        stored = 0
        if rest:
            policy.on_request_access(rest, ctx)
            to_store = [key for key in rest if get(key) is None]
            shortfall = len(to_store) - len(self.free)
            if shortfall > 0:
                victims = policy.evict(shortfall, set(rest))
                if victims is None:
                    to_store = []
                else:
                    self.free += [block for _, block in victims]
            if to_store:
                blocks = self.free[-len(to_store) :]
                del self.free[-len(to_store) :]
                policy.insert_many(to_store, blocks)
                stored = len(to_store)
        self.score = self.score * max(0.0, 1.0 - stored / self.horizon) + hits
