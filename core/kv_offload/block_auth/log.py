"""Rate-limited reports of blocks that failed authentication (:class:`AuthFailureLog`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["AuthFailureLog"]


class AuthFailureLog:
    """Rate-limited reports of blocks that failed authentication, per tier.

    A forger can plant blocks as fast as engines look them up, so a log line per block would
    be a denial of service on the log. The first failure of each kind is a WARNING with its
    message; later ones are counted and summarised at most every :attr:`interval` seconds.
    Thread-safe (tiers verify on their I/O threads).
    """

    #: Seconds between two summaries of one kind.
    interval = 10.0

    def __init__(self, tier: str, logger: logging.Logger) -> None:
        self.tier = tier
        self.logger = logger
        self._lock = threading.Lock()
        self._kinds: dict[str, list[Any]] = {}  # kind -> [unreported, last summary, last]

    def report(self, kind: str, message: str, consequence: str) -> None:
        """Record one failure of ``kind``; ``consequence`` says what the tier did with it."""
        now = time.monotonic()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None:
                self._kinds[kind] = [0, now, message]
                first = True
            else:
                state[0] += 1
                state[2] = message
                first = False
                if now - state[1] < self.interval:
                    return
                count, since = state[0], now - state[1]
                state[0], state[1] = 0, now
        if first:
            self.logger.warning(
                "tier %r: a block failed authentication (%s: %s); %s. It is not served (a "
                "miss). Later %s failures are counted in the tier's stats and summarised every "
                "%.0f s",
                self.tier,
                kind,
                message,
                consequence,
                kind,
                self.interval,
            )
        else:
            self.logger.warning(
                "tier %r: %d more block(s) failed authentication (%s) in the last %.0f s "
                "(last: %s); %s",
                self.tier,
                count,
                kind,
                since,
                message,
                consequence,
            )
