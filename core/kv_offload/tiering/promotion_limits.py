"""Old import path of :class:`PromotionLimits`, the bound on every ``PENDING`` answer of a
tiered stack. The promotion state machine it bounds (deadline, "ask again" wait, failure
backoff) lives with the rest of the promotion state in :mod:`kv_offload.tiering.jobs`."""

from __future__ import annotations

from .jobs import DEFAULT_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_TIMEOUT, PromotionLimits

__all__ = ["DEFAULT_BACKOFF", "DEFAULT_MAX_FAILURES", "DEFAULT_TIMEOUT", "PromotionLimits"]
