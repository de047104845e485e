"""Counters of a tiered stack: one :class:`TierStats` per secondary tier."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import OffloadingStats

__all__ = ["TierStats", "TieringStats"]


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
