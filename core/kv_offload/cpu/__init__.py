"""The CPU tier: the manager's request flow (``manager``), its state and construction
(``state``), the slot table (``slots``), eviction (``eviction``), the reuse filter
(``reuse_filter``), and input checks and error diagnosis (``validation``)."""

from __future__ import annotations

from .manager import MEDIUM_CPU, CPUOffloadingManager

__all__ = ["CPUOffloadingManager", "MEDIUM_CPU"]
