"""The CPU cache: the manager, one class (``manager``), and its collaborators: what it is
built from (``construction``), its counters (``counters``), the slot table (``slots``),
eviction (``eviction``), the admission it asks (``reuse_filter``), input checks and error
diagnosis (``validation``), and its request flow for the one manager it may be handed over to
(``handover``). Nothing here knows what an owner adds to the cache."""

from __future__ import annotations

from .manager import MEDIUM_CPU, CPUOffloadingManager

__all__ = ["CPUOffloadingManager", "MEDIUM_CPU"]
