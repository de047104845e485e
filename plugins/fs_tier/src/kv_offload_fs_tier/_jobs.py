"""A job's record while its shares come in, and the one :class:`JobResult` it ends with.

A job is split by I/O thread into shares (:mod:`._shares`); each reports on its own. The
record merges them: which keys landed, which failed and the first reason. Only the keys that
failed fail: a bad block never takes its neighbours with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kv_offload import OffloadKey
from kv_offload.tiering import JobDirection, JobResult

from ._shares import Outcome

__all__ = ["Job"]


@dataclass
class Job:
    """A job's shares reported so far: what landed, what failed and the first reason."""

    direction: JobDirection
    keys: int
    parts_left: int
    order: list[bytes]  # a store's keys, in job order
    written: set[bytes] = field(default_factory=set)
    failed: int = 0
    #: the keys that failed (their store or load did not happen), reported per key
    failed_keys: set[bytes] = field(default_factory=set)
    kind: str | None = None
    reason: str | None = None

    def merge(self, outcome: Outcome) -> bool:
        """One share's outcome; whether it was the last."""
        if self.direction is JobDirection.STORE:
            self.written.update(outcome.done)
        self.parts_left -= 1
        if outcome.failed or outcome.untried:
            self.failed += len(outcome.failed) + len(outcome.untried)
            self.failed_keys.update(k for k, _, _ in outcome.failed)
            self.failed_keys.update(outcome.untried)
            if self.reason is None and outcome.failed:
                key, kind, message = outcome.failed[0]
                self.kind, self.reason = kind, f"block {key.hex()}: {message}"
        if outcome.error is not None:  # the blocks are whole, but not known to be durable
            self.failed += len(outcome.done)
            self.failed_keys.update(outcome.done)
            if self.reason is None:
                self.kind, self.reason = outcome.error
        return not self.parts_left

    def result(self, job_id: int) -> JobResult:
        """The job's result: a success if any key landed, naming the keys that failed."""
        some_landed = self.failed < self.keys
        failed_keys = frozenset(map(OffloadKey, self.failed_keys))
        return JobResult(
            job_id,
            not self.failed or some_landed,
            self.reason,
            failed_keys if self.failed and some_landed else frozenset(),
        )
