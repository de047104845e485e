"""The bound on every ``PENDING`` answer of a tiered stack, whatever a tier does.

A lookup answers ``PENDING`` in two cases, and each has a limit here:

* **a promotion is queued or in flight** (the key holds a reserved CPU slot). If its tier
  job has not landed ``timeout`` seconds after the slot was reserved, the key *expires*: its
  lookups answer ``MISS`` from then on, so the engine recomputes the block instead of waiting
  for a tier that may never report. The reserved slot stays reserved (a pending store) until
  the job reports, because the tier may still write into it: reusing it earlier could serve
  a block with another block's bytes. A late success then lands normally (the bytes are the
  right ones), a late failure frees the slot;
* **a tier answered** ``None`` ("ask again": its store of the key is in flight, or its
  existence check has not finished). A tier still answering ``None`` ``timeout`` seconds after
  its first ``None`` for that request and key is taken as not holding the key.

A promotion that fails (the job reports failure, or ``submit_load`` raises) resolves the key
as ``MISS`` at once, and that tier is not asked about the key again for a backoff that
doubles with each failure (``backoff``, ``2 * backoff``, ...). After ``max_failures``
failures in a row the tier is not asked about the key again until the key is stored to that
tier again (a cascade of it succeeds). So promotion attempts per key and tier are bounded,
and a tier whose loads always fail costs one failed promotion per key, not one per lookup.

Every ``PENDING`` answer therefore becomes ``HIT`` or ``MISS`` within ``timeout`` seconds
(plus the engine step that submits a queued promotion), whether a tier never reports,
reports failures, raises or returns garbage.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..keys import OffloadKey

__all__ = ["PromotionLimits"]

#: Default seconds a promotion may stay ``PENDING`` (config key ``promotion_timeout_s``).
DEFAULT_TIMEOUT = 10.0
#: Default first backoff after a failed promotion (``promotion_backoff_s``).
DEFAULT_BACKOFF = 1.0
#: Default failures in a row after which a tier is not asked again until the key is stored.
DEFAULT_MAX_FAILURES = 3
#: Backoff records kept at most (the oldest is forgotten first: it is then asked again).
MAX_RECORDS = 1 << 17


@dataclass
class _Failures:
    count: int
    retry_at: float


class PromotionLimits:
    """Reservation times, expired promotions, failure backoff and "ask again" waits."""

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        backoff: float = DEFAULT_BACKOFF,
        max_failures: int = DEFAULT_MAX_FAILURES,
    ) -> None:
        self.timeout = timeout
        self.backoff = backoff
        self.max_failures = max_failures
        #: key -> when its CPU slot was reserved for a promotion (queued or in flight), and
        #: the index of the tier promoting it
        self._reserved_at: dict[OffloadKey, tuple[float, int]] = {}
        #: promotions past their deadline: lookups answer MISS, the slot waits for the job
        self.expired: set[OffloadKey] = set()
        #: (tier index, key) -> failures in a row and when the tier may be asked again
        self._failures: dict[tuple[int, OffloadKey], _Failures] = {}
        #: req_id -> key -> when a tier first answered ``None`` for it
        self._asked_again: dict[str, dict[OffloadKey, float]] = {}

    # -- promotions in flight ---------------------------------------------------------

    def reserved(self, index: int, key: OffloadKey) -> None:
        """A CPU slot was reserved for promoting ``key`` from tier ``index``."""
        self._reserved_at[key] = (time.monotonic(), index)

    def newly_expired(self, key: OffloadKey) -> int | None:
        """The tier index of the promotion of ``key`` if it passed its deadline just now (the
        key joins :attr:`expired`), else ``None`` (not late, or expired before)."""
        entry = self._reserved_at.get(key)
        if entry is None or key in self.expired or time.monotonic() - entry[0] < self.timeout:
            return None
        self.expired.add(key)
        return entry[1]

    def ended(self, index: int, keys: Iterable[OffloadKey], failed: Iterable[OffloadKey]) -> None:
        """The promotion job of ``keys`` from tier ``index`` reported; ``failed`` of them did
        not land (they back off), the others did (their failure record is cleared)."""
        failed_set = set(failed)
        now = time.monotonic()
        for key in keys:
            self._reserved_at.pop(key, None)
            self.expired.discard(key)
            if key in failed_set:
                self._failed(index, key, now)
            else:
                self._failures.pop((index, key), None)

    def _failed(self, index: int, key: OffloadKey, now: float) -> None:
        record = self._failures.pop((index, key), None)  # re-inserted last: newest
        count = 1 if record is None else record.count + 1
        # After max_failures in a row: never, until the key is stored to this tier again.
        last = count >= self.max_failures
        retry_at = math.inf if last else now + self.backoff * (1 << (count - 1))
        self._failures[index, key] = _Failures(count, retry_at)
        if len(self._failures) > MAX_RECORDS:
            del self._failures[next(iter(self._failures))]

    def stored(self, index: int, keys: Iterable[OffloadKey]) -> None:
        """Tier ``index`` stored ``keys``: they may be promoted from it again."""
        if self._failures:
            for key in keys:
                self._failures.pop((index, key), None)

    def may_ask(self, index: int, key: OffloadKey) -> bool:
        """Whether tier ``index`` may be asked about ``key`` (not backing off)."""
        record = self._failures.get((index, key))
        return record is None or time.monotonic() >= record.retry_at

    # -- tiers answering "ask again" --------------------------------------------------

    def asked_again(self, req_id: str, key: OffloadKey) -> bool:
        """A tier answered ``None`` for ``key``: whether the request may still wait for it
        (``False`` once ``timeout`` seconds passed since the first such answer)."""
        waits = self._asked_again.setdefault(req_id, {})
        now = time.monotonic()
        first = waits.setdefault(key, now)
        return now - first < self.timeout

    def answered(self, req_id: str, key: OffloadKey) -> None:
        """A tier answered ``True`` or ``False`` for ``key``: the wait (if any) is over."""
        waits = self._asked_again.get(req_id)
        if waits:
            waits.pop(key, None)

    def request_finished(self, req_id: str) -> None:
        self._asked_again.pop(req_id, None)

    def clear(self) -> None:
        """Forget promotions in flight and waits (``reset_cache``); failures are kept, since
        the tiers keep their blocks."""
        self._reserved_at.clear()
        self.expired.clear()
        self._asked_again.clear()
