"""Test tiers and byte helpers shared by the tiering tests.

* :func:`block_bytes` derives a block's bytes from its key, so any read back can be checked
  without remembering what was written.
* :class:`RecordingTier` is the example tier plus a log of every job and shutdown call.
* :func:`faulty_tier` is the shipped ``faulty`` wrapper (failed, late and raising jobs) around
  an example tier, with ``defer_transfer``: bytes move when a job's result is released, not
  when it is submitted, so a manager that released a pin or reused a reserved slot too early
  would corrupt what it reads back. :func:`held_blocks` shows what the wrapped tier holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, JobResult, OffloadingConfig
from kv_offload_example_tier import ExampleSecondaryTierManager
from kv_offload_faulty_tier import FaultyTier

__all__ = [
    "RecordedJob",
    "RecordingTier",
    "block_bytes",
    "expected_rows",
    "faulty_tier",
    "held_blocks",
    "key",
]


def key(i: int) -> OffloadKey:
    return make_offload_key(i)


def block_bytes(k: OffloadKey, size: int) -> bytes:
    """``size`` bytes that depend only on the key (blake2b in counter mode)."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.blake2b(k + counter.to_bytes(4, "big"), digest_size=64).digest()
        counter += 1
    return bytes(out[:size])


def expected_rows(keys: Collection[OffloadKey], size: int) -> npt.NDArray[np.uint8]:
    return np.frombuffer(b"".join(block_bytes(k, size) for k in keys), np.uint8).reshape(
        len(keys), size
    )


@dataclass
class RecordedJob:
    job_id: int
    direction: JobDirection
    keys: list[OffloadKey]
    block_ids: list[int]
    req_id: str


class RecordingTier(ExampleSecondaryTierManager):
    """The example tier, logging jobs; ``fail_loads`` makes every promotion fail."""

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        capacity_blocks: int | None = None,
        fail_loads: bool = False,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type, capacity_blocks)
        self.fail_loads = fail_loads
        self.jobs: list[RecordedJob] = []
        self.shutdown_calls = 0
        self.finished_reqs: list[str] = []

    def _record(self, job: JobMetadata) -> None:
        self.jobs.append(
            RecordedJob(
                job.job_id,
                job.direction,
                list(job.keys),
                job.block_ids.tolist(),
                job.req_context.req_id,
            )
        )

    def submit_store(self, job: JobMetadata) -> None:
        self._record(job)
        super().submit_store(job)

    def submit_load(self, job: JobMetadata) -> None:
        self._record(job)
        if self.fail_loads:
            self._finished.append(JobResult(job.job_id, success=False))
        else:
            super().submit_load(job)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.finished_reqs.append(req_context.req_id)

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        super().shutdown()

    def loads(self) -> list[RecordedJob]:
        return [j for j in self.jobs if j.direction is JobDirection.LOAD]

    def stores(self) -> list[RecordedJob]:
        return [j for j in self.jobs if j.direction is JobDirection.STORE]


def faulty_tier(
    config: OffloadingConfig,
    primary_kv_view: memoryview,
    name: str,
    capacity_blocks: int | None = None,
    **faults: Any,
) -> FaultyTier:
    """The ``faulty`` wrapper, transferring late, around an example tier of ``capacity_blocks``."""
    inner = {"type": "example", "capacity_blocks": capacity_blocks}
    return FaultyTier(config, primary_kv_view, name, inner, defer_transfer=True, **faults)


def held_blocks(tier: FaultyTier) -> dict[OffloadKey, npt.NDArray[np.uint8]]:
    """The rows the example tier inside ``tier`` holds, by key (writable: tests plant blocks)."""
    inner = tier.inner
    assert isinstance(inner, ExampleSecondaryTierManager)
    return inner._rows
