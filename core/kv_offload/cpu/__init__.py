"""The CPU tier: the manager, one class (``manager``), and its collaborators: what it is
built from (``construction``), its counters (``counters``), the slot table (``slots``),
eviction (``eviction``), the admission it asks (``reuse_filter``), and input checks and error
diagnosis (``validation``)."""

from __future__ import annotations

from .manager import MEDIUM_CPU, CPUOffloadingManager

__all__ = ["CPUOffloadingManager", "MEDIUM_CPU"]
