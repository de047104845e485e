"""The small value types of the manager API: requests, lookup answers, specs, events, stats.

They carry no behaviour beyond their own fields, so every other module may import them.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgumentError
from .keys import OffloadKey
from .tier_types import TierFilter

__all__ = [
    "CPULoadStoreSpec",
    "LoadStoreSpec",
    "LookupResult",
    "OffloadingEvent",
    "OffloadingStats",
    "PrepareStoreOutput",
    "ReqContext",
    "SizeHistogram",
    "TierStats",
    "TieringStats",
    "check_load_filter",
]

_T = TypeVar("_T")
_INT64 = np.dtype(np.int64)  # a dtype object skips numpy's per-call dtype parsing


@dataclass
class ReqContext:
    """Identifies the request a call is made for.

    ``req_id`` is required: policies group work by request and hooks report it. ``state`` is a
    scratch space keyed by type so a policy, tier or hook can parse request data once (for
    example in ``on_new_request``) and read it back on later calls.

    Key positions (vLLM 0.33's ``set_offload_key_position``): the end token of each key in the
    request, recorded by the caller as vLLM's scheduler records them. Stores can reach the
    manager out of prefix order (sliding-window backfills), so a policy that orders a
    request's keys head to tail reads the positions rather than the call order
    (``prefix-lru`` and ``vllm-arc`` do; a context without positions keeps the call order).
    """

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    #: Which secondary tiers this request's lookups may ask (``None``: all of them).
    load_tier_filter: TierFilter | None = None
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False, compare=False)
    _positions: dict[OffloadKey, int] = field(
        default_factory=dict, repr=False, init=False, compare=False
    )

    def __post_init__(self) -> None:
        # Hooks, stats and tiers key per-request work by req_id; an int that equals another
        # request's str id (or None) would merge or drop their state silently.
        if not isinstance(self.req_id, str):
            raise InvalidArgumentError(
                f"ReqContext: req_id must be a str, got {type(self.req_id).__name__} "
                f"{self.req_id!r} (use str({self.req_id!r}))"
            )

    def set_state(self, value: Any) -> None:
        self._state[type(value)] = value

    def get_state(self, cls: type[_T]) -> _T | None:
        return self._state.get(cls)

    def pop_state(self, cls: type[_T]) -> _T | None:
        """Remove and return the state of type ``cls`` (``None`` if there is none): for state
        that is useless once the request ends, while the caller may keep the context."""
        state: _T | None = self._state.pop(cls, None)
        return state

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        """Record ``key``'s end token in this request (the last call for a key wins)."""
        self._positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        """``key``'s recorded end token, or ``None`` if none was recorded."""
        return self._positions.get(key)


def check_load_filter(req_context: Any) -> None:
    """The ``load_tier_filter`` of a request to a manager without secondary tiers (the CPU
    manager alone): a filter naming tiers names tiers this stack does not have (the error a
    tiered stack gives for an unknown name); a filter by medium or locality matches nothing
    and is allowed."""
    try:
        tier_filter = req_context.load_tier_filter
    except AttributeError:
        return
    if tier_filter is None:
        return
    if not isinstance(tier_filter, TierFilter):
        raise InvalidArgumentError(
            f"ReqContext.load_tier_filter must be a kv_offload.TierFilter or None, got "
            f"{tier_filter!r}"
        )
    if tier_filter.tiers:
        names = ", ".join(map(repr, sorted(tier_filter.tiers)))
        raise InvalidArgumentError(
            f"TierFilter names tier(s) {names} that this stack does not have; its tiers are: "
            f"none (a CPU-only manager)"
        )


class LookupResult(Enum):
    """The answer of a single-block lookup.

    ``HIT``: loadable now. ``MISS``: absent. ``PENDING``: present or arriving, but a store or
    promotion is still in flight, or a secondary tier has not answered yet; ask again after
    the engine's next step (vLLM's ``HIT_PENDING`` and ``RETRY`` both map here).
    """

    MISS = "miss"
    HIT = "hit"
    PENDING = "pending"


class LoadStoreSpec:
    """Base of the medium-specific descriptions a worker needs to move blocks."""

    medium: str = ""


class CPULoadStoreSpec(LoadStoreSpec):
    """CPU slot ids, one per key and in the caller's key order, as an ``int64`` array.

    The ids index the rows of the CPU KV buffer; an array (not a list) lets a worker hand them
    to numpy or torch indexing without a Python loop.
    """

    medium = "CPU"
    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Sequence[int] | npt.NDArray[np.int64]) -> None:
        if isinstance(block_ids, list):
            # array('q') converts int subclasses (BlockStatus) in C, ~4x faster than numpy's
            # per-object path; frombuffer then wraps it without a copy.
            self.block_ids = np.frombuffer(array("q", block_ids), _INT64)
        else:
            self.block_ids = np.asarray(block_ids, _INT64)

    def __len__(self) -> int:
        return len(self.block_ids)

    def __repr__(self) -> str:
        return f"CPULoadStoreSpec({self.block_ids.tolist()!r})"


@dataclass
class PrepareStoreOutput:
    """Result of ``prepare_store``: the keys the worker must write, where, and what made room."""

    keys_to_store: list[OffloadKey]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """A batch of keys that became loadable (``removed=False``) or left (``removed=True``)
    the medium named by ``medium`` (``"CPU"`` or a secondary tier's name).

    ``metadata_only`` (always with ``removed``): the keys' stores failed, so they were never
    loadable there; only bookkeeping of offered keys needs undoing (vLLM's field of the same
    name). Such keys stored again before the events were taken are left out.
    """

    keys: list[OffloadKey]
    medium: str
    removed: bool
    metadata_only: bool = False


