"""The circuit breaker the shared tiers (Redis, S3) put in front of each server they talk
to, so that a dead or hung server costs a job nothing but a failure (public: tier authors
import it from :mod:`kv_offload.tiering`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """A circuit breaker for one server or endpoint of a shared tier: while it is
    unreachable, jobs fail at once.

    Without it, every job sent to a dead server would wait for its own timeouts and retries,
    and the engine's cascades would pile up pinned CPU blocks. After the first connection
    failure the breaker opens for ``first_delay`` seconds; each failed retry doubles the delay
    up to ``max_delay``. Once the delay has passed, one caller is let through to try
    (half-open); its success closes the breaker.
    """

    def __init__(
        self, first_delay: float, max_delay: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._clock = clock
        self._lock = threading.Lock()
        self._delay = 0.0  # 0: closed
        self._retry_at = 0.0
        self.trips = 0

    @property
    def is_open(self) -> bool:
        return self._delay > 0.0

    def blocked(self) -> bool:
        """Open and not yet due for a retry (does not take the half-open trial)."""
        return self._delay > 0.0 and self._clock() < self._retry_at

    def allow(self) -> bool:
        """Whether a caller may talk to the server now (closed, or a half-open trial)."""
        with self._lock:
            if self._delay == 0.0:
                return True
            now = self._clock()
            if now < self._retry_at:
                return False
            self._retry_at = now + self._delay  # one trial per delay
            return True

    def success(self) -> bool:
        """Close the breaker; ``True`` if it was open (the server is back)."""
        with self._lock:
            was_open = self._delay > 0.0
            self._delay = 0.0
            return was_open

    def failure(self) -> bool:
        """Open the breaker or lengthen its delay; ``True`` if it just opened."""
        with self._lock:
            opened = self._delay == 0.0
            self._delay = self.first_delay if opened else min(self._delay * 2.0, self.max_delay)
            self._retry_at = self._clock() + self._delay
            if opened:
                self.trips += 1
            return opened
