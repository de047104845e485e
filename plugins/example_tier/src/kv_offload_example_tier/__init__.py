"""A secondary tier that keeps block bytes in memory: the reference for tier authors.

What a tier must get right, and where this one does it:

* ``submit_*`` never block the scheduler for long. This tier copies synchronously because a
  memory copy is fast; a disk or network tier would hand the copy to a thread or process.
* Every submitted job reports exactly one :class:`JobResult` through ``get_finished``,
  success or failure. A load of a key the tier does not have is a *failed* job, never a
  missing result: a job without a result keeps its CPU slot reserved and its request
  ``PENDING`` forever.
* Bytes go in and come out identical: rows of the CPU buffer are copied, never aliased.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey, ReqContext
from kv_offload.errors import ConfigError
from kv_offload.tiering import (
    JobMetadata,
    JobResult,
    Medium,
    OffloadingConfig,
    SecondaryTierManager,
)

__all__ = ["ExampleSecondaryTierManager"]

_CHUNK_ROWS = 64


class ExampleSecondaryTierManager(SecondaryTierManager):
    """Keeps block bytes in RAM, in rows of a growing pool of numpy arrays.

    ``capacity_blocks`` bounds the tier; when full, storing evicts the least recently used
    block. Rows are allocated in chunks and reused, so steady-state copies go to warm memory.
    """

    medium = Medium.CPU  # RAM, like vLLM's example tier

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        self.validate_arguments(capacity_blocks=capacity_blocks)
        self.capacity_blocks = capacity_blocks
        self._cpu: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self._rows: OrderedDict[OffloadKey, npt.NDArray[np.uint8]] = OrderedDict()
        self._spare: list[npt.NDArray[np.uint8]] = []
        self._finished: list[JobResult] = []

    @classmethod
    def validate_arguments(cls, capacity_blocks: object = None, **arguments: Any) -> None:
        if capacity_blocks is not None and (
            isinstance(capacity_blocks, bool)
            or not isinstance(capacity_blocks, int)
            or capacity_blocks <= 0
        ):
            raise ConfigError(
                f"tier 'example': capacity_blocks must be a positive int or unset, "
                f"got {capacity_blocks!r}",
                key="capacity_blocks",
            )

    @classmethod
    def memory_bytes(cls, config: OffloadingConfig, **arguments: Any) -> int | None:
        """Rows of ``block_size_bytes`` for each of ``capacity_blocks``; unbounded if unset."""
        capacity = arguments.get("capacity_blocks")
        return None if capacity is None else capacity * config.block_size_bytes

    def __len__(self) -> int:
        return len(self._rows)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        # Jobs complete inside submit_*, so a block is never half-stored here.
        return key in self._rows

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self._rows:
                self._rows.move_to_end(key)

    def submit_store(self, job: JobMetadata) -> None:
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = self._take_row()
            else:
                self._rows.move_to_end(key)
            np.copyto(row, self._cpu[slot])
        self._finished.append(JobResult(job.job_id, success=True))

    def submit_load(self, job: JobMetadata) -> None:
        rows = [self._rows.get(key) for key in job.keys]
        if any(row is None for row in rows):
            # Fail the whole job and touch no CPU row: the manager frees the reserved slots.
            self._finished.append(JobResult(job.job_id, success=False))
            return
        for row, slot in zip(rows, job.block_ids.tolist()):
            np.copyto(self._cpu[slot], row)  # type: ignore[arg-type]
        self._finished.append(JobResult(job.job_id, success=True))

    def get_finished(self) -> list[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    def _take_row(self) -> npt.NDArray[np.uint8]:
        """A free row: a spare one, a new chunk's, or the least recently used block's."""
        if not self._spare:
            if self.capacity_blocks is not None and len(self._rows) >= self.capacity_blocks:
                _, row = self._rows.popitem(last=False)
                return row
            room = _CHUNK_ROWS
            if self.capacity_blocks is not None:
                room = min(room, self.capacity_blocks - len(self._rows))
            chunk = np.empty((room, self.config.block_size_bytes), np.uint8)
            self._spare.extend(chunk)
        return self._spare.pop()

    def shutdown(self) -> None:
        self._rows.clear()
        self._spare.clear()
