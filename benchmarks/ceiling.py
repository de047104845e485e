"""How fast can a pure-Python manager go? The ceiling next to the floor and the real manager.

``benchmarks/replay.py`` compares the manager with a bare ``OrderedDict`` LRU, which skips
everything a manager must do (slots, pins, pending stores, validation). This benchmark adds a
third row: the fastest manager with the same contract that we could write in pure Python,
with every layer that costs time but is not part of the contract taken out: one class with
the LRU inlined (no policy plugin boundary, no ``BlockStatus`` objects), slot ids as plain
ints, no numpy spec, no hooks, no events, no stats. It still checks what the real manager
checks (a bad context, repeated keys, pending and pinned blocks, protected eviction, all or
nothing) and gives the same hit ratio. Whatever it reaches bounds what the plugin-based
manager can reach on this interpreter and machine; the three are replayed through the same
``kv_offload.replay.replay`` loop in one run.

    python benchmarks/ceiling.py [--capacity 5000 --capacity 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kv_offload import CPUOffloadingManager, LookupResult, OffloadKey, ReqContext
from kv_offload.replay import replay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import DEFAULT_TRACE, Requests, best_time, load, replay_bare_lru

_HIT, _MISS, _PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING


class _StoreOutput:
    __slots__ = ("block_ids", "evicted_keys", "keys_to_store")

    def __init__(self, keys: list[OffloadKey], block_ids: list[int], evicted: list[Any]) -> None:
        self.keys_to_store = keys
        self.block_ids = block_ids
        self.evicted_keys = evicted


class MinimalManager:
    """The manager's contract for the replay flow, with nothing else (see module docstring)."""

    kv_buffer = None

    def __init__(self, num_blocks: int) -> None:
        self._lru: OrderedDict[OffloadKey, int] = OrderedDict()
        self._refs = [-1] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._evictable = 0

    @staticmethod
    def _check(keys: list[OffloadKey], ctx: ReqContext) -> None:
        if ctx.req_id is None:
            raise ValueError("req_context needs a req_id")
        if len(set(keys)) != len(keys):
            raise ValueError("a key appears more than once")

    def on_new_request(self, ctx: ReqContext) -> None:
        if ctx.req_id is None:
            raise ValueError("req_context needs a req_id")

    on_request_finished = on_new_request

    def on_schedule_end(self) -> None:
        pass

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        slot = self._lru.get(key)
        if slot is None:
            return _MISS
        return _PENDING if self._refs[slot] < 0 else _HIT

    def prepare_load(self, keys: list[OffloadKey], ctx: ReqContext) -> list[int]:
        self._check(keys, ctx)
        lru, refs = self._lru, self._refs
        slots = [lru[key] for key in keys]
        if min(refs[slot] for slot in slots) < 0:
            raise ValueError("a key is pending")
        for slot in slots:
            if not refs[slot]:
                self._evictable -= 1
            refs[slot] += 1
        return slots

    def complete_load(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        self._check(keys, ctx)
        lru, refs = self._lru, self._refs
        slots = [lru[key] for key in keys]
        if min(refs[slot] for slot in slots) <= 0:
            raise ValueError("a key is not pinned")
        for slot in slots:
            refs[slot] -= 1
            if not refs[slot]:
                self._evictable += 1

    def touch(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        self._check(keys, ctx)
        move_to_end = self._lru.move_to_end
        for key in reversed(keys):
            move_to_end(key)

    def prepare_store(self, keys: list[OffloadKey], ctx: ReqContext) -> _StoreOutput | None:
        self._check(keys, ctx)
        lru, refs, free = self._lru, self._refs, self._free
        to_store = [key for key in keys if key not in lru]
        shortfall = len(to_store) - len(free)
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            if shortfall > self._evictable:
                return None
            protected = set(keys)
            for key, slot in lru.items():
                if not refs[slot] and key not in protected:
                    evicted.append(key)
                    if len(evicted) == shortfall:
                        break
            else:
                return None
            for key in evicted:
                free.append(lru.pop(key))
            self._evictable -= shortfall
        slots = free[len(free) - len(to_store) :]
        del free[len(free) - len(to_store) :]
        for key, slot in zip(to_store, slots):
            refs[slot] = -1
            lru[key] = slot
        return _StoreOutput(to_store, slots, evicted)

    def complete_store(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        self._check(keys, ctx)
        lru, refs = self._lru, self._refs
        slots = [lru[key] for key in keys]
        if any(refs[slot] != -1 for slot in slots):
            raise ValueError("a key was not prepared for storing")
        for slot in slots:
            refs[slot] = 0
        self._evictable += len(slots)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    requests: Requests = load(args.trace)
    print(f"{'capacity':>8}  {'stack':<34} {'hit ratio':>9} {'blocks/s':>12} {'x floor':>8}")
    for capacity in args.capacity or [5000, 20000]:
        floor_t, (floor_hits, total) = best_time(
            lambda: replay_bare_lru(capacity, requests),  # noqa: B023 - called at once
            args.repeat,
        )
        rows = [("bare OrderedDict LRU (floor)", floor_t, floor_hits)]
        for name, make in (
            ("minimal pure-Python manager", MinimalManager),
            ("CPUOffloadingManager[lru]", CPUOffloadingManager),
        ):
            t, (hits, _) = best_time(
                lambda: _hits(replay(make(capacity), requests)),  # type: ignore[arg-type]  # noqa: B023
                args.repeat,
            )
            rows.append((name, t, hits))
        for name, t, hits in rows:
            print(
                f"{capacity:>8}  {name:<34} {hits / total:>9.4f} {total / t:>12,.0f} "
                f"{floor_t / t:>8.2f}"
            )
    return 0


def _hits(result: Any) -> tuple[int, int]:
    return result.hit_blocks, result.blocks


if __name__ == "__main__":
    raise SystemExit(main())
