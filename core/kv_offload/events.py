"""The ordered event log of an offloading stack (``enable_events=True``).

One log per stack: the CPU manager records its events in it and a tiered manager in front of
that CPU manager records the secondary tiers' events in the same log, so
:meth:`~kv_offload.OffloadingManager.take_events` returns them in the order they happened
(a block stored in the CPU tier before the tier that it cascades to holds it).

A failed store is a *metadata-only* removal (vLLM's ``metadata_only``): the block was never
announced as stored, so a consumer that tracks the stored set has nothing to drop, while one
that tracks offered keys (or reserved slots) cleans up. Such an event is a stale instruction
once the key is back in the medium (a retry's store is pending or done), so :meth:`take`
drops those keys, and the whole event if none is left.
"""

from __future__ import annotations

from collections.abc import Callable

from .keys import OffloadKey
from .types import OffloadingEvent

__all__ = ["EventLog", "OffloadingEvent"]


class EventLog:
    """Events in the order they were recorded, handed out (and forgotten) by :meth:`take`."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[OffloadingEvent] = []

    def record(
        self, keys: list[OffloadKey], medium: str, removed: bool, metadata_only: bool = False
    ) -> None:
        """Record that ``keys`` became loadable in (or, ``removed``, left) ``medium``;
        ``metadata_only``: they left without ever having been loadable (a failed store)."""
        self._events.append(OffloadingEvent(keys, medium, removed, metadata_only))

    def take(
        self, present: Callable[[str, OffloadKey], bool] | None = None
    ) -> list[OffloadingEvent]:
        """Every event recorded since the last call, oldest first.

        ``present(medium, key)`` says whether a key is in a medium now; a metadata-only
        removal loses the keys it answers true for (stored again since), and is left out
        when none remains.
        """
        events, self._events = self._events, []
        if present is None:
            return events
        out: list[OffloadingEvent] = []
        for event in events:
            if event.metadata_only:
                medium = event.medium
                keys = [key for key in event.keys if not present(medium, key)]
                if not keys:
                    continue
                if len(keys) != len(event.keys):
                    event = OffloadingEvent(keys, medium, True, True)
            out.append(event)
        return out

    def __len__(self) -> int:
        return len(self._events)
