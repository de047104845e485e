"""One record per secondary tier, owned by the tiered manager.

A tier plugin (:class:`~kv_offload.tiering.SecondaryTierManager`) moves bytes; everything the
stack decides about it lives here, in the manager, and nowhere on the plugin:

* :class:`TierEntry` is what a caller hands the manager for one tier: the plugin and the
  settings of its ``[[tiers]]`` entry (name, locality, cascade gate, write policy,
  admission). :meth:`~kv_offload.tiering.SecondaryTierFactory.create_tier_entry` builds one
  from a config dict; a bare plugin stands for an entry with the defaults.
* :class:`TierRecord` is the manager's record of one tier: the entry's settings, resolved
  (the name the stack calls it by), with the tier's counters, its write bookkeeping, the
  time its results were last collected, its promotion failure records and its fault
  reports. The job table, the promotions, the request scope and the write policies all
  hold records, never positions in parallel lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..keys import OffloadKey
from ..tier_types import Locality, Medium
from ..types import TierStats
from .base import SecondaryTierManager
from .cascade_gate import CascadeGate, build_gate, merged_table
from .faults import TierFaults
from .names import tier_names
from .writes import TierWrites, WritePolicy

if TYPE_CHECKING:
    from ..admission import AdmissionPolicy

__all__ = ["Backoff", "TierEntry", "TierRecord", "tier_records"]


@dataclass(frozen=True)
class TierEntry:
    """A tier plugin and the stack's settings for it (one ``[[tiers]]`` entry).

    ``name``: what stats, events, hooks and ``kv-offload replay`` call the tier (``None``:
    its type, or ``<position>:<type>`` for a repeated type, :mod:`kv_offload.tiering.names`).
    ``locality``: where its storage lives, for tier filters and the backpressure defaults
    (``None``: unknown). ``cascade_gate``: its backpressure (``None``: cascades are never
    dropped, unless the manager's ``backpressure=`` default gives it one). ``write_policy``
    and ``admission``: when the tier is written and which blocks
    (:mod:`kv_offload.tiering.writes`)."""

    tier: SecondaryTierManager
    name: str | None = None
    locality: Locality | None = None
    cascade_gate: CascadeGate | None = None
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH
    admission: AdmissionPolicy | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tier, SecondaryTierManager):
            raise ConfigError(
                f"TierEntry.tier must be a kv_offload.tiering.SecondaryTierManager, got "
                f"{type(self.tier).__name__} {self.tier!r:.60}"
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError(
                f"tier {self.tier.tier_type!r}: 'name' must be a non-empty string, got "
                f"{self.name!r}"
            )


@dataclass
class Backoff:
    """A key whose promotion from a tier failed ``count`` times in a row: the tier is not
    asked about it before ``retry_at`` (``time.monotonic()``; ``inf``: until it is stored
    there again)."""

    count: int
    retry_at: float


class TierRecord:
    """The tiered manager's record of one secondary tier (see the module docstring).

    ``plugin`` is the tier; ``name``, ``medium``, ``locality``, ``gate`` and ``writes`` (its
    write policy, admission and their counters) are the stack's settings for it;
    ``stats`` its counters (replaced on ``reset_cache``); ``last_poll`` the
    ``time.monotonic()`` of the last collection of its results (a gated tier's jobs are timed
    to it, :mod:`kv_offload.tiering.jobs`); ``failures`` its promotion failure records;
    ``faults`` the reports of its plugin's raising calls (:mod:`kv_offload.tiering.faults`).
    """

    __slots__ = (
        "failures",
        "faults",
        "gate",
        "last_poll",
        "locality",
        "medium",
        "name",
        "plugin",
        "stats",
        "writes",
    )

    def __init__(self, entry: TierEntry, name: str) -> None:
        self.plugin = entry.tier
        self.name = name
        self.medium: Medium | None = type(entry.tier).medium
        self.locality = entry.locality
        self.gate = entry.cascade_gate
        self.writes = TierWrites(name, entry.write_policy, entry.admission)
        self.stats = TierStats(name)
        self.last_poll = 0.0
        #: Keys whose promotion from this tier failed lately: not asked until ``retry_at``
        #: (:mod:`kv_offload.tiering.promotions`, kept across ``reset_cache``).
        self.failures: dict[OffloadKey, Backoff] = {}
        #: The rate-limited log of its plugin's raising calls (kept across ``reset_cache``).
        self.faults = TierFaults(name)

    def entry(self) -> TierEntry:
        """The tier's settings as an entry, under the name the stack calls it by."""
        return TierEntry(
            self.plugin,
            self.name,
            self.locality,
            self.gate,
            self.writes.policy,
            self.writes.admission,
        )

    def __repr__(self) -> str:
        return f"TierRecord({self.name!r}, {type(self.plugin).__qualname__})"


def tier_records(
    tiers: Sequence[SecondaryTierManager | TierEntry],
    backpressure: Mapping[str, Any] | None = None,
) -> list[TierRecord]:
    """A record per tier, in order: names resolved by the rule of
    :mod:`kv_offload.tiering.names` (a :class:`~kv_offload.tiering.names.TierNameError` for
    two tiers called alike), and the ``backpressure`` default table (a config's global
    ``[backpressure]``, or ``None``) gating every entry that has no gate of its own."""
    entries = [t if isinstance(t, TierEntry) else TierEntry(t) for t in tiers]
    names = tier_names([(e.tier.tier_type, e.name) for e in entries])
    if backpressure is not None:
        table = merged_table(backpressure, None)
        entries = [
            e
            if e.cascade_gate is not None
            else replace(e, cascade_gate=build_gate(table, name, e.locality or Locality.LOCAL))
            for e, name in zip(entries, names)
        ]
    return [TierRecord(entry, name) for entry, name in zip(entries, names)]
