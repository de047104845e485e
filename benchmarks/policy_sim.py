"""Fast offline simulator of the replay's access model, for policy research.

Per request: lookups in prefix order until the first miss, hits touched, the other blocks
stored (the request's own blocks protected), evicting as needed, a store that cannot fit
rejected whole. Keys are small ints and every policy is a plain-Python model with no slots,
pins or validation, so a variant runs on the bundled trace in about a second per capacity;
winners are then confirmed through the real manager (``benchmarks/reuse_policy.py``,
``kv-offload compare --bounds``). The models and their numbers are in
``plugins/reuse/README.md`` (the research log).

    python benchmarks/policy_sim.py [--trace PATH] [--keep-partial-blocks] [--policy NAME ...]
    python benchmarks/policy_sim.py --synthetic zipf|conversations|scan [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
CAPACITIES = [2000, 5000, 20000, 50000]

Trace = list[list[int]]


def load_trace(path: Path, block_tokens: int | None = 512) -> Trace:
    """``hash_ids`` per request; with ``block_tokens``, the partial last block left out."""
    trace = []
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            ids = record["hash_ids"]
            length = record.get("input_length")
            if block_tokens and isinstance(length, int):
                ids = ids[: length // block_tokens]
            trace.append(ids)
    return trace


# -- synthetic traces -------------------------------------------------------------------------


def synthetic_conversations(seed: int, n: int = 12000, think: float = 800.0) -> Trace:
    """Multi-turn chats over a few shared system prompts: each turn re-sends the whole
    conversation so far plus new blocks; the gap to a conversation's next turn is
    exponential with mean ``think`` requests, and a conversation ends with probability 0.4
    after each turn. One-shot requests with a shared prefix are mixed in."""
    rng = random.Random(seed)
    fresh = iter(range(10, 10**9))
    systems = [[next(fresh) for _ in range(rng.randint(1, 4))] for _ in range(6)]
    pending: list[tuple[float, list[int]]] = []  # (due request index, conversation so far)
    trace: Trace = []
    while len(trace) < n:
        now = len(trace)
        pending.sort(key=lambda item: item[0])
        if pending and pending[0][0] <= now:
            _, convo = pending.pop(0)
        else:
            convo = list(rng.choice(systems))
        convo = convo + [next(fresh) for _ in range(rng.randint(1, 12))]
        trace.append(list(convo))
        if rng.random() < 0.6:
            pending.append((now + rng.expovariate(1 / think), convo))
    return trace


def synthetic_zipf(seed: int, n: int = 12000, documents: int = 4000) -> Trace:
    """Prefix sharing by popularity: requests pick a document (Zipf 0.9) as a prefix of
    3-20 blocks, then add 1-6 unique blocks of question."""
    rng = random.Random(seed)
    fresh = iter(range(10**6, 10**9))
    docs = [[next(fresh) for _ in range(rng.randint(3, 20))] for _ in range(documents)]
    weights = [1 / (i + 1) ** 0.9 for i in range(documents)]
    picks = rng.choices(range(documents), weights, k=n)
    return [docs[d] + [next(fresh) for _ in range(rng.randint(1, 6))] for d in picks]


def synthetic_scan(seed: int, n: int = 12000) -> Trace:
    """A hot set of 30 prefixes (4-10 blocks, reused at short distance) under a heavy scan
    of one-time requests: the case where admitting everything hurts."""
    rng = random.Random(seed)
    fresh = iter(range(10**6, 10**9))
    hot = [[next(fresh) for _ in range(rng.randint(4, 10))] for _ in range(30)]
    trace = []
    for _ in range(n):
        if rng.random() < 0.3:
            trace.append([*rng.choice(hot), next(fresh)])
        else:
            trace.append([next(fresh) for _ in range(rng.randint(5, 40))])
    return trace


SYNTHETIC: dict[str, Callable[[int], Trace]] = {
    "conversations": synthetic_conversations,
    "conversations-slow": lambda seed: synthetic_conversations(seed, think=3000.0),
    "zipf": synthetic_zipf,
    "scan": synthetic_scan,
}


# -- the access model -------------------------------------------------------------------------


class SimPolicy:
    """A policy model: ``resident`` answers lookups; the rest is the policy's business."""

    name = "base"

    def __init__(self, capacity: int) -> None:
        self.c = capacity
        self.resident: dict[int, object] = {}

    def request(self, keys: list[int]) -> int:
        resident = self.resident
        hits = 0
        for key in keys:
            if key not in resident:
                break
            hits += 1
        self.accessed(keys, hits)
        if hits:
            self.touch(keys[:hits])
        rest = keys[hits:]
        to_store = [key for key in rest if key not in resident]
        if to_store:
            shortfall = len(resident) + len(to_store) - self.c
            if shortfall > 0 and not self.evict(shortfall, set(rest)):
                self.finished()
                return hits
            self.insert(to_store)
        self.finished()
        return hits

    # Hooks a model implements.
    def accessed(self, keys: list[int], hits: int) -> None:
        """Every key of the request, before anything changes (on_request_access)."""

    def touch(self, keys: list[int]) -> None:
        raise NotImplementedError

    def evict(self, n: int, protected: set[int]) -> bool:
        raise NotImplementedError

    def insert(self, keys: list[int]) -> None:
        raise NotImplementedError

    def finished(self) -> None:
        """The request ended (on_request_finished)."""


