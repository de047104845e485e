"""A circuit breaker for the endpoint: while the store is unreachable, jobs fail at once.

Without it every job sent to a dead or hung endpoint would wait out its own timeouts and
retries, and the engine's cascades would pile up pinned CPU blocks. The first failure (after
the client's bounded retries) opens it for ``first_delay`` seconds; each failed trial doubles
the delay up to ``max_delay``. When the delay has passed one caller may try (half-open); its
success closes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
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
        """Open and not due for a trial yet (takes no trial)."""
        return self._delay > 0.0 and self._clock() < self._retry_at

    def allow(self) -> bool:
        """Whether a caller may talk to the store now (closed, or the half-open trial)."""
        with self._lock:
            if self._delay == 0.0:
                return True
            now = self._clock()
            if now < self._retry_at:
                return False
            self._retry_at = now + self._delay
            return True

    def success(self) -> bool:
        """Close it; ``True`` if it was open."""
        with self._lock:
            was_open = self._delay > 0.0
            self._delay = 0.0
            return was_open

    def failure(self) -> bool:
        """Open it or lengthen its delay; ``True`` if it just opened."""
        with self._lock:
            opened = self._delay == 0.0
            self._delay = self.first_delay if opened else min(self._delay * 2.0, self.max_delay)
            self._retry_at = self._clock() + self._delay
            if opened:
                self.trips += 1
            return opened
