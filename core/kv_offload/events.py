"""The ordered event log of an offloading stack (``enable_events=True``).

One log per stack: the CPU manager records its events in it and a tiered manager in front of
that CPU manager records the secondary tiers' events in the same log, so
:meth:`~kv_offload.OffloadingManager.take_events` returns them in the order they happened
(a block stored in the CPU tier before the tier that it cascades to holds it).
"""

from __future__ import annotations

from .keys import OffloadKey
from .types import OffloadingEvent

__all__ = ["EventLog", "OffloadingEvent"]


class EventLog:
    """Events in the order they were recorded, handed out (and forgotten) by :meth:`take`."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[OffloadingEvent] = []

    def record(self, keys: list[OffloadKey], medium: str, removed: bool) -> None:
        """Record that ``keys`` became loadable in (or, ``removed``, left) ``medium``."""
        self._events.append(OffloadingEvent(keys, medium, removed))

    def take(self) -> list[OffloadingEvent]:
        """Every event recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def __len__(self) -> int:
        return len(self._events)
