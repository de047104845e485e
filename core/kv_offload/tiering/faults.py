"""How the tiered manager reports a tier plugin that raises where it must not.

A tier's ``lookup`` or ``submit_*`` raising is contained: the key is a miss for that tier
(``lookup``) or the job fails at once and its CPU blocks are released (``submit_*``). A broken
tier can raise on every call, thousands of times a second, so the report is rate-limited:
the first failure of each kind (tier, method) is logged with its traceback, later ones are
counted (``TierStats.lookup_errors`` / ``submit_errors``) and summarised in one warning at
most every :attr:`FaultReporter.interval` seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

__all__ = ["FaultReporter"]

logger = logging.getLogger("kv_offload.tiering")


@dataclass
class _Kind:
    unreported: int = 0
    last_summary: float = 0.0
    last_error: str = ""


class FaultReporter:
    """Logs the first exception of each (tier, method) with its traceback, then summaries."""

    #: Seconds between two summaries of one kind of failure.
    interval = 10.0

    def __init__(self) -> None:
        self._kinds: dict[tuple[str, str], _Kind] = {}

    def report(self, tier: str, method: str, exc: BaseException, consequence: str) -> None:
        """Record that ``tier.method`` raised ``exc`` (call from the ``except`` block)."""
        kind = self._kinds.get((tier, method))
        now = time.monotonic()
        if kind is None:
            self._kinds[tier, method] = _Kind(last_summary=now)
            logger.error(
                "tier %r raised from %s(); %s. Later failures of %s() are counted in "
                "tier_stats() and summarised every %.0f s",
                tier,
                method,
                consequence,
                method,
                self.interval,
                exc_info=exc,
            )
            return
        kind.unreported += 1
        kind.last_error = f"{type(exc).__name__}: {exc}"
        if now - kind.last_summary >= self.interval:
            logger.warning(
                "tier %r raised from %s() %d more time(s) in the last %.0f s (last: %s); %s",
                tier,
                method,
                kind.unreported,
                now - kind.last_summary,
                kind.last_error,
                consequence,
            )
            kind.unreported = 0
            kind.last_summary = now
