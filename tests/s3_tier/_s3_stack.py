"""Driving the S3 tier in tests: directly (jobs in, results out) or inside a tiered stack.

:class:`Direct` builds an :class:`S3Tier` over a CPU buffer of its own and runs jobs to their
result with a deadline (a job without a result within it is a hang and fails the test).
:func:`s3_stack` builds a whole stack with the tier behind the CPU tier, for round trips as an
engine makes them (``store`` / ``resolve`` / ``load_and_check`` as in the Redis tests).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import kv_offload
import numpy as np
import numpy.typing as npt
from _ceph import BUCKET, CephS3
from _tiers import block_bytes, expected_rows
from kv_offload import LookupResult, OffloadKey, ReqContext, TieringOffloadingManager
from kv_offload.tiering import JobDirection, JobMetadata, JobResult, OffloadingConfig
from kv_offload_s3_tier import S3Tier

BLOCK = 16 * 1024


def tier_args(ceph: CephS3, prefix: str, **extra: Any) -> dict[str, Any]:
    """The tier's keys for the test cluster (credentials from the environment)."""
    return {"endpoint_url": ceph.endpoint, "bucket": BUCKET, "prefix": prefix,
            "capacity_blocks": 1000, **extra}  # fmt: skip


class Direct:
    """One S3 tier over a CPU buffer of ``slots`` rows of ``block`` bytes."""

    def __init__(self, ceph: CephS3, prefix: str, *, block: int = BLOCK, slots: int = 64,
                 **extra: Any) -> None:  # fmt: skip
        self.block = block
        self.cpu = np.zeros((slots, block), np.uint8)
        config = OffloadingConfig(num_blocks=slots, block_size_bytes=block)
        self.tier = S3Tier(config, memoryview(self.cpu), "s3", **tier_args(ceph, prefix, **extra))
        self._job = 0
        self._results: dict[int, JobResult] = {}

    def submit(self, direction: JobDirection, keys: Sequence[OffloadKey],
               slots: Sequence[int] | None = None) -> int:  # fmt: skip
        self._job += 1
        ids = np.array(list(slots) if slots is not None else range(len(keys)), np.int64)
        job = JobMetadata(self._job, list(keys), ids, direction, ReqContext(req_id=f"r{self._job}"))
        if direction is JobDirection.STORE:
            self.tier.submit_store(job)
        else:
            self.tier.submit_load(job)
        return self._job

    def wait(self, job_id: int, timeout: float = 30.0) -> JobResult:
        deadline = time.monotonic() + timeout
        while job_id not in self._results:
            for result in self.tier.get_finished():
                self._results[result.job_id] = result
            if job_id in self._results:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} reported no result within {timeout} s: hung")
            time.sleep(0.002)
        return self._results.pop(job_id)

    def store(self, keys: Sequence[OffloadKey], timeout: float = 30.0) -> JobResult:
        """Write each key's derived bytes into its slot, store them, wait for the result."""
        self.cpu[: len(keys)] = expected_rows(keys, self.block)
        return self.wait(self.submit(JobDirection.STORE, keys), timeout)

    def load(self, keys: Sequence[OffloadKey], timeout: float = 30.0) -> JobResult:
        """Zero the slots, load the keys into them, wait for the result."""
        self.cpu[: len(keys)] = 0
        return self.wait(self.submit(JobDirection.LOAD, keys), timeout)

    def row(self, index: int) -> npt.NDArray[np.uint8]:
        return self.cpu[index]

    def loaded_right(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Per key: whether its slot holds exactly the bytes stored for it."""
        return [bytes(self.cpu[i]) == block_bytes(k, self.block) for i, k in enumerate(keys)]

    def ask(self, keys: Sequence[OffloadKey], timeout: float = 20.0) -> list[bool]:
        """Each key's final lookup answer, one round per step, as a scheduler asks."""
        ctx = ReqContext(req_id=f"ask{time.monotonic_ns()}")
        deadline = time.monotonic() + timeout
        while True:
            answers = [self.tier.lookup(k, ctx) for k in keys]
            if None not in answers:
                self.tier.on_request_finished(ctx)
                return [bool(a) for a in answers]
            if time.monotonic() > deadline:
                raise AssertionError("lookups still 'ask again' after the deadline: hung")
            self.tier.on_schedule_end()
            time.sleep(0.002)

    def close(self) -> None:
        self.tier.shutdown()


def object_names(ceph: CephS3, prefix: str) -> list[str]:
    """Every block object under ``prefix`` in the bucket (the marker left out)."""
    client = ceph.client()
    names: list[str] = []
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    for page in pages:
        names += [o["Key"] for o in page.get("Contents", ()) if o["Key"].endswith(".kvb")]
    return names


def clear_prefix(ceph: CephS3, prefix: str) -> None:
    """Delete what a test wrote (memstore keeps it in the OSD's memory)."""
    client = ceph.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    for page in pages:
        objects = [{"Key": o["Key"]} for o in page.get("Contents", ())]
        if objects:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": objects, "Quiet": True})


def s3_stack(ceph: CephS3, prefix: str, *, num_blocks: int = 16, block: int = BLOCK,
             **tier: Any) -> TieringOffloadingManager:  # fmt: skip
    config = {"num_blocks": num_blocks, "block_size_bytes": block, "policy": "lru",
              "tiers": [{"type": "s3", **tier_args(ceph, prefix, **tier)}]}  # fmt: skip
    manager = kv_offload.build_manager(config)
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def store(manager: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
    out = manager.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == list(keys), "no room to store"
    manager.kv_buffer.write_blocks(
        out.store_spec.block_ids, expected_rows(keys, manager.kv_buffer.block_size_bytes)
    )
    manager.complete_store(keys, ctx)


def resolve(manager: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext,
            timeout: float = 20.0) -> list[LookupResult]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        answers = [manager.lookup(k, ctx) for k in keys]
        if LookupResult.PENDING not in answers:
            return answers
        if time.monotonic() > deadline:
            raise AssertionError("lookups still PENDING after the deadline: hung")
        manager.on_schedule_end()
        time.sleep(0.002)


def load_and_check(manager: TieringOffloadingManager, keys: Sequence[OffloadKey],
                   ctx: ReqContext) -> None:  # fmt: skip
    spec = manager.prepare_load(keys, ctx)
    rows = manager.kv_buffer.read_blocks(spec.block_ids)
    manager.complete_load(keys, ctx)
    assert np.array_equal(rows, expected_rows(keys, manager.kv_buffer.block_size_bytes))


def assert_quiet(manager: TieringOffloadingManager) -> None:
    manager.drain(30.0)
    stats = manager.get_stats()
    assert stats.jobs_in_flight == 0 and stats.promotions_queued == 0
    assert stats.cpu.pinned_blocks == 0 and stats.cpu.pending_blocks == 0, stats.cpu
