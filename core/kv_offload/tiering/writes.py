"""What each secondary tier writes, and when: write policies, admission, write-back staging.

Each tier has a **write policy** (``write_policy`` in its ``[[tiers]]`` table):

* ``write-through`` (the default, vLLM's behaviour): every block the CPU tier stores is
  cascaded to the tier when its CPU store completes.
* ``write-through-selective``: the same, for the blocks the tier's admission admits; without
  an ``admission`` key it is ``store-threshold`` (a block is written once the CPU tier has
  stored it twice: it was evicted and came back, so it is reused).
* ``write-back``: a block is written to the tier when the CPU tier evicts it, and only if it
  came from the engine (a block promoted from a tier is in that tier already). The CPU and
  the tier then hold different blocks, which raises the stack's hit ratio, and a block
  evicted before it is ever needed again is written once instead of on every store.

An **admission** (:mod:`kv_offload.admission`) filters any of them: ``admission = "NAME"``.

Write-back never loses a block it took: the eviction copies each victim's bytes into a
**staging row** before its CPU slot is reused (rows past the CPU tier's own in the same KV
buffer, so a tier's job reads them like any slot), and the row is freed only when every
write-back tier's job for it has ended. While a block is staged a lookup finds it: the bytes
are copied back into a CPU slot and the lookup answers ``HIT``. When the staging rows are
all in use a store first waits, bounded by the drain timeout, for write-back jobs to end;
victims that still find no row are not written (counted as ``write_back_dropped``). What
write-back means for a shared tier (other engines see a block only once it is evicted here)
and for a crash (blocks not yet evicted are not on the tier) is in docs/architecture.md.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..admission import AdmissionPolicy, checked_admit, overrides
from ..errors import ConfigError, PluginError
from ..keys import OffloadKey
from ..types import ReqContext

__all__ = [
    "WRITE_POLICIES",
    "StagingRows",
    "TierWrites",
    "WritePolicy",
    "check_admission_args",
    "parse_write_policy",
]

logger = logging.getLogger("kv_offload.tiering")


class WritePolicy(enum.Enum):
    """When a secondary tier is written (see the module docstring)."""

    WRITE_THROUGH = "write-through"
    WRITE_THROUGH_SELECTIVE = "write-through-selective"
    WRITE_BACK = "write-back"


WRITE_POLICIES: tuple[str, ...] = tuple(p.value for p in WritePolicy)


def parse_write_policy(value: Any, tier: str) -> WritePolicy:
    """``value`` as a :class:`WritePolicy`; a :class:`~kv_offload.errors.ConfigError` naming
    the tier, the accepted values and the closest one otherwise."""
    if isinstance(value, WritePolicy):
        return value
    for policy in WritePolicy:
        if policy.value == value:
            return policy
    from ..config.locate import did_you_mean

    hint = did_you_mean(value, set(WRITE_POLICIES)) if isinstance(value, str) else ""
    raise ConfigError(
        f"tier {tier!r}: write_policy must be one of {', '.join(map(repr, WRITE_POLICIES))}, "
        f"got {value!r}{hint}",
        key="write_policy",
    )


@dataclass
class TierWrites:
    """One tier's write policy and admission, and the counters of what they decided."""

    name: str
    policy: WritePolicy = WritePolicy.WRITE_THROUGH
    admission: AdmissionPolicy | None = None
    admission_name: str = ""
    #: The admission's ``record_lookup`` if it overrides it (else never called).
    record_lookup: Callable[[OffloadKey, ReqContext], None] | None = field(default=None, repr=False)
    on_request_finished: Callable[[ReqContext], None] | None = field(default=None, repr=False)
    refused_blocks: int = 0
    admission_errors: int = 0

    def __post_init__(self) -> None:
        if self.admission is not None:
            self.record_lookup = overrides(self.admission, "record_lookup")
            self.on_request_finished = overrides(self.admission, "on_request_finished")

    @property
    def write_back(self) -> bool:
        return self.policy is WritePolicy.WRITE_BACK

    def admit(
        self, keys: list[OffloadKey], ctx: ReqContext, errors: list[PluginError]
    ) -> list[OffloadKey]:
        """The keys to write to the tier (call only with an admission); a broken admission
        admits none of them and its error is appended to ``errors`` (raised when the
        manager's call ends)."""
        if self.admission is None:  # pragma: no cover - the manager checks first
            return keys
        try:
            admitted = checked_admit(self.admission, self.admission_name, keys, ctx)
        except PluginError as exc:
            self.admission_errors += 1
            self.refused_blocks += len(keys)
            errors.append(exc)
            return []
        self.refused_blocks += len(keys) - len(admitted)
        return admitted

    def reset_counters(self) -> None:
        self.refused_blocks = self.admission_errors = 0


