"""Blocks through the whole stack (CPU -> fs -> promotion back), real files, both policies, two
fs tiers in cascade, and across a process restart."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _fs import (
    BLOCK,
    HIT,
    MISS,
    block_files,
    build_fs_stack,
    check_no_leaks,
    evict_from_cpu,
    promote,
    store,
    tmp_entries,
)
from _tiers import key
from kv_offload import (
    CPUOffloadingManager,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    make_offload_key,
)
from kv_offload.plugins import create_plugin_manager, hookimpl
from kv_offload.tiering import OffloadingConfig
from kv_offload_fs_tier import FileSystemTier


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_round_trip_through_the_tiered_manager(tmp_path: Path, policy: str) -> None:
    m = build_fs_stack(tmp_path / "fs", policy=policy, cpu_blocks=8)
    ctx = ReqContext("r")
    keys = [key(i) for i in range(40)]
    for start in range(0, 40, 4):
        store(m, keys[start : start + 4], ctx)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    assert len(tier) == 40 and len(block_files(tmp_path / "fs")) == 40
    assert m.get_stats().tiers[0].cascaded_blocks == 40
    # The CPU tier holds 8 of them: the others come back from disk, bytes checked.
    for k in keys:
        assert promote(m, k, ctx) is HIT
    stats = m.get_stats().tiers[0]
    assert stats.promoted_blocks >= 32 and stats.failed_promotions == 0
    assert tier.get_stats().loaded_blocks == stats.promoted_blocks
    check_no_leaks(m)
    m.shutdown()
    assert not tmp_entries(tmp_path / "fs")


def test_lookup_answers_none_while_the_store_is_in_flight(tmp_path: Path) -> None:
    m = build_fs_stack(tmp_path / "fs", cpu_blocks=4)
    tier = m.tiers[0]
    ctx = ReqContext("r")
    out = m.prepare_store([key(1)], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, bytes(BLOCK))
    m.complete_store(out.keys_to_store, ctx)
    # Until get_finished reports the job, the tier cannot promise the block.
    assert tier.lookup(key(1), ctx) is None
    assert tier.lookup(key(2), ctx) is False
    m.drain()
    assert tier.lookup(key(1), ctx) is True
    m.shutdown()


def test_two_fs_tiers_in_cascade(tmp_path: Path) -> None:
    """An "NVMe" tier and a "network" tier, both fs; the second keeps what the first evicts.
    Built through the Python API; the tiers get distinct names through tier_type."""
    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(4, BLOCK)
    view = primary.kv_buffer.view
    near = FileSystemTier(config, view, "nvme", tmp_path / "nvme", capacity_blocks=8)
    far = FileSystemTier(config, view, "network", tmp_path / "net", capacity_blocks=100)
    m = TieringOffloadingManager(primary, [near, far])
    ctx = ReqContext("r")
    keys = [key(i) for i in range(24)]
    for start in range(0, 24, 2):
        store(m, keys[start : start + 2], ctx)
    assert len(near) == 8 and len(far) == 24
    # Evicted files are deleted in the background and counted when the manager next collects
    # the tier's results: step the engine until the last deletes have reported.
    deadline = time.monotonic() + 30
    while near.get_stats().deleted_files < 16 and time.monotonic() < deadline:
        m.on_schedule_end()
        time.sleep(0.01)
    assert near.get_stats().evicted_blocks == 16 and near.get_stats().deleted_files == 16
    assert len(block_files(tmp_path / "nvme")) == 8
    for k in keys:
        assert promote(m, k, ctx) is HIT
    stats = m.get_stats()
    assert [t.name for t in stats.tiers] == ["nvme", "network"]
    assert stats.tiers[0].promoted_blocks > 0 and stats.tiers[1].promoted_blocks > 0
    check_no_leaks(m)
    m.shutdown()


WRITER = textwrap.dedent(
    """
    import sys
    from _fs import build_fs_stack, store
    from _tiers import key
    from kv_offload import ReqContext

    m = build_fs_stack(sys.argv[1], cpu_blocks=8)
    ctx = ReqContext("writer")
    for start in range(0, 64, 8):
        store(m, [key(i) for i in range(start, start + 8)], ctx)
    m.shutdown()
    """
)


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    here = Path(__file__).parent
    path = f"{here}:{here.parent}"
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {path.split(':')!r}\n{code}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_blocks_survive_a_process_restart(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    child = run_child(WRITER, str(root))
    assert child.returncode == 0, child.stderr
    m = build_fs_stack(root, cpu_blocks=8)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    assert len(tier) == 64 and tier.get_stats().recovered_blocks == 64
    ctx = ReqContext("reader")
    for i in range(64):
        assert promote(m, key(i), ctx) is HIT
    assert promote(m, key(64), ctx) is MISS
    check_no_leaks(m)
    m.shutdown()


def test_restart_restores_least_recently_written_first_and_the_capacity(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=30)
    ctx = ReqContext("r")
    for i in range(0, 30, 2):
        store(m, [key(i), key(i + 1)], ctx)
    m.shutdown()
    # A smaller capacity after the restart: the oldest written go, in the background.
    m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=10)
    tier = m.tiers[0]
    assert len(tier) == 10 and tier.get_stats().evicted_blocks == 20
    m.shutdown()  # finishes the deletes
    assert len(block_files(root)) == 10


def test_config_builds_the_tier_by_name_and_failed_jobs_carry_a_reason(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.failures: list[tuple[str, str | None]] = []

        @hookimpl
        def kv_offload_tier_job_finished(
            self, tier: str, direction: str, success: bool, reason: str | None
        ) -> None:
            if not success:
                self.failures.append((direction, reason))

    recorder = Recorder()
    m = build_manager(
        {
            "num_blocks": 4,
            "block_size_bytes": BLOCK,
            "tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs"), "capacity_blocks": 64}],
        },
        plugin_manager=create_plugin_manager(plugins=[recorder], autoload=False),
    )
    assert isinstance(m, TieringOffloadingManager)
    ctx = ReqContext("r")
    store(m, [key(1)], ctx)
    evict_from_cpu(m, ctx)
    (block,) = [p for p in block_files(tmp_path / "fs") if p.name == key(1).hex()]
    block.write_bytes(block.read_bytes()[:-1] + b"\x00")  # not the bytes that were stored
    assert promote(m, key(1), ctx) is MISS
    assert recorder.failures == [("load", f"block {key(1).hex()}: checksum mismatch")]
    m.shutdown()


def test_duplicate_store_is_a_no_op(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = build_fs_stack(tmp_path / "fs", cpu_blocks=4)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    store(m, [key(1), key(2)], ctx)
    m.reset_cache()  # the CPU tier forgets; the fs tier keeps its blocks
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        store(m, [key(1), key(2)], ctx)
    assert tier.get_stats().already_stored_blocks == 2
    assert tier.get_stats().stored_blocks == 2
    assert m.lookup(key(3), ctx) is MISS and m.lookup(key(1), ctx) is HIT
    assert not caplog.records
    m.shutdown()


def test_evicted_files_are_recycled_for_later_stores(tmp_path: Path) -> None:
    """A full tier overwrites evicted files instead of creating new ones (keys of another
    length too), and the bytes come back right."""
    root = tmp_path / "fs"
    m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=4, io_threads=1)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    store(m, [key(i) for i in range(4)], ctx)
    inodes = {p.stat().st_ino for p in block_files(root)}
    short = [make_offload_key(bytes([7, i])) for i in range(4)]  # 6-byte keys
    store(m, short, ctx)
    assert {p.stat().st_ino for p in block_files(root)} == inodes  # the same files, reused
    assert {p.name for p in block_files(root)} == {k.hex() for k in short}
    m.reset_cache()  # the CPU tier forgets: the blocks come back from the recycled files
    for k in short:
        assert promote(m, k, ctx) is HIT
    m.shutdown()
    assert not tmp_entries(root)  # spare files are not left behind
