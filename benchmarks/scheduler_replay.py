"""The bundled trace replayed in vLLM's scheduler call order, against any manager.

vLLM's offloading connector drives its manager like this (``OffloadingConnectorScheduler``):
a new request gets ``on_new_request`` and ``lookup`` in prefix order up to the first non-HIT;
the hits are ``prepare_load``-ed when the request is scheduled; the worker's load finishes
later (``complete_load``); computed blocks are offered with ``prepare_store`` in a later step;
a finished request gets ``on_request_finished`` after its last ``prepare_store``; every step
ends with ``on_schedule_end``; stores complete after that (``complete_store``).

:func:`replay` runs two requests at once, one step apart, so one request's stores (and their
evictions) happen while the next request's hits are pinned by its in-flight load:

    step s: request s arrives (on_new_request, lookups, prepare_load of its hits);
            request s-1's load completes (complete_load), its misses are offered
            (prepare_store), it finishes (on_request_finished); on_schedule_end;
            request s-1's store completes (complete_store).

The same loop drives vLLM's ``CPUOffloadingManager`` and kv-offload's own; for kv-offload's
manager, which is not request-scoped, ``on_finish`` touches what vLLM's manager hands a policy
at ``on_request_finished``: the request's reused keys (its hits, then the ready blocks it
offered again), in prefix order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_offload import OffloadKey
from kv_offload.trace import read_trace

TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"


def load_trace(limit: int) -> list[tuple[str, list[OffloadKey]]]:
    return [(r.req_id, r.keys) for r in read_trace(TRACE, limit=limit)]


@dataclass
class Replayed:
    blocks: int = 0
    hit_blocks: int = 0
    stored_blocks: int = 0
    rejected_stores: int = 0
    evicted_blocks: int = 0
    #: evicted keys that were pinned by an in-flight load or pending at the time (must be 0)
    evicted_in_use: list[OffloadKey] = field(default_factory=list)

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.blocks


@dataclass
class _InFlight:
    ctx: Any
    keys: list[OffloadKey]
    hits: int


def replay(
    manager: Any,
    trace: list[tuple[str, list[OffloadKey]]],
    *,
    make_context: Callable[[str], Any],
    hit: Any,
    step_end: Callable[[], None],
    is_ready: Callable[[OffloadKey], bool] | None = None,
    on_finish: Callable[[Any, list[OffloadKey]], None] | None = None,
) -> Replayed:
    """Replay ``trace``. With ``on_finish``, ``is_ready(key)`` says whether the manager holds
    ``key`` readable, to tell ``on_finish`` what the request reused."""
    out = Replayed()
    previous: _InFlight | None = None
    pinned: set[OffloadKey] = set()
    for req_id, keys in [*trace, ("", [])]:
        current = None
        if req_id:
            ctx = make_context(req_id)
            manager.on_new_request(ctx)
            hits = 0
            for key in keys:
                if manager.lookup(key, ctx) is not hit:
                    break
                hits += 1
            if hits:
                manager.prepare_load(keys[:hits], ctx)
                pinned.update(keys[:hits])
            current = _InFlight(ctx, keys, hits)
            out.blocks += len(keys)
            out.hit_blocks += hits
        stored: list[OffloadKey] = []
        if previous is not None:
            ctx, keys, hits = previous.ctx, previous.keys, previous.hits
            if hits:
                manager.complete_load(keys[:hits], ctx)
                pinned.difference_update(keys[:hits])
            rest = keys[hits:]
            reused: list[OffloadKey] = []
            if on_finish is not None and is_ready is not None:
                reused = keys[:hits] + [key for key in rest if is_ready(key)]
            if rest:
                result = manager.prepare_store(rest, ctx)
                if result is None:
                    out.rejected_stores += 1
                else:
                    stored = list(result.keys_to_store)
                    out.stored_blocks += len(stored)
                    out.evicted_blocks += len(result.evicted_keys)
                    out.evicted_in_use += [k for k in result.evicted_keys if k in pinned]
            if on_finish is not None:
                on_finish(ctx, reused)
            manager.on_request_finished(ctx)
        step_end()
        if stored:
            manager.complete_store(stored, previous.ctx)  # type: ignore[union-attr]
        previous = current
    return out


def replay_vllm(manager: Any, trace: list[tuple[str, list[OffloadKey]]]) -> Replayed:
    """:func:`replay` against vLLM's ``CPUOffloadingManager`` (its real classes)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    step = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
    return replay(
        manager,
        trace,
        make_context=ReqContext,
        hit=LookupResult.HIT,
        step_end=lambda: manager.on_schedule_end(step),
    )


def replay_kv_offload(manager: Any, trace: list[tuple[str, list[OffloadKey]]]) -> Replayed:
    """:func:`replay` against kv-offload's own ``CPUOffloadingManager``, touching at request
    end what vLLM's manager reports as reused (the same access model)."""
    from kv_offload import LookupResult, ReqContext

    def touch_reused(ctx: Any, reused: list[OffloadKey]) -> None:
        if reused:
            manager.touch(reused, ctx)

    def ready(key: OffloadKey) -> bool:
        count = manager.ref_count(key)
        return count is not None and count >= 0

    return replay(
        manager,
        trace,
        make_context=ReqContext,
        hit=LookupResult.HIT,
        step_end=manager.on_schedule_end,
        is_ready=ready,
        on_finish=touch_reused,
    )
