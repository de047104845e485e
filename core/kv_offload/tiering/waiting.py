"""The tiered manager's one bounded wait: poll until a condition holds or a deadline passes.

Every wait of the stack for its tiers (a drain, an eviction waiting for write-back staging
rows) has a bound, so a tier that never reports cannot hang the engine; the caller decides
what a timeout means (an error, or giving up on what it waited for). The poll backs off from
half a millisecond to 50 ms: a job that ends quickly is collected quickly, and a slow one is
not polled in a busy loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["poll_until"]

_FIRST_DELAY_S = 0.0005
_MAX_DELAY_S = 0.05


def poll_until(done: Callable[[], bool], poll: Callable[[], None], timeout_s: float) -> bool:
    """Call ``poll`` until ``done()`` is true (checked after each poll) or ``timeout_s``
    seconds passed; whether it came true. ``poll`` runs at least once."""
    deadline = time.monotonic() + timeout_s
    delay = _FIRST_DELAY_S
    while True:
        poll()
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY_S)
