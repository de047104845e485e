"""Seeded random request flows, driven into several managers at once as vLLM's scheduler drives
its manager, with every answer compared after every step.

The flow: requests over shared prefix chains (a few popular roots, a private tail), each block
one key per KV group, arrive, look their keys up in prefix order to the first non-HIT and
``prepare_load`` the hits; their loads complete a few steps later; their blocks are offered
to ``prepare_store`` in chunks (in prefix order, sometimes a chunk backwards as a
sliding-window backfill sends it, sometimes again: resident blocks and blocks still being
stored come back); stores complete a few steps later, now and then unsuccessfully; requests
finish while their stores may still be in flight; ``touch``, ``reset_cache`` and the end of a
scheduler step (``on_schedule_end``, ``take_events``) come at random.

Positions (``mode``): ``"none"``, no key positions; ``"all"``, every key gets its end token
(``(block + 1) * 16``) before the request first uses it, as vLLM's scheduler records them;
``"partial"``, each key has one with probability 0.8 (a request whose keys are not all
positioned keeps its call order).

A :class:`Side` wraps one manager (kv-offload's or vLLM's) behind the few calls the driver
needs, so the driver itself never looks at a manager's class. The first side's answers steer
the flow (which loads and stores are in flight); every other side must give the same ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv_offload import OffloadKey, make_offload_key

__all__ = ["FlowReport", "Side", "kv_offload_side", "run_flow"]

TOKENS_PER_BLOCK = 16


@dataclass
class Side:
    """One manager and how to read it.

    ``make_context(req_id)``: a fresh request context of the manager's kind;
    ``answer(result)``: a lookup answer as ``"hit"``, ``"miss"`` or ``"pending"``;
    ``events()``: the events taken since the last call as ``(keys, removed, metadata_only)``;
    ``counters()``: comparable occupancy counters (resident, pending, evictable blocks ...);
    ``step_end()``: the end of a scheduler step.
    """

    name: str
    manager: Any
    make_context: Callable[[str], Any]
    answer: Callable[[Any], str]
    events: Callable[[], list[tuple[tuple[OffloadKey, ...], bool, bool]]]
    counters: Callable[[], tuple[int, ...]]
    step_end: Callable[[], None]


@dataclass
class FlowReport:
    steps: int = 0
    lookups: int = 0
    hits: int = 0
    stores: int = 0
    stored_blocks: int = 0
    rejected_stores: int = 0
    evicted_blocks: int = 0
    failed_stores: int = 0
    finished: int = 0
    resets: int = 0
    events: int = 0


@dataclass
class _Request:
    req_id: str
    keys: list[OffloadKey]
    blocks: list[int]  # block index of each key (its position is (index + 1) * 16)
    contexts: list[Any]
    offered: int = 0  # keys[:offered] went to prepare_store at least once
    finished: bool = False


@dataclass
class _Job:
    request: _Request
    keys: list[OffloadKey]
    generation: int


@dataclass
class _State:
    requests: list[_Request] = field(default_factory=list)
    loads: list[_Job] = field(default_factory=list)
    stores: list[_Job] = field(default_factory=list)
    generation: int = 0
    next_id: int = 0


def _universe(rng: random.Random, groups: int) -> tuple[list[list[int]], int]:
    """Prefix chains of block hashes: a few roots of random depth; hashes are small ints."""
    roots = [[r * 1000 + i for i in range(rng.randrange(2, 9))] for r in range(rng.randrange(2, 6))]
    return roots, groups


def _keys_of(hashes: list[int], groups: int) -> tuple[list[OffloadKey], list[int]]:
    keys, blocks = [], []
    for index, block_hash in enumerate(hashes):
        for group in range(groups):
            keys.append(make_offload_key(block_hash, group))
            blocks.append(index)
    return keys, blocks


def _same(label: str, step: int, answers: list[Any], sides: list[Side]) -> None:
    first = answers[0]
    for side, other in zip(sides[1:], answers[1:]):
        if other != first:
            raise AssertionError(
                f"step {step}, {label}: {sides[0].name} gave {first!r}, {side.name} gave {other!r}"
            )


def run_flow(
    sides: list[Side], seed: int, steps: int, mode: str, *, capacity: int, groups: int = 1
) -> FlowReport:
    """Drive ``steps`` random operations into every side; raise ``AssertionError`` naming the
    step and the answer at the first difference. Returns what the flow exercised."""
    rng = random.Random(seed)
    roots, groups = _universe(rng, groups)
    state = _State()
    report = FlowReport()
    tail_ids = iter(range(10**6, 10**7))
    # After every step the lookups of these keys are compared: every root's and every
    # request's still tracked (stores and evictions name every other key that changes).
    root_keys = [key for root in roots for key in _keys_of(root, groups)[0]]
    probes = [side.make_context("probe") for side in sides]

    def position(req: _Request, key_index: int) -> None:
        if mode == "none":
            return
        if mode == "partial" and rng.random() < 0.2:
            return
        end = (req.blocks[key_index] + 1) * TOKENS_PER_BLOCK
        for ctx in req.contexts:
            ctx.set_offload_key_position(req.keys[key_index], end)

    def new_request() -> None:
        root = rng.choice(roots)
        hashes = root[: rng.randrange(0, len(root) + 1)]
        hashes = hashes + [next(tail_ids) for _ in range(rng.randrange(0, 4))]
        if not hashes:
            hashes = [next(tail_ids)]
        keys, blocks = _keys_of(hashes, groups)
        req_id = f"r{state.next_id}"
        state.next_id += 1
        req = _Request(req_id, keys, blocks, [side.make_context(req_id) for side in sides])
        for i in range(len(keys)):
            position(req, i)
        state.requests.append(req)
        for side, ctx in zip(sides, req.contexts):
            side.manager.on_new_request(ctx)
        hits = 0
        for key in keys:
            answers = [s.answer(s.manager.lookup(key, c)) for s, c in zip(sides, req.contexts)]
            _same(f"lookup {key!r} of {req_id}", report.steps, answers, sides)
            report.lookups += 1
            if answers[0] != "hit":
                break
            hits += 1
        report.hits += hits
        if hits:
            loaded = keys[:hits]
            for side, ctx in zip(sides, req.contexts):
                side.manager.prepare_load(list(loaded), ctx)
            state.loads.append(_Job(req, loaded, state.generation))
        req.offered = hits

    def store() -> None:
        running = [r for r in state.requests if not r.finished]
        if not running:
            return
        req = rng.choice(running)
        n = len(req.keys)
        kind = rng.random()
        if kind < 0.6 and req.offered < n:  # the next chunk, in prefix order
            end = min(n, req.offered + rng.randrange(1, 5))
            chunk = req.keys[req.offered : end]
            req.offered = end
        elif kind < 0.8 and req.offered < n:  # a chunk backwards (a backfill)
            end = min(n, req.offered + rng.randrange(1, 5))
            chunk = req.keys[req.offered : end][::-1]
            req.offered = end
        else:  # offered again: resident, pending or evicted since
            chunk = rng.sample(req.keys, rng.randrange(1, n + 1))
        outs = [s.manager.prepare_store(list(chunk), c) for s, c in zip(sides, req.contexts)]
        answers = [
            None if out is None else (list(out.keys_to_store), list(out.evicted_keys))
            for out in outs
        ]
        _same(f"prepare_store {chunk!r} of {req.req_id}", report.steps, answers, sides)
        report.stores += 1
        if answers[0] is None:
            report.rejected_stores += 1
            return
        stored, evicted = answers[0]
        report.stored_blocks += len(stored)
        report.evicted_blocks += len(evicted)
        if stored:
            state.stores.append(_Job(req, stored, state.generation))

    def complete(jobs: list[_Job], kind: str) -> None:
        if not jobs:
            return
        job = jobs.pop(rng.randrange(len(jobs)))
        if job.generation != state.generation:
            return  # forgotten by reset_cache, as vLLM's scheduler drops stale jobs
        success = kind == "load" or rng.random() < 0.9
        for side, ctx in zip(sides, job.request.contexts):
            if kind == "load":
                side.manager.complete_load(list(job.keys), ctx)
            else:
                side.manager.complete_store(list(job.keys), ctx, success)
        if not success:
            report.failed_stores += 1

    def finish() -> None:
        running = [r for r in state.requests if not r.finished]
        if not running:
            return
        req = rng.choice(running)
        req.finished = True
        for side, ctx in zip(sides, req.contexts):
            side.manager.on_request_finished(ctx)
        report.finished += 1

    def touch() -> None:
        if not state.requests:
            return
        req = rng.choice(state.requests)
        keys = rng.sample(req.keys, rng.randrange(1, len(req.keys) + 1))
        for side, ctx in zip(sides, req.contexts):
            side.manager.touch(list(keys), ctx)

    def reset() -> None:
        for side in sides:
            side.manager.reset_cache()
        state.generation += 1
        report.resets += 1

    def step_end() -> None:
        for side in sides:
            side.step_end()
        events = [side.events() for side in sides]
        _same("take_events", report.steps, events, sides)
        report.events += len(events[0])
        # Finished requests whose jobs are done are dropped (their contexts with them).
        busy = {id(job.request) for job in state.loads + state.stores}
        state.requests = [r for r in state.requests if not r.finished or id(r) in busy]

    for _ in range(steps):
        report.steps += 1
        op = rng.random()
        open_requests = sum(not r.finished for r in state.requests)
        if op < 0.16 and open_requests < 6:
            new_request()
        elif op < 0.26:
            complete(state.loads, "load")
        elif op < 0.56:
            store()
        elif op < 0.70:
            complete(state.stores, "store")
        elif op < 0.80:
            finish()
        elif op < 0.83:
            touch()
        elif op < 0.834:
            reset()
        else:
            step_end()
        watched = dict.fromkeys(root_keys)
        for req in state.requests:
            watched.update(dict.fromkeys(req.keys))
        for key in watched:
            answers = [s.answer(s.manager.lookup(key, c)) for s, c in zip(sides, probes)]
            _same(f"lookup {key!r} after the step", report.steps, answers, sides)
        counters = [side.counters() for side in sides]
        _same("counters", report.steps, counters, sides)
    return report


def kv_offload_side(name: str, manager: Any) -> Side:
    """A :class:`Side` for kv-offload's ``CPUOffloadingManager`` (built with events on)."""
    from kv_offload import LookupResult, ReqContext

    answers = {LookupResult.HIT: "hit", LookupResult.MISS: "miss", LookupResult.PENDING: "pending"}

    def events() -> list[tuple[tuple[OffloadKey, ...], bool, bool]]:
        return [(tuple(e.keys), e.removed, e.metadata_only) for e in manager.take_events()]

    def counters() -> tuple[int, ...]:
        stats = manager.get_stats()
        return (stats.resident_blocks, stats.pending_blocks, stats.evictable_blocks)

    return Side(
        name, manager, ReqContext, answers.__getitem__, events, counters, manager.on_schedule_end
    )