class LRU(SimPolicy):
    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.order: OrderedDict[int, None] = OrderedDict()

    def touch(self, keys: list[int]) -> None:
        for key in reversed(keys):
            self.order.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> bool:
        victims = []
        for key in self.order:
            if key not in protected:
                victims.append(key)
                if len(victims) == n:
                    break
        if len(victims) < n:
            return False
        for key in victims:
            del self.order[key]
            del self.resident[key]
        return True

    def insert(self, keys: list[int]) -> None:
        for key in keys:
            self.order[key] = None
            self.resident[key] = None


class ARC(SimPolicy):
    """The adapted ARC of kv-offload-arc, with switches for the variants in the log.

    * ``history``: keys requested by earlier requests, bounded at ``history`` x capacity; a
      stored key found there goes straight to T2 (it is a reuse, whatever the cache lost).
    * ``tail_first``: a request's new blocks enter T1 deepest first, so the deepest block of
      a prefix is evicted first (a shallower block's loss would make it useless anyway).
    * ``touch_tail``: resident blocks after the first miss were requested too: touch them.
    """

    name = "arc"

    def __init__(
        self,
        capacity: int,
        history: float = 0.0,
        tail_first: bool = False,
        touch_tail: bool = False,
        ghosts: float = 0.0,
        p0: float = 0.0,
    ) -> None:
        super().__init__(capacity)
        self.ghosts = int(ghosts * capacity)
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = p0 * capacity
        self.history_size = int(history * capacity)
        self.hist: OrderedDict[int, None] = OrderedDict()
        self.tail_first = tail_first
        self.touch_tail = touch_tail
        self.prior: set[int] = set()

    def accessed(self, keys: list[int], hits: int) -> None:
        if self.history_size:
            hist = self.hist
            self.prior = {key for key in keys[hits:] if key in hist}
            for key in keys:
                hist[key] = None
                hist.move_to_end(key)
            while len(hist) > self.history_size:
                hist.popitem(last=False)
        if self.touch_tail:
            late = [key for key in keys[hits:] if key in self.resident]
            if late:
                self.touch(late)

    def touch(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.t1:
                del self.t1[key]
                self.t2[key] = None

    def evict(self, n: int, protected: set[int]) -> bool:
        if len(self.resident) - sum(key in self.resident for key in protected) < n:
            return False
        size1 = len(self.t1)
        taken1: list[int] = []
        taken2: list[int] = []
        it1 = (key for key in self.t1 if key not in protected)
        it2 = (key for key in self.t2 if key not in protected)
        left2 = len(self.t2) - sum(key in self.t2 for key in protected)
        for _ in range(n):
            key = None
            if size1 > self.p or not left2:
                key = next(it1, None)
                if key is not None:
                    taken1.append(key)
                    size1 -= 1
            if key is None:
                key = next(it2, None)
                if key is None:
                    taken1.append(next(it1))
                    size1 -= 1
                else:
                    taken2.append(key)
                    left2 -= 1
        for key in taken1:
            del self.t1[key]
            self.b1[key] = None
            del self.resident[key]
        for key in taken2:
            del self.t2[key]
            self.b2[key] = None
            del self.resident[key]
        return True

    def insert(self, keys: list[int]) -> None:
        c = self.c
        order = reversed(keys) if self.tail_first else keys
        for key in order:
            if key in self.b1:
                self.p = min(c, self.p + max(1.0, len(self.b2) / len(self.b1)))
                del self.b1[key]
                self.t2[key] = None
            elif key in self.b2:
                self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
                del self.b2[key]
                self.t2[key] = None
            elif key in self.prior:
                self.t2[key] = None
            else:
                self.t1[key] = None
            self.resident[key] = None
            if self.ghosts:  # each ghost list bounded on its own
                while len(self.b1) > self.ghosts:
                    self.b1.popitem(last=False)
                while len(self.b2) > self.ghosts:
                    self.b2.popitem(last=False)
                continue
            while len(self.t1) + len(self.b1) > c and self.b1:
                self.b1.popitem(last=False)
            while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c:
                (self.b2 or self.b1).popitem(last=False)


VARIANTS: dict[str, Callable[[int], SimPolicy]] = {
    "lru": LRU,
    "arc": ARC,
    "arc+history": lambda c: ARC(c, history=8),
    "arc+history+tail": lambda c: ARC(c, history=8, tail_first=True),
    "arc+history+tail+touch": lambda c: ARC(c, history=8, tail_first=True, touch_tail=True),
    "arc+history+ghosts1": lambda c: ARC(c, history=8, ghosts=1),
    "arc+history+ghosts4": lambda c: ARC(c, history=8, ghosts=4),
    "arc+history+p0=c/2": lambda c: ARC(c, history=8, p0=0.5),
    "arc+history4": lambda c: ARC(c, history=4),
    "arc+history16": lambda c: ARC(c, history=16),
}


def run(trace: Trace, make: Callable[[int], SimPolicy], capacity: int) -> tuple[float, float]:
    """(hit ratio, blocks/s) of one model at one capacity."""
    policy = make(capacity)
    start = time.perf_counter()
    hits = sum(map(policy.request, trace))
    seconds = time.perf_counter() - start
    blocks = sum(map(len, trace))
    return hits / blocks, blocks / seconds


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from kv_offload.bounds import belady, gap_share

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--synthetic", choices=sorted(SYNTHETIC))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep-partial-blocks", action="store_true")
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--policy", action="append", help=f"one of {sorted(VARIANTS)}")
    args = parser.parse_args(argv)
    if args.synthetic:
        trace = SYNTHETIC[args.synthetic](args.seed)
        label = f"synthetic {args.synthetic} seed {args.seed}"
    else:
        trace = load_trace(args.trace, None if args.keep_partial_blocks else 512)
        label = args.trace.name + (" (all blocks)" if args.keep_partial_blocks else "")
    capacities = args.capacity or CAPACITIES
    names = args.policy or list(VARIANTS)
    print(f"{label}: {len(trace)} requests, {sum(map(len, trace))} blocks")
    bound = {c: belady(trace, c).hit_ratio for c in capacities}
    lru = {c: run(trace, LRU, c)[0] for c in capacities}
    print(f"{'policy':<28}" + "".join(f"{c:>9}" for c in capacities) + "   gap5k  gap20k  blk/s")
    print(f"{'belady':<28}" + "".join(f"{bound[c]:>9.4f}" for c in capacities))
    for name in names:
        results = {c: run(trace, VARIANTS[name], c) for c in capacities}
        gaps = [gap_share(results[c][0], lru[c], bound[c]) for c in (5000, 20000) if c in bound]
        shown = "".join(f"{g:>8.1%}" if g is not None else "       -" for g in gaps)
        speed = min(r[1] for r in results.values())
        print(
            f"{name:<28}"
            + "".join(f"{results[c][0]:>9.4f}" for c in capacities)
            + f"{shown} {speed:>7,.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
