"""Per-request choices of the tiered manager: request-level offload and tier filters.

* **Request-level offload** (vLLM's ``OffloadPolicy.REQUEST_LEVEL``). A tier whose
  ``on_new_request`` answers ``REQUEST_LEVEL`` is sent every block of that request: besides
  the usual cascade of the blocks the request stores, ``prepare_store`` cascades the
  request's blocks that are already in the CPU tier (prefix hits) to those tiers. A block
  still being written by an engine store is cascaded to every tier when that store completes
  (the usual cascade); one still being promoted from a tier is parked and cascaded at a later
  ``on_schedule_end`` once it landed (dropped if the promotion failed, or when the request
  finishes first). Requests no tier asked about cost nothing.
* **Engine pins** (:class:`LoadPins`): which keys an engine's ``prepare_load`` pinned and its
  ``complete_load`` has not released, so a second ``complete_load`` cannot take a cascade's pin.
* **Tier filters** (``ReqContext.load_tier_filter``, vLLM's ``TierFilter``): the tiers a
  request's ``lookup`` may ask, resolved once per distinct filter to the tiers' records. A filter
  naming a tier the stack does not have is an :class:`~kv_offload.errors.InvalidArgumentError`.

It decides (which keys to cascade to which tiers, which tiers a lookup asks) and the tiered
manager acts: it reads the CPU tier's ref counts and pins what is cascaded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..cpu.validation import short
from ..errors import InvalidArgumentError, KeyStateError
from ..keys import OffloadKey
from ..tier_types import OffloadPolicy, RequestOffloadingContext, TierFilter
from ..types import ReqContext
from .record import TierRecord

__all__ = ["LoadPins", "RequestScope", "WholeRequest"]

_CHUNK = RequestOffloadingContext()
_REQUEST = RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)


@dataclass
class WholeRequest:
    """A request some tiers want whole: those tiers, and its parked keys."""

    context: ReqContext
    tiers: list[TierRecord]
    parked: list[OffloadKey] = field(default_factory=list)


class LoadPins:
    """The engine's pins (``prepare_load`` minus ``complete_load``) per key. A block may also
    be pinned by a cascade job; without this count a second ``complete_load`` of a key would
    take the cascade's pin and let the block be evicted while a tier reads it."""

    def __init__(self) -> None:
        self._pins: Counter[OffloadKey] = Counter()

    def add(self, keys: Iterable[OffloadKey]) -> None:
        self._pins.update(keys)

    def check_pinned(self, keys: list[OffloadKey]) -> None:
        """Raise :class:`~kv_offload.errors.KeyStateError` naming the first key the engine
        has not pinned (an unhashable key is left for the CPU tier to name)."""
        pins = self._pins
        try:
            unpinned = next((k for k in keys if pins.get(k, 0) <= 0), None)
        except TypeError:
            return
        if unpinned is not None:
            raise KeyStateError(
                f"complete_load: key {short(unpinned)} is not pinned by a prepare_load "
                f"(completed already, or never prepared); call complete_load once per "
                f"prepare_load",
                key=unpinned,
                operation="complete_load",
            )

    def release(self, keys: list[OffloadKey]) -> None:
        pins = self._pins
        pins.subtract(keys)
        for key in keys:
            if pins[key] <= 0:
                del pins[key]

    def clear(self) -> None:
        self._pins.clear()


class RequestScope:
    """Which requests are request-level (for which tiers) and what each tier filter allows."""

    def __init__(self, tiers: Sequence[TierRecord]) -> None:
        self._names = [tier.name for tier in tiers]
        #: req_id -> the request-level state of requests some tier wants whole.
        self.whole: dict[str, WholeRequest] = {}
        self._allowed: dict[TierFilter, tuple[TierRecord, ...]] = {}
        #: Every tier, in cascade order (no filter).
        self.all_tiers = tuple(tiers)

    def start(self, ctx: ReqContext) -> RequestOffloadingContext:
        """Ask every tier for its policy; ``REQUEST_LEVEL`` if any tier wants the request."""
        wanted = []
        for tier in self.all_tiers:
            answer = tier.plugin.on_new_request(ctx)
            if answer is not None and answer.policy is OffloadPolicy.REQUEST_LEVEL:
                wanted.append(tier)
        if not wanted:
            self.whole.pop(ctx.req_id, None)
            return _CHUNK
        self.whole[ctx.req_id] = WholeRequest(ctx, wanted)
        return _REQUEST

    def finish(self, req_id: str) -> None:
        self.whole.pop(req_id, None)

    def ready(
        self,
        whole: WholeRequest,
        keys: list[OffloadKey],
        promoting: Collection[OffloadKey],
        ref_count: Callable[[OffloadKey], int | None],
    ) -> list[OffloadKey]:
        """Which of the request's ``keys`` to cascade to ``whole.tiers`` now: the readable
        ones (``ref_count``, the CPU tier's: ``None`` absent, below 0 being written). Keys
        being promoted (``promoting``, the promotions' record) are parked for a later step;
        absent keys and keys an engine store is writing are left out (that store's
        ``complete_store`` cascades them to every tier)."""
        ready = []
        for key in keys:
            if key in promoting:
                whole.parked.append(key)
                continue
            count = ref_count(key)
            if count is not None and count >= 0:
                ready.append(key)
        return ready

    def take_parked(self) -> Iterator[tuple[WholeRequest, list[OffloadKey]]]:
        """Each request's parked keys, taken off it (``on_schedule_end`` asks again whether
        their promotion landed)."""
        for whole in list(self.whole.values()):
            if whole.parked:
                keys, whole.parked = whole.parked, []
                yield whole, keys

    def tiers_for(self, ctx: ReqContext) -> tuple[TierRecord, ...]:
        """The tiers the request's lookups may ask, in order (all of them
        without a ``load_tier_filter``; a context that is not a ``ReqContext`` is the CPU
        tier's to refuse)."""
        tier_filter = getattr(ctx, "load_tier_filter", None)
        return self.all_tiers if tier_filter is None else self.allowed(tier_filter)

    def allowed(self, tier_filter: TierFilter) -> tuple[TierRecord, ...]:
        """The tiers ``tier_filter`` lets a lookup ask, in order."""
        found = self._allowed.get(tier_filter)
        if found is not None:
            return found
        if not isinstance(tier_filter, TierFilter):
            raise InvalidArgumentError(
                f"ReqContext.load_tier_filter must be a kv_offload.TierFilter or None, got "
                f"{tier_filter!r}"
            )
        if tier_filter.tiers is not None:
            unknown = sorted(set(tier_filter.tiers) - set(self._names))
            if unknown:
                raise InvalidArgumentError(
                    f"TierFilter names tier(s) {', '.join(map(repr, unknown))} that this stack "
                    f"does not have; its tiers are: {', '.join(map(repr, self._names)) or 'none'}"
                )
        allowed = tuple(
            tier
            for tier in self.all_tiers
            if tier_filter.allows(tier.name, tier.medium, tier.locality)
        )
        if len(self._allowed) < 256:  # filters are few; never let a stream of them grow this
            self._allowed[tier_filter] = allowed
        return allowed
