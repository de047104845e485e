"""Block bytes kept in a dict: a kv-offload secondary-tier plugin in one module."""

from __future__ import annotations

import numpy as np
from kv_offload import ConfigError, OffloadKey, ReqContext
from kv_offload.tiering import JobMetadata, JobResult, OffloadingConfig, SecondaryTierManager

__all__ = ["DictTier"]


class DictTier(SecondaryTierManager):
    """Keeps a copy of each block's bytes; the oldest block goes once ``max_blocks`` are held.

    Every job finishes inside ``submit_*`` (a memory copy is fast) and reports exactly one
    :class:`JobResult`, success or failure: a job without a result would pin its CPU slots
    forever.
    """

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        max_blocks: int = 100_000,  # a tier argument: `max_blocks = ...` under [[tiers]]
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        if max_blocks <= 0:  # ConfigError: the CLI shows it as one clear line
            raise ConfigError(f"tier {tier_type!r}: max_blocks must be > 0, got {max_blocks}")
        self.max_blocks = max_blocks
        self._cpu = np.asarray(primary_kv_view)  # (num_blocks, block_size_bytes) uint8 rows
        self._blocks: dict[OffloadKey, bytes] = {}
        self._finished: list[JobResult] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return key in self._blocks

    def submit_store(self, job: JobMetadata) -> None:
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            self._blocks.pop(key, None)
            if len(self._blocks) >= self.max_blocks:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[key] = self._cpu[slot].tobytes()  # a copy, never a view
        self._finished.append(JobResult(job.job_id, success=True))

    def submit_load(self, job: JobMetadata) -> None:
        if not all(key in self._blocks for key in job.keys):
            self._finished.append(JobResult(job.job_id, success=False))
            return
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            self._cpu[slot] = np.frombuffer(self._blocks[key], np.uint8)
        self._finished.append(JobResult(job.job_id, success=True))

    def get_finished(self) -> list[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    def shutdown(self) -> None:
        self._blocks.clear()
