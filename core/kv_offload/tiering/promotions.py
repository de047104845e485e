"""Promotions: a CPU miss that a secondary tier holds becomes a pending CPU store.

The tiered manager's ``lookup`` asks the tiers on a CPU miss (:meth:`Promotions.ask_tiers`);
for a key a tier holds, :meth:`Promotions.reserve` reserves a
CPU slot for it at once (a pending store in the CPU tier, so ``lookup`` answers ``PENDING`` and
the slot cannot be evicted) and queues the load from the tier. Queued loads are submitted
together at the end of the scheduler step (one job per tier and request), or when the request
finishes. Keys a request found (``HIT`` or ``PENDING``) stay protected from that request's own
later promotions: evicting an earlier hit of the same prefix would break its ``prepare_load``.
"""

from __future__ import annotations

from ..cpu import CPUOffloadingManager
from ..cpu.validation import short
from ..errors import KeyStateError, ManagerError, PluginError
from ..keys import OffloadKey
from ..plugins import HookErrorLog
from ..types import LookupResult, ReqContext
from .base import JobDirection, SecondaryTierManager
from .jobs import JobTable

__all__ = ["Promotions"]

_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING


class Promotions:
    """Reserved CPU slots waiting for their tier load, and what each request found."""

    def __init__(
        self,
        primary: CPUOffloadingManager,
        tiers: list[SecondaryTierManager],
        jobs: JobTable,
        errors: HookErrorLog,
    ) -> None:
        self._primary = primary
        self._tiers = tiers
        self._jobs = jobs
        self._errors = errors
        # (tier index, req_id) -> (context, keys, slots) promotions waiting for the step end
        self.queued: dict[tuple[int, str], tuple[ReqContext, list[OffloadKey], list[int]]] = {}
        # req_id -> keys its lookups answered HIT or PENDING (protected from its promotions)
        self.found: dict[str, set[OffloadKey]] = {}

    def note_found(self, req_id: str, key: OffloadKey) -> None:
        self.found.setdefault(req_id, set()).add(key)

    def ask_tiers(self, indices: tuple[int, ...], key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """A CPU miss: the first of the tiers at ``indices`` that holds ``key`` promotes it
        (:meth:`reserve`); ``PENDING`` if none does but one said "ask again" (``None``), else
        ``MISS``. A tier whose ``lookup`` raises or answers something other than True, False
        or None counts as a miss there; so does a tier backing off from the key after a
        failed promotion, or one that said "ask again" for longer than the promotion timeout
        (:mod:`kv_offload.tiering.promotion_limits`)."""
        ask_again = False
        tiers = self._tiers
        stats = self._jobs.stats
        limits = self._jobs.limits
        for index in indices:
            if not limits.may_ask(index, key):
                stats[index].backed_off_lookups += 1
                continue
            stats[index].lookups += 1
            try:
                held = tiers[index].lookup(key, ctx)
            except Exception as exc:  # contained: a miss for this tier (tiering/faults.py)
                stats[index].lookup_errors += 1
                self._jobs.faults.report(
                    tiers[index].name, "lookup", exc, "the key is a miss there"
                )
                continue
            if held is True:
                limits.answered(ctx.req_id, key)
                return self.reserve(index, key, ctx)
            if held is None:
                if limits.asked_again(ctx.req_id, key):
                    ask_again = True
                else:
                    stats[index].ask_again_timeouts += 1
            elif held is not False:
                stats[index].contract_errors += 1
                self._jobs.faults.report(
                    tiers[index].name,
                    "lookup",
                    PluginError(
                        f"lookup() returned {type(held).__name__} {held!r:.40}; a tier's "
                        f"lookup must return True, False or None",
                        kind="tier",
                        plugin=tiers[index].name,
                    ),
                    "the key is a miss there",
                )
        if not ask_again:
            limits.answered(ctx.req_id, key)
            return _MISS
        return _PENDING

    def expired(self, key: OffloadKey) -> bool:
        """Whether ``key``, answered ``PENDING`` by the CPU tier, is a promotion past its
        deadline (then the lookup answers ``MISS``; the slot waits for the job)."""
        jobs = self._jobs
        if key not in jobs.promoting:
            return False
        limits = jobs.limits
        index = limits.newly_expired(key)
        if index is not None:
            jobs.stats[index].expired_promotions += 1
            jobs.faults.report(
                self._tiers[index].name,
                "promotion",
                ManagerError(
                    f"a promotion did not land within {limits.timeout:g} s (promotion_timeout_s)"
                ),
                "the key is answered MISS; its CPU slot stays reserved until the job reports",
            )
        return key in limits.expired

    def reserve(self, index: int, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """Reserve a CPU slot for ``key``, held by tier ``index``, and queue its load:
        ``PENDING``, or ``MISS`` when no CPU slot can be freed (or an admission hook said no)."""
        self._jobs.stats[index].lookup_hits += 1
        protected = self.found.get(ctx.req_id, ())
        # A store-admission hook raises before anything changed (and so does this call); an
        # eviction hook raises after the slot was reserved: queue the promotion, then report.
        # A promotion is not an offer: the reuse filter admitted the block when it was stored.
        out = self._errors.call(
            self._primary.prepare_store, [key], ctx, protected=protected, bypass_reuse_filter=True
        )
        if out is None or not out.keys_to_store:
            self._errors.raise_pending()  # an admission hook raised: nothing changed
            self._jobs.stats[index].refused_promotions += 1
            return _MISS
        self._jobs.promoting.add(key)
        self._jobs.limits.reserved(index, key)
        _, keys, slots = self.queued.setdefault((index, ctx.req_id), (ctx, [], []))
        keys.append(key)
        slots.append(int(out.store_spec.block_ids[0]))
        self.note_found(ctx.req_id, key)
        self._errors.raise_pending()
        return _PENDING

    def check_not_promoting(self, keys: list[OffloadKey], operation: str) -> None:
        """Raise if the engine completes a store of a key a promotion reserved: its slot is
        written by the tier's load, and completed by the tiered manager when that lands."""
        promoting = self._jobs.promoting
        if promoting and not promoting.isdisjoint(keys):
            key = next(k for k in keys if k in promoting)
            raise KeyStateError(
                f"{operation}: key {short(key)} is being promoted from a secondary tier, "
                f"not stored by the engine; pass the keys_to_store of prepare_store",
                key=key,
                operation=operation,
            )

    def submit(self, req_id: str | None = None) -> None:
        """Submit the queued loads (of one request, or all) as tier jobs."""
        for group in [g for g in self.queued if req_id is None or g[1] == req_id]:
            ctx, keys, slots = self.queued.pop(group)
            self._jobs.submit(group[0], JobDirection.LOAD, keys, slots, ctx)

    def finish(self, req_id: str) -> None:
        """The request finished: its queued loads go out, its found keys are unprotected."""
        self.submit(req_id)
        self.found.pop(req_id, None)
        self._jobs.limits.request_finished(req_id)

    def cancel(self) -> None:
        """Drop every queued load (never submitted): their CPU stores fail, slots free."""
        for ctx, keys, _ in self.queued.values():
            self._jobs.promoting.difference_update(keys)
            self._errors.call(self._primary.complete_store, keys, ctx, False)
        self.queued.clear()
        self.found.clear()

    def blocks_queued(self) -> int:
        return sum(len(keys) for _, keys, _ in self.queued.values())
