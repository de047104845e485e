"""Events the manager records for an engine's KV-event stream (``enable_events=True``)."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import OffloadKey

__all__ = ["OffloadingEvent"]


@dataclass
class OffloadingEvent:
    """A batch of keys that became loadable (``removed=False``) or left (``removed=True``)
    the medium named by ``medium`` (``"CPU"`` or a secondary tier's name)."""

    keys: list[OffloadKey]
    medium: str
    removed: bool
