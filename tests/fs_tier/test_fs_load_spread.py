"""A load's blocks go to whichever I/O thread is free (``io.LoadWork``), not to a fixed split by
key: one damaged block stops only the thread that read it, the other threads read every other
block of the job, and the job reports once, failing that one key."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from kv_offload import CPUKVBuffer, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, JobResult, OffloadingConfig
from kv_offload_fs_tier import FileSystemTier, layout

BLOCK = 4096
N = 32
CTX = ReqContext("r")


def run(tier: FileSystemTier, job: JobMetadata) -> JobResult:
    (tier.submit_store if job.direction is JobDirection.STORE else tier.submit_load)(job)
    deadline = time.monotonic() + 10
    while not (done := tier.get_finished()):
        assert time.monotonic() < deadline, "the job never reported"
        time.sleep(0.001)
    (result,) = done
    return result


def test_a_damaged_block_fails_alone_and_the_other_threads_load_the_rest(tmp_path: Path) -> None:
    buffer = CPUKVBuffer(2 * N, BLOCK)
    rows = buffer.array
    rows[:N] = np.random.default_rng(1).integers(0, 256, (N, BLOCK), np.uint8)
    root = tmp_path / "fs"
    tier = FileSystemTier(
        OffloadingConfig(2 * N, BLOCK), buffer.view, "fs", root, capacity_blocks=N, io_threads=4
    )
    try:
        keys = [make_offload_key(i) for i in range(N)]
        ids = np.arange(N, dtype=np.int64)
        assert run(tier, JobMetadata(1, keys, ids, JobDirection.STORE, CTX)).success
        bad = keys[N // 2]
        path = root / "blocks" / f"{layout.shard_of(bad):02x}" / bad.hex()
        data = bytearray(path.read_bytes())
        data[layout.HEADER_SPACE + 7] ^= 0x01
        path.write_bytes(bytes(data))
        result = run(tier, JobMetadata(2, keys, ids + N, JobDirection.LOAD, CTX))
        assert result.success and result.failed_keys == {bad}
        for i, k in enumerate(keys):
            if k != bad:
                assert np.array_equal(rows[N + i], rows[i])
        stats = tier.get_stats()
        assert stats.loaded_blocks == N - 1 and stats.drop_reasons == {"checksum": 1}
        assert stats.loads_in_flight == 0 and len(tier) == N - 1
    finally:
        tier.shutdown()
        buffer.close()
