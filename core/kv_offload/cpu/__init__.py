"""The CPU tier: the manager's request flow (``manager``), the slot table (``slots``), input
checks and error diagnosis (``validation``) and construction (``setup``)."""

from __future__ import annotations

from .manager import MEDIUM_CPU, CPUOffloadingManager

__all__ = ["CPUOffloadingManager", "MEDIUM_CPU"]
