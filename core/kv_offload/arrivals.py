"""Where an engine loop's requests come from, and when: the trace's clock, scaled.

Request ``r`` arrives ``r.arrival_s / speed`` seconds of wall time after the start
(:class:`TraceArrivals`); in a fleet a router feeds each engine instead (:mod:`kv_offload.fleet`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from .replay_records import TimedRequest

__all__ = ["Arrivals", "TraceArrivals"]


class Arrivals(Protocol):
    """Where an engine loop's requests come from: the trace's clock (:class:`TraceArrivals`)
    or, in a fleet, a router feeding each engine (:mod:`kv_offload.fleet`)."""

    def due(self, now: float) -> list[tuple[TimedRequest, float]]:
        """The requests arrived by ``now`` (``time.monotonic``), each with its arrival."""
        ...

    def next_at(self, now: float) -> float:
        """When the next request may arrive (``now`` or later; ``math.inf``: none known)."""
        ...

    def exhausted(self) -> bool:
        """No request will arrive any more."""
        ...


class TraceArrivals:
    """The trace's requests at ``speed`` times their pace, from ``start`` on."""

    def __init__(self, requests: Sequence[TimedRequest], speed: float, start: float) -> None:
        self._pending = deque(requests)
        self._first = requests[0].arrival_s if requests else 0.0
        self._speed = speed
        self._start = start

    def _at(self, request: TimedRequest) -> float:
        return self._start + (request.arrival_s - self._first) / self._speed

    def due(self, now: float) -> list[tuple[TimedRequest, float]]:
        pending = self._pending
        out = []
        while pending and self._at(pending[0]) <= now:
            request = pending.popleft()
            out.append((request, self._at(request)))
        return out

    def next_at(self, now: float) -> float:
        return max(now, self._at(self._pending[0])) if self._pending else math.inf

    def exhausted(self) -> bool:
        return not self._pending
