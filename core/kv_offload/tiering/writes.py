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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..admission import AdmissionPolicy, checked_admit, overrides
from ..errors import ConfigError, PluginError
from ..keys import OffloadKey
from ..plugins.dispatch import HookErrorLog
from ..types import ReqContext, TierStats
from .staging import StagingRows

if TYPE_CHECKING:
    from .record import TierRecord

__all__ = [
    "WRITE_POLICIES",
    "StackWrites",
    "StagingRows",
    "TierWrites",
    "WriteBack",
    "WritePolicy",
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


class TierWrites:
    """One tier's write policy and admission, and the counters of what the admission did."""

    def __init__(self, name: str, policy: WritePolicy, admission: AdmissionPolicy | None):
        self.name = name
        self.policy = policy
        self.admission = admission
        self.admission_name = getattr(admission, "plugin_name", "") or (
            type(admission).__name__ if admission is not None else ""
        )
        #: The admission's ``record_lookup`` / ``on_request_finished`` if it overrides them
        #: (else never called).
        self.record_lookup = overrides(admission, "record_lookup") if admission else None
        self.on_request_finished = (
            overrides(admission, "on_request_finished") if admission else None
        )
        self.refused_blocks = 0
        self.admission_errors = 0

    @property
    def write_back(self) -> bool:
        return self.policy is WritePolicy.WRITE_BACK

    def admit(
        self, keys: list[OffloadKey], ctx: ReqContext, errors: HookErrorLog
    ) -> list[OffloadKey]:
        """The keys of ``keys`` to write to the tier; a broken admission admits none of them
        and its error is kept in ``errors`` (raised when the manager's call ends)."""
        if self.admission is None:
            return keys
        try:
            admitted = checked_admit(self.admission, self.admission_name, keys, ctx)
        except PluginError as exc:
            self.admission_errors += 1
            self.refused_blocks += len(keys)
            errors.keep(exc)
            return []
        self.refused_blocks += len(keys) - len(admitted)
        return admitted

    def fill(self, stats: TierStats) -> None:
        stats.write_policy = self.policy.value
        stats.admission = self.admission_name
        stats.refused_blocks = self.refused_blocks
        stats.admission_errors = self.admission_errors

    def reset_counters(self) -> None:
        self.refused_blocks = self.admission_errors = 0


class WriteBack:
    """The write-back tiers of a stack: which CPU blocks are dirty, the staging rows of
    evicted ones, and the blocks each write-back tier admitted and has not been sent yet.

    The manager calls :meth:`evicted` as the CPU tier's eviction sink (inside the CPU call:
    only bytes are copied), :meth:`admit_evicted` when the CPU call returned, and submits
    :meth:`batches` at the step end (one job per tier: a promotion's eviction alone would make
    a one-block job), releasing each job's rows with :meth:`release` when it ends.
    """

    def __init__(self, staging: StagingRows, tiers: Sequence[TierRecord]) -> None:
        self.staging = staging
        self._tiers = tiers
        #: CPU blocks stored by the engine and not written back yet.
        self._dirty: set[OffloadKey] = set()
        self._evicted: list[OffloadKey] = []  # staged by the current CPU call
        #: Each write-back tier's admitted blocks not sent yet.
        self._waiting: dict[TierRecord, list[OffloadKey]] = {tier: [] for tier in tiers}
        self.dropped = 0
        self.rescued = 0

    def stored(self, keys: list[OffloadKey]) -> None:
        """The engine stored ``keys`` in the CPU tier: written back when evicted."""
        self._dirty.update(keys)

    def evicted(self, keys: list[OffloadKey], slots: Sequence[int]) -> None:
        """The CPU tier's eviction sink: stage the dirty victims before their slots are
        reused (a clean one, promoted from a tier, is in that tier already)."""
        dirty = self._dirty
        victims = []
        for key, slot in zip(keys, slots):
            if key in dirty:
                dirty.discard(key)
                victims.append((key, int(slot)))
        if victims:
            staged, dropped = self.staging.take(victims)
            self._evicted.extend(staged)
            self.dropped += dropped

    @property
    def pending(self) -> bool:
        """Whether the current CPU call staged victims (call :meth:`admit_evicted`)."""
        return bool(self._evicted)

    def admit_evicted(self, ctx: ReqContext, errors: HookErrorLog) -> None:
        """Ask each write-back tier's admission about the victims the CPU call staged
        (``ctx``: the request whose call evicted them); rows no tier took are freed."""
        keys, self._evicted = self._evicted, []
        if not keys:
            return
        staging = self.staging
        staging.hold(keys)  # until every tier has taken its share
        for tier, waiting in self._waiting.items():
            admitted = tier.writes.admit(keys, ctx, errors)
            if admitted:
                staging.hold(admitted)
                waiting.extend(admitted)
        staging.release(keys)

    def batches(self) -> list[tuple[TierRecord, list[OffloadKey], list[int]]]:
        r"""Each write-back tier's admitted blocks since the last call, with their rows: the
        jobs to submit (a job the manager cannot submit is :meth:`release`\ d)."""
        out = []
        for tier, waiting in self._waiting.items():
            if waiting:
                keys = list(waiting)
                waiting.clear()
                out.append((tier, keys, self.staging.rows_of(keys)))
        return out

    def release(self, keys: Sequence[OffloadKey]) -> None:
        self.staging.release(keys)

    def short_of_rows(self, wanted: int) -> bool:
        """Whether a CPU call that may evict ``wanted`` dirty blocks should wait: fewer
        staging rows than that (at most all of them) are free, and write-backs in flight may
        free some."""
        staging = self.staging
        return staging.free < min(wanted, staging.capacity) and staging.in_use

    def rows_timed_out(self, timeout_s: float) -> None:
        """The wait for staging rows gave up: victims without a row are not written back."""
        staging = self.staging
        logger.warning(
            "write-back: %d staging row(s) still in use after %.1f s (tiers: %s); victims "
            "without a row are not written back",
            staging.capacity - staging.free,
            timeout_s,
            ", ".join(tier.name for tier in self._tiers),
        )

    def holds(self, key: OffloadKey) -> bool:
        """Whether ``key`` is staged (evicted, its write-back not done)."""
        return key in self.staging.rows

    def reset(self) -> None:
        """``reset_cache`` (after its drain): the CPU tier is empty, nothing is dirty."""
        self._dirty.clear()
        self.dropped = self.rescued = 0

    def fill(self, stats: TierStats) -> None:
        stats.write_back_dropped = self.dropped
        stats.write_back_rescued = self.rescued


class StackWrites:
    """What the tiered manager asks before it writes anything to a tier: the write-through
    tiers, the stack's :class:`WriteBack` if a tier is written back, and the admissions that
    watch lookups or requests. Each tier's own policy, admission and counters are its
    record's :class:`TierWrites`."""

    def __init__(
        self,
        tiers: Sequence[TierRecord],
        buffer: npt.NDArray[np.uint8],
        num_blocks: int,
    ) -> None:
        self._tiers = tiers
        #: Tiers written when a CPU store completes (every block, or what an admission admits).
        self.through = [t for t in tiers if not t.writes.write_back]
        back = [t for t in tiers if t.writes.write_back]
        #: Admissions that watch lookups, called on every stack lookup.
        self.lookup_observers = [t.writes.record_lookup for t in tiers if t.writes.record_lookup]
        #: Admissions that keep per-request state, told when a request finishes.
        self.finish_observers = [
            t.writes.on_request_finished for t in tiers if t.writes.on_request_finished
        ]
        self.back: WriteBack | None = None
        if back:
            if buffer.shape[0] <= num_blocks:
                names = ", ".join(repr(t.name) for t in back)
                raise ConfigError(
                    f"tier(s) {names} use write_policy 'write-back', which needs staging rows "
                    f"for evicted blocks in the CPU KV buffer: build the stack with "
                    f"build_manager (it adds write_back_buffer_blocks rows), or create the "
                    f"CPUOffloadingManager with a kv_buffer of num_blocks + N rows"
                )
            self.back = WriteBack(StagingRows(buffer, num_blocks), back)

    def fill(self, tier: TierRecord, stats: TierStats) -> None:
        """Fill ``stats`` (a copy of ``tier``'s counters) with its write figures."""
        tier.writes.fill(stats)
        if tier.writes.write_back and self.back is not None:
            self.back.fill(stats)

    def reset(self) -> None:
        for tier in self._tiers:
            tier.writes.reset_counters()
        if self.back is not None:
            self.back.reset()
