"""A root written by an earlier release of the tier is read by this one: the on-disk format
(version 1) is a promise to users whose disk cache outlives an upgrade.

``data/root-49cec58`` was written by the fs tier at commit 49cec58 (14 modules, before the
tier was cut along its thread boundary): four 4 KiB blocks, keys ``make_offload_key(1000 +
i)``, block ``i`` filled with the byte ``i + 1``. The shard a key's file lives in, the file
name, the header and the checksum must all still be what this version reads.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
from kv_offload import CPUKVBuffer, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, OffloadingConfig
from kv_offload_fs_tier import FileSystemTier

WRITTEN_BY_49CEC58 = Path(__file__).parent / "data" / "root-49cec58"


def test_a_root_written_by_the_previous_layout_loads_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(WRITTEN_BY_49CEC58, root)
    buffer = CPUKVBuffer(4, 4096)
    tier = FileSystemTier(OffloadingConfig(4, 4096), buffer.view, "fs", root, capacity_blocks=8)
    try:
        keys = [make_offload_key(1000 + i) for i in range(4)]
        assert tier.get_stats().recovered_blocks == 4
        assert all(tier.lookup(k, ReqContext("r")) for k in keys)
        job = JobMetadata(1, keys, np.arange(4, dtype=np.int64), JobDirection.LOAD, ReqContext("r"))
        tier.submit_load(job)
        deadline = time.monotonic() + 10
        while not (done := tier.get_finished()) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(done) == 1 and done[0].success, done
        for i in range(4):
            assert bytes(buffer.array[i]) == bytes([i + 1]) * 4096
        assert tier.get_stats().dropped_blocks == 0
    finally:
        tier.shutdown()
        buffer.close()
