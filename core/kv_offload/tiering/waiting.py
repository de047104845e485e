"""The tiered manager's one bounded wait: poll, back off, give up at a deadline.

Every wait of the stack for its tiers (a drain, an eviction waiting for write-back staging
rows) has a bound, so a tier that never reports cannot hang the engine; the caller decides
what a timeout means (an error, or giving up on what it waited for). The caller drives the
loop (``for _ in backoff(timeout): poll; if done: break``), so its own work never runs as a
call-back from here. The pause grows from half a millisecond to 50 ms: a job that ends
quickly is collected quickly, and a slow one is not polled in a busy loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

__all__ = ["backoff"]

_FIRST_DELAY_S = 0.0005
_MAX_DELAY_S = 0.05


def backoff(timeout_s: float) -> Iterator[None]:
    """Yield at once, then after each growing pause, until ``timeout_s`` seconds passed: a
    loop over it that has not broken out by then has timed out."""
    deadline = time.monotonic() + timeout_s
    delay = _FIRST_DELAY_S
    while True:
        yield
        if time.monotonic() >= deadline:
            return
        time.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY_S)