class StagingRows:
    """Rows of the KV buffer past the CPU tier's own, holding evicted blocks' bytes until
    their write-back jobs end; and which CPU blocks are *dirty* (stored by the engine and not
    yet written back).

    A staged key has one row whatever the number of write-back tiers; the row counts the jobs
    reading it and is freed when the last one ends (or at once when no tier admitted it).
    """

    def __init__(self, array: npt.NDArray[np.uint8], first_row: int) -> None:
        self._array = array
        self.first_row = first_row
        self.capacity = array.shape[0] - first_row
        self._free = list(range(array.shape[0] - 1, first_row - 1, -1))
        #: key -> its staging row, for staged keys.
        self.rows: dict[OffloadKey, int] = {}
        #: row -> jobs still reading it.
        self._readers: dict[int, int] = {}
        #: CPU blocks stored by the engine and not written back yet.
        self.dirty: set[OffloadKey] = set()
        #: Victims that found no free row, per eviction (the manager counts them per tier).
        self.dropped = 0

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_flight(self) -> bool:
        """Whether a write-back job is reading a staging row (a row may free up)."""
        return bool(self._readers)

    def stage(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> list[OffloadKey]:
        """Copy the dirty victims among ``keys`` (their CPU ``slots`` are about to be reused)
        into free rows; returns the keys staged now, in order. Victims that find no row are
        dropped (counted in :attr:`dropped`)."""
        dirty = self.dirty
        rows = self.rows
        taken: list[OffloadKey] = []
        sources: list[int] = []
        targets: list[int] = []
        for key, slot in zip(keys, slots):
            if key not in dirty:
                continue
            dirty.discard(key)
            if key in rows:
                continue  # the same key (the same bytes) is staged already
            if not self._free:
                self.dropped += 1
                continue
            row = self._free.pop()
            rows[key] = row
            self._readers[row] = 0
            taken.append(key)
            sources.append(int(slot))
            targets.append(row)
        if targets:
            self._array[targets] = self._array[sources]
        return taken

    def row_of(self, key: OffloadKey) -> int | None:
        return self.rows.get(key)

    def hold(self, keys: Sequence[OffloadKey]) -> None:
        """One more reader (a tier that will write it) for each key's row."""
        readers = self._readers
        rows = self.rows
        for key in keys:
            readers[rows[key]] += 1

    def rows_of(self, keys: Sequence[OffloadKey]) -> list[int]:
        rows = self.rows
        return [rows[key] for key in keys]

    def release(self, keys: Sequence[OffloadKey]) -> None:
        """One job reading each key's row ended (or a key no job took): free rows no job
        reads any more."""
        for key in keys:
            row = self.rows.get(key)
            if row is None:
                continue
            left = self._readers[row] - 1
            if left > 0:
                self._readers[row] = left
            else:
                del self._readers[row], self.rows[key]
                self._free.append(row)

    def copy_out(self, key: OffloadKey, slot: int) -> None:
        """Copy a staged key's bytes into CPU ``slot`` (a lookup found it staged)."""
        self._array[slot] = self._array[self.rows[key]]

    def clear_dirty(self) -> None:
        self.dirty.clear()


def check_admission_args(tier: str, admission: Any, options: Any) -> None:
    if admission is not None and (not isinstance(admission, str) or not admission.strip()):
        raise ConfigError(
            f"tier {tier!r}: admission must be an admission plugin name, got {admission!r}",
            key="admission",
        )
    if options is not None and not isinstance(options, dict):
        raise ConfigError(
            f"tier {tier!r}: admission_options must be a table of the admission's settings, "
            f"got {options!r}",
            key="admission_options",
        )
    if options and admission is None:
        raise ConfigError(
            f"tier {tier!r}: admission_options without admission; name the admission plugin "
            f'(admission = "NAME")',
            key="admission_options",
        )
