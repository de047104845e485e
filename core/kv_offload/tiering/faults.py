"""How the tiered manager reports a tier plugin that raises where it must not.

A tier's ``lookup`` or ``submit_*`` raising is contained: the key is a miss for that tier
(``lookup``) or the job fails at once and its CPU blocks are released (``submit_*``). A broken
tier can raise on every call, thousands of times a second, so the report is rate-limited:
the first failure of each of the tier's methods is logged with its traceback, later ones are
counted (``TierStats.lookup_errors`` / ``submit_errors``) and summarised in one warning at
most every :attr:`TierFaults.interval` seconds.

Each tier's reports are its own: a :class:`TierFaults` lives in the tier's record
(:class:`~kv_offload.tiering.record.TierRecord`), beside its counters and its promotion
failure records, so a tier's fault history is read and kept in one place.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

__all__ = ["TierFaults"]

logger = logging.getLogger("kv_offload.tiering")


@dataclass
class _Method:
    """The failures of one of the tier's methods since its last log line."""

    unreported: int = 0
    last_summary: float = 0.0
    last_error: str = ""


class TierFaults:
    """One tier's fault reports: the first exception of each method is logged with its
    traceback, later ones in summaries."""

    #: Seconds between two summaries of one method's failures.
    interval = 10.0

    def __init__(self, tier: str) -> None:
        self.tier = tier
        self._methods: dict[str, _Method] = {}

    def report(self, method: str, exc: BaseException, consequence: str) -> None:
        """Record that the tier's ``method`` raised ``exc`` (call from the ``except``
        block); ``consequence`` says what the stack did about it."""
        seen = self._methods.get(method)
        now = time.monotonic()
        if seen is None:
            self._methods[method] = _Method(last_summary=now)
            logger.error(
                "tier %r raised from %s(); %s. Later failures of %s() are counted in "
                "tier_stats() and summarised every %.0f s",
                self.tier,
                method,
                consequence,
                method,
                self.interval,
                exc_info=exc,
            )
            return
        seen.unreported += 1
        seen.last_error = f"{type(exc).__name__}: {exc}"
        if now - seen.last_summary >= self.interval:
            logger.warning(
                "tier %r raised from %s() %d more time(s) in the last %.0f s (last: %s); %s",
                self.tier,
                method,
                seen.unreported,
                now - seen.last_summary,
                seen.last_error,
                consequence,
            )
            seen.unreported = 0
            seen.last_summary = now