#: Upper bounds (``le``) of the allocation-size histogram's buckets: vLLM 0.33's, in blocks.
ALLOCATION_SIZE_BOUNDS: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


@dataclass(frozen=True)
class SizeHistogram:
    """Observed sizes in buckets: ``counts[i]`` sizes ``<= bounds[i]`` (and above the bound
    before), ``counts[-1]`` sizes above the last bound; ``total`` is their sum."""

    bounds: tuple[int, ...] = ALLOCATION_SIZE_BOUNDS
    counts: tuple[int, ...] = (0,) * (len(ALLOCATION_SIZE_BOUNDS) + 1)
    total: int = 0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, observations <= le)`` per bucket, ending with ``(inf, count)``: the shape
        of a Prometheus histogram."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append((bound, running))
        return out


@dataclass(frozen=True)
class OffloadingStats:
    """Cumulative counters since construction (or ``reset_cache``) plus current occupancy.

    ``hits``, ``misses`` and ``pending`` partition ``lookups``. The usage figures are vLLM
    0.33's gauges: ``usage`` is the fraction of slots holding a block that cannot be evicted
    right now (pending or pinned), ``write_usage`` the part of it being written (a store in
    flight), ``read_usage`` the part being read (pinned by a load or a cascade);
    ``occupancy`` is the fraction holding any block. ``stores_skipped`` counts blocks the
    reuse filter did not store (``store_threshold``); ``allocation_sizes`` holds the number
    of slots each ``prepare_store`` asked for (calls that allocate nothing are not counted).
    """

    capacity: int
    lookups: int
    hits: int
    misses: int
    pending: int
    stored_blocks: int
    loaded_blocks: int
    failed_stores: int
    rejected_stores: int
    evictions: int
    resident_blocks: int
    free_blocks: int
    pending_blocks: int
    pinned_blocks: int
    evictable_blocks: int
    stores_skipped: int = 0
    allocation_sizes: SizeHistogram = field(default_factory=SizeHistogram)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def usage(self) -> float:
        return (self.pending_blocks + self.pinned_blocks) / self.capacity

    @property
    def write_usage(self) -> float:
        return self.pending_blocks / self.capacity

    @property
    def read_usage(self) -> float:
        # vLLM's max(usage - write_usage, 0): the pinned share, computed exactly.
        return self.pinned_blocks / self.capacity

    @property
    def occupancy(self) -> float:
        return self.resident_blocks / self.capacity

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            hit_ratio=self.hit_ratio,
            usage=self.usage,
            read_usage=self.read_usage,
            write_usage=self.write_usage,
            occupancy=self.occupancy,
        )
        return data


@dataclass
class TierStats:
    """Counters of one secondary tier, cumulative (restart at zero on ``reset_cache``).
    ``lookups`` counts the CPU misses this tier was asked about, ``lookup_hits`` those it
    held. ``lookup_errors`` and ``submit_errors`` count the calls to its ``lookup`` and
    ``submit_*`` that raised (see :mod:`kv_offload.tiering.faults`)."""

    name: str
    lookup_hits: int = 0
    promoted_blocks: int = 0
    failed_promotions: int = 0
    refused_promotions: int = 0
    cascaded_blocks: int = 0
    failed_cascades: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    lookups: int = 0  # last: existing positional uses keep their meaning
    lookup_errors: int = 0
    submit_errors: int = 0
    #: Cascade jobs (and their blocks) shed by the tier's backpressure gate.
    dropped_cascades: int = 0
    dropped_blocks: int = 0
    #: Cascade jobs in flight to the tier now, and the most at once (gated tiers only).
    cascades_in_flight: int = 0
    peak_cascades_in_flight: int = 0
    #: The gate's detector figures (e.g. ``store_s_per_mib``); empty without a gate.
    backpressure: dict[str, float] = field(default_factory=dict)
    #: Calls where the tier broke its contract without raising (a ``lookup`` answer that is
    #: not True/False/None, a ``get_finished`` item that is not a ``JobResult``).
    contract_errors: int = 0
    #: Promotions from this tier past their deadline (answered MISS; see
    #: :mod:`kv_offload.tiering.jobs`), and lookups of keys not asked of this
    #: tier because an earlier promotion of the key from it failed (backoff).
    expired_promotions: int = 0
    backed_off_lookups: int = 0
    #: "Ask again" (``None``) answers taken as a miss after the promotion timeout.
    ask_again_timeouts: int = 0
    #: When and which blocks the tier is written (:mod:`kv_offload.tiering.writes`): its
    #: write policy and admission (``""``: every block), the blocks its admission refused,
    #: and the admission's broken answers.
    write_policy: str = "write-through"
    admission: str = ""
    refused_blocks: int = 0
    admission_errors: int = 0
    #: Write-back only: evicted blocks not written because every staging row was in use,
    #: and lookups answered from a staging row (the block's write-back was in flight).
    write_back_dropped: int = 0
    write_back_rescued: int = 0


@dataclass(frozen=True)
class TieringStats:
    """The CPU tier's stats plus one :class:`TierStats` per secondary tier, in order."""

    cpu: OffloadingStats
    tiers: list[TierStats] = field(default_factory=list)
    jobs_in_flight: int = 0
    promotions_queued: int = 0
