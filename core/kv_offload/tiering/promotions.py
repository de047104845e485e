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
  A key's promotion is one :class:`Promotion` from *reserved* to the result (its tier,
  request, CPU slot, when it was reserved, whether it is loading or expired), in
  ``promoting``; a tier's failure records (*backoff*) are in the tier's record.
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
from .record import Backoff, TierRecord

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_FAILURES",
    "DEFAULT_TIMEOUT",
    "Promotion",
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
#: Backoff records kept per tier at most (the oldest is forgotten first: it is then asked
#: again).
MAX_RECORDS = 1 << 17


@dataclass(frozen=True)
class PromotionLimits:
    """The bound on ``PENDING`` answers: promotion deadline and ask-again wait (``timeout``
    seconds), the first backoff after a failed promotion, and the failures in a row after
    which a tier is not asked about a key until the key is stored to it again."""

    timeout: float = DEFAULT_TIMEOUT
    backoff: float = DEFAULT_BACKOFF
    max_failures: int = DEFAULT_MAX_FAILURES


@dataclass(eq=False)
class Promotion:
    """One key's promotion, from its reserved CPU slot to its job's result: the one place
    its state lives. ``loading``: handed to the tier in a job; ``expired``: past its deadline
    (its lookups answer ``MISS``; the slot stays reserved until the job reports)."""

    key: OffloadKey
    tier: TierRecord
    ctx: ReqContext
    slot: int
    reserved_at: float  # time.monotonic()
    loading: bool = False
    expired: bool = False


class Promotions:
    """Every promotion of one tiered manager, from the CPU miss to its job's result, counted
    into each tier's record."""

    def __init__(self, limits: PromotionLimits | None = None) -> None:
        self.limits = limits if limits is not None else PromotionLimits()
        #: Every key between *reserved* and its job's result, with its promotion.
        self.promoting: dict[OffloadKey, Promotion] = {}
        #: (tier, req_id) -> the promotions waiting for the step end: one job each group.
        self.queued: dict[tuple[TierRecord, str], list[Promotion]] = {}
        #: req_id -> keys its lookups answered HIT or PENDING (protected from its promotions).
        self.found: dict[str, set[OffloadKey]] = {}
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
        for (tier, _), group in self.queued.items():
            out[tier.name] = out.get(tier.name, 0) + len(group)
        return out

    def blocks_queued(self) -> int:
        return sum(len(group) for group in self.queued.values())

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
        for tier in tiers:
            stats = tier.stats
            failures = tier.failures
            if failures:
                record = failures.get(key)
                if record is not None and time.monotonic() < record.retry_at:
                    stats.backed_off_lookups += 1
                    continue
            stats.lookups += 1
            try:
                held = tier.plugin.lookup(key, ctx)
            except Exception as exc:  # contained: a miss for this tier (tiering/faults.py)
                stats.lookup_errors += 1
                tier.faults.report("lookup", exc, "the key is a miss there")
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
                tier.faults.report(
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
        promotion = self.promoting[key] = Promotion(key, tier, ctx, slot, time.monotonic())
        self.queued.setdefault((tier, ctx.req_id), []).append(promotion)
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
            promotion.tier.faults.report(
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
        """reserved -> loading: the queued loads (of one request, or all) to submit now, one
        job each, as (tier, context, keys, slots)."""
        queued = self.queued
        if not queued:
            return []
        jobs = []
        for group in [g for g in queued if req_id is None or g[1] == req_id]:
            promotions = queued.pop(group)
            for promotion in promotions:
                promotion.loading = True
            keys = [p.key for p in promotions]
            jobs.append((group[0], promotions[0].ctx, keys, [p.slot for p in promotions]))
        return jobs

    def finish_request(self, req_id: str) -> None:
        """The request finished (its queued loads were taken): its found keys are
        unprotected, its "ask again" waits forgotten."""
        self.found.pop(req_id, None)
        self._asked_again.pop(req_id, None)

    def cancel_queued(self) -> list[tuple[ReqContext, list[OffloadKey]]]:
        """``reset_cache``: drop every queued load (never submitted); the manager fails their
        CPU stores, which frees the slots."""
        dropped = []
        for promotions in self.queued.values():
            for promotion in promotions:
                self.promoting.pop(promotion.key, None)
            dropped.append((promotions[0].ctx, [p.key for p in promotions]))
        self.queued.clear()
        self.found.clear()
        return dropped

    # -- loading -> landed | failed -> backoff ------------------------------------------------

    def ended(self, tier: TierRecord, keys: list[OffloadKey], failed: list[OffloadKey]) -> None:
        """loading -> landed (the key's failure record is cleared) or failed -> backoff."""
        promoting = self.promoting
        for key in keys:
            promoting.pop(key, None)
        failures = tier.failures
        failed_set = set(failed)
        now = time.monotonic()
        for key in keys:
            if key in failed_set:
                self._failed(tier, key, now)
            elif failures:
                failures.pop(key, None)

    def _failed(self, tier: TierRecord, key: OffloadKey, now: float) -> None:
        """failed -> backoff: not asked for ``backoff * 2**(n-1)`` seconds after the n-th
        failure in a row; after ``max_failures``, not until the key is stored there again."""
        failures = tier.failures
        record = failures.pop(key, None)  # re-inserted last: newest
        count = 1 if record is None else record.count + 1
        limits = self.limits
        last = count >= limits.max_failures
        retry_at = math.inf if last else now + limits.backoff * (1 << (count - 1))
        failures[key] = Backoff(count, retry_at)
        if len(failures) > MAX_RECORDS:
            del failures[next(iter(failures))]

    def stored(self, tier: TierRecord, keys: list[OffloadKey]) -> None:
        """``keys`` were stored to ``tier`` again: it may be asked about them again."""
        failures = tier.failures
        if failures:
            for key in keys:
                failures.pop(key, None)
