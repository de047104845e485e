"""The promotion state machine of a tiered manager: which tier a CPU miss is loaded from,
and the bound on every ``PENDING`` answer. It decides and keeps the books; it never calls the
CPU tier or submits a job (the tiered manager does, :mod:`kv_offload.tiering.manager`).

* **Promotions** (``LOAD`` jobs) follow one state machine, per key::

      asked -> reserved -> loading -> landed
                  |           |   \\-> failed -> backoff (then asked again, a bounded
                  |           |                   number of times)
                  \\-----------+-> expired (answered MISS; the slot waits for the job)

  *asked*: :meth:`Promotions.ask` picks the first tier holding a CPU miss (or says ``MISS``
  or ``PENDING``); *reserved*: the manager reserved a CPU slot and :meth:`Promotions.reserved`
  queues the load until the step ends; *loading*: :meth:`Promotions.take_queued` hands the
  step's loads out as one job per (tier, request); *landed* / *failed*: the job's result.
  ``promoting`` holds every key between *reserved* and the result.
The bound on every ``PENDING`` answer, whatever a tier does:

* a promotion not landed ``timeout`` seconds after its slot was reserved *expires*: its
  lookups answer ``MISS``; the slot stays reserved (a pending store) until the job reports,
  because the tier may still write into it, and a late success lands the right bytes;
* a tier answering ``None`` ("ask again") ``timeout`` seconds after its first ``None`` for
  that request and key is taken as not holding it;
* a failed promotion resolves the key as ``MISS`` at once, and that tier is not asked about
  the key for ``backoff`` seconds, doubling per failure in a row; after ``max_failures``
  failures in a row it is not asked again until the key is stored to that tier again.

"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import KeyStateError, ManagerError, PluginError
from ..keys import OffloadKey
from ..types import LookupResult, ReqContext
from .faults import FaultReporter
from .record import TierRecord

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_FAILURES",
    "DEFAULT_TIMEOUT",
    "PromotionLimits",
    "Promotions",
]

_HIT = LookupResult.HIT
#: What :meth:`Promotions.ask` answers when no tier holds the key.
_NOT_HELD: tuple[LookupResult, None] = (LookupResult.MISS, None)
_ASK_AGAIN: tuple[LookupResult, None] = (LookupResult.PENDING, None)

#: Default seconds a promotion may stay ``PENDING`` (config key ``promotion_timeout_s``).
DEFAULT_TIMEOUT = 10.0
#: Default first backoff after a failed promotion (``promotion_backoff_s``).
DEFAULT_BACKOFF = 1.0
#: Default failures in a row after which a tier is not asked again until the key is stored.
DEFAULT_MAX_FAILURES = 3
#: Backoff records kept at most (the oldest is forgotten first: it is then asked again).
MAX_RECORDS = 1 << 17


@dataclass(frozen=True)
class PromotionLimits:
    """The bound on ``PENDING`` answers: promotion deadline and ask-again wait (``timeout``
    seconds), the first backoff after a failed promotion, and the failures in a row after
    which a tier is not asked about a key until the key is stored to it again."""

    timeout: float = DEFAULT_TIMEOUT
    backoff: float = DEFAULT_BACKOFF
    max_failures: int = DEFAULT_MAX_FAILURES


@dataclass
class _Promotion:
    """One key between *reserved* and its job's result."""

    tier: TierRecord
    reserved_at: float  # time.monotonic()
    expired: bool = False


@dataclass
class _Failures:
    count: int
    retry_at: float


