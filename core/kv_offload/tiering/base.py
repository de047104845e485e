"""The secondary-tier plugin interface (disk, Redis, anything slower than CPU RAM).

Secondary tiers never see GPU memory: a store cascades GPU -> CPU -> tier, a promotion goes
tier -> CPU -> GPU. Every method runs in the scheduler and must not block: ``submit_*`` start
a job, :meth:`SecondaryTierManager.get_finished` reports it. The contract that keeps the CPU
tier's accounting sound: **every submitted job reports exactly one** :class:`JobResult`,
success or failure. A job without a result would keep its CPU blocks pinned forever.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..keys import OffloadKey
from ..tier_types import Medium, RequestOffloadingContext
from ..types import ReqContext

__all__ = [
    "JobDirection",
    "JobMetadata",
    "JobResult",
    "OffloadingConfig",
    "SecondaryTierManager",
]

JobId = int


class JobDirection(enum.Enum):
    """``STORE``: CPU -> tier (cascade). ``LOAD``: tier -> CPU (promotion)."""

    STORE = "store"
    LOAD = "load"


@dataclass(frozen=True)
class OffloadingConfig:
    """What every tier is told about the CPU tier it sits behind."""

    num_blocks: int
    block_size_bytes: int


@dataclass
class JobMetadata:
    """One transfer between the CPU tier and a secondary tier.

    ``block_ids[i]`` is the CPU slot of ``keys[i]``: the row to read for a store, the row to
    fill for a load. The slots stay pinned (store) or reserved (load) until the job's result
    is reported.
    """

    job_id: JobId
    keys: list[OffloadKey]
    block_ids: npt.NDArray[np.int64]
    direction: JobDirection
    req_context: ReqContext

    @property
    def is_promotion(self) -> bool:
        return self.direction is JobDirection.LOAD


@dataclass(frozen=True)
class JobResult:
    """The outcome of one job; ``success=False`` releases its pins and reservations.
    ``reason`` says why a job failed (for logs and the ``kv_offload_tier_job_finished`` hook),
    e.g. ``"checksum mismatch"`` or ``"ENOSPC: No space left on device"``.

    ``failed_keys`` reports a job that partly succeeded: with ``success=True``, the keys
    listed failed and every other key of the job succeeded (a tier spread over several
    nodes, one of them down, fails only the keys that node holds). Keys not in the job are
    ignored; with ``success=False`` every key failed, whatever the field holds."""

    job_id: JobId
    success: bool
    reason: str | None = None
    failed_keys: frozenset[OffloadKey] = frozenset()


class SecondaryTierManager(ABC):
    """Base class of tier plugins (entry-point group ``kv_offload.tiers``), vLLM's shape.

    A tier implements :meth:`lookup`, :meth:`submit_store`, :meth:`submit_load` and
    :meth:`get_finished`; every other method here is optional, with a default that does
    nothing (documented on each). The factory constructs a tier as
    ``cls(config, primary_kv_view, tier_type, **arguments)`` where ``arguments`` are the
    tier's own config keys, and never sets anything on it afterwards. ``primary_kv_view`` is a
    writable memoryview of the CPU KV buffer, shape ``(num_blocks, block_size_bytes)``; wrap
    it with ``numpy.asarray`` to copy rows.

    What the stack decides about a tier is the tiered manager's, not the tier's: its name,
    ``locality``, cascade gate (``backpressure``), ``write_policy`` and ``admission`` come
    from its ``[[tiers]]`` entry (or a :class:`~kv_offload.tiering.TierEntry` in code) and
    live in the manager's record of the tier. A tier knows its ``tier_type``; log with it.

    Two class attributes describe the tier: ``medium`` (for per-request tier filters;
    ``None``, unknown, is matched by every matcher) and ``shared_across_engines``, whether
    every engine built from the same config reaches the same blocks (a server such as Redis)
    rather than a store private to its process (its memory, a directory it manages alone): a
    fleet replay shares the former between its engines and gives each engine its own of the
    latter.

    A job's ``block_ids`` are rows of ``primary_kv_view``; a write-back tier's store jobs may
    name rows past the CPU tier's ``num_blocks`` (staging rows of evicted blocks), so index
    the whole view rather than checking ids against ``config.num_blocks``.
    """

    medium: ClassVar[Medium | None] = None
    shared_across_engines: ClassVar[bool] = False

    def __init__(
        self, config: OffloadingConfig, primary_kv_view: memoryview, tier_type: str
    ) -> None:
        self.config = config
        self.primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    @classmethod  # noqa: B027 - an optional hook, not an abstract method
    def validate_arguments(cls, **arguments: Any) -> None:
        """Check the tier's own config arguments, as written, without allocating anything.

        Config validation (``kv-offload validate``, ``load_config``) calls this after checking
        the names against the constructor's signature, so a value the constructor would reject
        is caught before anything is built. Raise :class:`~kv_offload.ConfigError` with
        ``key=`` the argument's name (the error is then located at that line); the default
        accepts everything. A tier's ``__init__`` can call it too, to keep one rule.
        """

    @classmethod  # noqa: B027 - an optional hook, not an abstract method
    def validate_for_stack(cls, config: OffloadingConfig, **arguments: Any) -> None:
        """The checks of :meth:`validate_arguments` that need the CPU tier's geometry
        (``config.block_size_bytes``), e.g. a disk tier's directory written with another
        block size, or a byte capacity smaller than one block. Config validation calls it
        after :meth:`validate_arguments` when the config sets ``block_size_bytes`` (a stack
        with tiers always does); same rules: nothing allocated or created, a
        :class:`~kv_offload.ConfigError` with ``key=``. The default accepts everything."""

    @classmethod
    def memory_bytes(cls, config: OffloadingConfig, **arguments: Any) -> int | None:
        """At most how many bytes of this process's memory the tier will hold (for config
        validation's memory estimate): ``0`` for a tier that keeps blocks elsewhere (disk,
        a server), ``None`` for one with no bound. The default says ``0``."""
        return 0

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """``True`` if the block is here and readable, ``False`` if absent, ``None`` for "ask
        again": a store of it is still in flight, or the answer is not known yet (an existence
        check runs in the background). While a tier answers ``None`` and no tier answers
        ``True``, the tiered manager's ``lookup`` answers ``LookupResult.PENDING``, and the
        engine asks again after its next step."""

    @abstractmethod
    def submit_store(self, job: JobMetadata) -> None:
        """Start copying ``job.block_ids`` rows of the CPU buffer into this tier."""

    @abstractmethod
    def submit_load(self, job: JobMetadata) -> None:
        """Start copying the blocks of ``job.keys`` into rows ``job.block_ids`` of the CPU
        buffer. A key that is missing fails the job (report ``success=False``)."""

    @abstractmethod
    def get_finished(self) -> Iterable[JobResult]:
        """Results of the jobs that finished since the last call, each reported once."""

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        """A request arrived. Answer ``RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)``
        to be sent every block of the request, prefix hits already in the CPU tier included
        (e.g. a prefill node publishing whole requests to a shared tier); ``None`` (the
        default) or ``CHUNK_LEVEL``: only the blocks the request stores."""
        return None

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:  # noqa: B027
        """The blocks were used by a request (recency for the tier's own eviction)."""

    def on_request_finished(self, req_context: ReqContext) -> None:  # noqa: B027
        """A request finished; no more jobs will be submitted for it."""

    def on_schedule_end(self) -> None:  # noqa: B027
        """The scheduler step ended: called on every tier before the step's queued promotions
        are submitted (a tier batching work per step, e.g. lookups, flushes it here)."""

    def shutdown(self) -> None:  # noqa: B027
        """Release threads, files and connections."""