class Promotions:
    """Every promotion of one tiered manager, from the CPU miss to its job's result, counted
    into each tier's record."""

    def __init__(self, faults: FaultReporter, limits: PromotionLimits | None = None) -> None:
        self.faults = faults
        self.limits = limits if limits is not None else PromotionLimits()
        #: Keys whose promotion is reserved (queued or loading), with its state.
        self.promoting: dict[OffloadKey, _Promotion] = {}
        #: (tier, req_id) -> (context, keys, slots): loads waiting for the step end.
        self.queued: dict[
            tuple[TierRecord, str], tuple[ReqContext, list[OffloadKey], list[int]]
        ] = {}
        #: req_id -> keys its lookups answered HIT or PENDING (protected from its promotions).
        self.found: dict[str, set[OffloadKey]] = {}
        #: (tier, key) -> failures in a row and when the tier may be asked again.
        self._failures: dict[tuple[TierRecord, OffloadKey], _Failures] = {}
        #: req_id -> key -> when a tier first answered ``None`` for it.
        self._asked_again: dict[str, dict[OffloadKey, float]] = {}

    def reset(self) -> None:
        """``reset_cache``: forget promotions and waits. Failure records are kept: the tiers
        keep their blocks."""
        self.promoting.clear()
        self.found.clear()
        self._asked_again.clear()

    def queued_per_tier(self) -> dict[str, int]:
        """Blocks whose promotion is queued for the step end, per tier name."""
        out: dict[str, int] = {}
        for (tier, _), (_, keys, _) in self.queued.items():
            out[tier.name] = out.get(tier.name, 0) + len(keys)
        return out

    def blocks_queued(self) -> int:
        return sum(len(keys) for _, keys, _ in self.queued.values())

    # -- asked -> reserved ------------------------------------------------------------------

    def note_found(self, req_id: str, key: OffloadKey) -> None:
        self.found.setdefault(req_id, set()).add(key)

    def protected(self, req_id: str) -> set[OffloadKey] | tuple[()]:
        """The keys a promotion for the request must not evict (those it found)."""
        return self.found.get(req_id, ())

    def ask(
        self, tiers: Sequence[TierRecord], key: OffloadKey, ctx: ReqContext
    ) -> tuple[LookupResult, TierRecord | None]:
        """A CPU miss, asked of ``tiers`` in order: ``(HIT, tier)`` for the first tier that
        holds ``key`` (the manager reserves a CPU slot, then calls :meth:`reserved` or
        :meth:`refused`), else the lookup's answer with no tier: ``PENDING`` if one said "ask
        again" within the timeout, ``MISS`` otherwise. A tier whose ``lookup`` raises or
        answers something other than True, False or None counts as a miss there; so does a
        tier backing off from the key."""
        ask_again = False
        failures = self._failures
        for tier in tiers:
            stats = tier.stats
            if failures:
                record = failures.get((tier, key))
                if record is not None and time.monotonic() < record.retry_at:
                    stats.backed_off_lookups += 1
                    continue
            stats.lookups += 1
            try:
                held = tier.plugin.lookup(key, ctx)
            except Exception as exc:  # contained: a miss for this tier (tiering/faults.py)
                stats.lookup_errors += 1
                self.faults.report(tier.name, "lookup", exc, "the key is a miss there")
                continue
            if held is True:
                self._answered(ctx.req_id, key)
                stats.lookup_hits += 1
                return _HIT, tier
            if held is None:
                if self._may_wait(ctx.req_id, key):
                    ask_again = True
                else:
                    stats.ask_again_timeouts += 1
            elif held is not False:
                stats.contract_errors += 1
                self.faults.report(
                    tier.name,
                    "lookup",
                    PluginError(
                        f"lookup() returned {type(held).__name__} {held!r:.40}; a tier's "
                        f"lookup must return True, False or None",
                        kind="tier",
                        plugin=tier.name,
                    ),
                    "the key is a miss there",
                )
        if not ask_again:
            self._answered(ctx.req_id, key)
            return _NOT_HELD
        return _ASK_AGAIN

    def _may_wait(self, req_id: str, key: OffloadKey) -> bool:
        """A tier answered ``None`` for ``key``: whether the request may still wait for it
        (``False`` once ``timeout`` seconds passed since the first such answer)."""
        waits = self._asked_again.setdefault(req_id, {})
        now = time.monotonic()
        first = waits.setdefault(key, now)
        return now - first < self.limits.timeout

    def _answered(self, req_id: str, key: OffloadKey) -> None:
        """A tier answered ``True`` or ``False`` for ``key``: the wait (if any) is over."""
        waits = self._asked_again.get(req_id)
        if waits:
            waits.pop(key, None)

    def reserved(self, tier: TierRecord, key: OffloadKey, ctx: ReqContext, slot: int) -> None:
        """The manager reserved CPU ``slot`` for promoting ``key`` from ``tier``: queue the
        load for the step end."""
        self.promoting[key] = _Promotion(tier, time.monotonic())
        _, keys, slots = self.queued.setdefault((tier, ctx.req_id), (ctx, [], []))
        keys.append(key)
        slots.append(slot)
        self.note_found(ctx.req_id, key)

    def refused(self, tier: TierRecord) -> None:
        """No CPU slot could be reserved (or an admission hook said no): the key is a miss."""
        tier.stats.refused_promotions += 1

    def expired(self, key: OffloadKey) -> bool:
        """Whether ``key``, answered ``PENDING`` by the CPU tier, is a promotion past its
        deadline (then the lookup answers ``MISS``; the slot waits for the job)."""
        promotion = self.promoting.get(key)
        if promotion is None:
            return False
        if not promotion.expired:
            if time.monotonic() - promotion.reserved_at < self.limits.timeout:
                return False
            promotion.expired = True
            promotion.tier.stats.expired_promotions += 1
            self.faults.report(
                promotion.tier.name,
                "promotion",
                ManagerError(
                    f"a promotion did not land within {self.limits.timeout:g} s "
                    f"(promotion_timeout_s)"
                ),
                "the key is answered MISS; its CPU slot stays reserved until the job reports",
            )
        return True

    def check_not_promoting(self, keys: list[OffloadKey], operation: str) -> None:
        """Raise if the engine completes a store of a key a promotion reserved: its slot is
        written by the tier's load, and completed by the tiered manager when that lands."""
        promoting = self.promoting
        if promoting and not promoting.keys().isdisjoint(keys):
            from ..cpu.validation import short  # the error path only

            key = next(k for k in keys if k in promoting)
            raise KeyStateError(
                f"{operation}: key {short(key)} is being promoted from a secondary tier, "
                f"not stored by the engine; pass the keys_to_store of prepare_store",
                key=key,
                operation=operation,
            )

    # -- reserved -> loading ------------------------------------------------------------------

    def take_queued(
        self, req_id: str | None = None
    ) -> list[tuple[TierRecord, ReqContext, list[OffloadKey], list[int]]]:
        """The queued loads (of one request, or all) to submit now, as (tier, context,
        keys, slots): the manager submits each with :meth:`submit`."""
        queued = self.queued
        if not queued:
            return []
        groups = [g for g in queued if req_id is None or g[1] == req_id]
        return [(g[0], *queued.pop(g)) for g in groups]

    def finish_request(self, req_id: str) -> None:
        """The request finished (its queued loads were taken): its found keys are
        unprotected, its "ask again" waits forgotten."""
        self.found.pop(req_id, None)
        self._asked_again.pop(req_id, None)

    def cancel_queued(self) -> list[tuple[ReqContext, list[OffloadKey]]]:
        """``reset_cache``: drop every queued load (never submitted); the manager fails their
        CPU stores, which frees the slots."""
        dropped = [(ctx, keys) for ctx, keys, _ in self.queued.values()]
        for _, keys in dropped:
            for key in keys:
                self.promoting.pop(key, None)
        self.queued.clear()
        self.found.clear()
        return dropped

    # -- loading -> landed | failed -> backoff ------------------------------------------------

    def ended(self, tier: TierRecord, keys: list[OffloadKey], failed: list[OffloadKey]) -> None:
        """loading -> landed (the key's failure record is cleared) or failed -> backoff."""
        promoting = self.promoting
        for key in keys:
            promoting.pop(key, None)
        failures = self._failures
        failed_set = set(failed)
        now = time.monotonic()
        for key in keys:
            if key in failed_set:
                self._failed(tier, key, now)
            elif failures:
                failures.pop((tier, key), None)

    def _failed(self, tier: TierRecord, key: OffloadKey, now: float) -> None:
        """failed -> backoff: not asked for ``backoff * 2**(n-1)`` seconds after the n-th
        failure in a row; after ``max_failures``, not until the key is stored there again."""
        record = self._failures.pop((tier, key), None)  # re-inserted last: newest
        count = 1 if record is None else record.count + 1
        limits = self.limits
        last = count >= limits.max_failures
        retry_at = math.inf if last else now + limits.backoff * (1 << (count - 1))
        self._failures[tier, key] = _Failures(count, retry_at)
        if len(self._failures) > MAX_RECORDS:
            del self._failures[next(iter(self._failures))]

    def stored(self, tier: TierRecord, keys: list[OffloadKey]) -> None:
        """``keys`` were stored to ``tier`` again: it may be asked about them again."""
        if self._failures:
            for key in keys:
                self._failures.pop((tier, key), None)
