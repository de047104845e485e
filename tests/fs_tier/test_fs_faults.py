"""Faults: a full disk (a real small tmpfs where this process may mount one), EIO and EACCES
(the I/O thread's system-call function patched), a read-only root, an I/O thread that raises,
symlinks, permissions, a second process on the same directory, bad config. Whatever happens:
no leaked pin, no hung request, the manager keeps serving from the CPU tier."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fs import (
    BLOCK,
    HIT,
    MISS,
    all_modes,
    block_files,
    build_fs_stack,
    check_no_leaks,
    evict_from_cpu,
    promote,
    standalone_tier,
    store,
    temporary_files,
)
from _tiers import expected_rows, key
from kv_offload import ConfigError, CPUOffloadingManager, ReqContext, build_manager
from kv_offload.tiering import JobDirection, JobMetadata
from kv_offload_fs_tier import FileSystemTier, layout
from kv_offload_fs_tier import io as fs_io


def can_mount() -> bool:
    return os.geteuid() == 0 and os.path.exists("/proc/self/mounts")


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Mount points to unmount after the test."""
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


def mount(points: list[Path], *args: str) -> bool:
    done = subprocess.run(["mount", *args], check=False, capture_output=True)
    if done.returncode == 0:
        points.append(Path(args[-1]))
    return done.returncode == 0


def fail_with(code: int) -> Any:
    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    return failing


def serves_from_cpu(m: Any) -> None:
    """The CPU tier still stores and serves blocks."""
    ctx = ReqContext("cpu-check")
    out = m.prepare_store([key(999)], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows([key(999)], BLOCK))
    m.complete_store(out.keys_to_store, ctx, success=True)
    m.drain()
    assert promote(m, key(999), ctx) is HIT


# -- a full disk ----------------------------------------------------------------------------------


def fill(disk: Path) -> None:
    """Another program takes the disk's free space (a file written until ``ENOSPC``)."""
    fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"b" * 4096)
    finally:
        os.close(fd)


def test_a_full_disk_fails_stores_and_the_stack_keeps_serving(
    tmp_path: Path, mounts: list[Path], monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    root = disk / "kv"
    real = can_mount() and mount(
        mounts, "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(disk)
    )
    if not real:  # no mount here: the write system call says what a full disk says
        calls = {"n": 0}
        write = fs_io.write_block

        def fill_up(*args: Any) -> None:
            calls["n"] += 1
            if calls["n"] > 10:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write(*args)

        monkeypatch.setattr(fs_io, "write_block", fill_up)
    if real:  # a capacity larger than the disk: the build warns with both figures, and the
        # capacity is bound at once to what the disk holds, less 5% (at least 4 blocks)
        with (
            pytest.warns(UserWarning, match="the capacity needs"),
            caplog.at_level(logging.WARNING, "kv_offload.fs_tier"),
        ):
            m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=1000)
        bound = m.tiers[0].get_stats()
        assert bound.capacity_shrinks == 1 and 100 < bound.capacity < 128, bound
        assert any("holds at most" in r.getMessage() for r in caplog.records)
        caplog.clear()
        ctx = ReqContext("before")
        for i in range(1000, 1010, 2):
            store(m, [key(i), key(i + 1)], ctx)
        fill(disk)  # then another program takes the free space: the next stores find it full
    else:
        m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=1000)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        for i in range(0, 40, 2):
            store(m, [key(i), key(i + 1)], ctx)
    stats = tier.get_stats()
    assert stats.store_errors.get("ENOSPC", 0) > 0, stats
    failed_jobs = stats.failed_store_jobs
    assert m.get_stats().tiers[0].failed_cascades > 0
    # One line per failed job, naming the reason, and one saying the capacity shrank.
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(lines) == failed_jobs
    assert all("ENOSPC" in line or "no room" in line for line in lines)
    assert stats.capacity_shrinks == 1 + real and stats.capacity < 100
    assert any("is full at" in r.getMessage() for r in caplog.records)
    # The partial writes were removed (spares are evicted files kept for reuse).
    assert not [p for p in temporary_files(root) if not p.name.startswith("spare-")]
    check_no_leaks(m)
    serves_from_cpu(m)
    # What did fit is intact.
    held = [i for i in range(40) if tier.lookup(key(i), ctx)]
    assert held
    for i in held:
        assert promote(m, key(i), ctx) is HIT
    if real:
        # The tier now evicts to make room (its files are reused): later stores land, where
        # every store after the disk filled used to fail.
        for i in range(100, 140, 2):
            store(m, [key(i), key(i + 1)], ctx)
        m.drain()
        assert tier.get_stats().failed_store_jobs <= failed_jobs + 1
        assert tier.lookup(key(139), ctx) is True
    m.shutdown()


@pytest.mark.parametrize("auth", [False, True], ids=["plain", "auth"])
def test_a_full_disk_bounds_the_capacity_once_across_restarts(
    tmp_path: Path, mounts: list[Path], monkeypatch: pytest.MonkeyPatch, caplog: Any, auth: bool
) -> None:
    """An 8 MiB disk under a capacity of 20,000 blocks, four runs of new blocks: each run
    shrank again and again (965, 890, ...; 972, 841, 768 blocks), the recycled files of
    evicted blocks holding room the capacity did not count, until a disk that held 1,023
    blocks was used for 768. The capacity is what the disk holds less 5%, once per run, the
    same every run, and no store fails for want of space."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not (can_mount() and mount(mounts, "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk))):
        pytest.skip("mounting a small tmpfs is not allowed here")
    extra: dict[str, Any] = {}
    if auth:
        monkeypatch.setenv("KVO_FS_KEY", "k" * 32)
        extra["auth_key_env"] = "KVO_FS_KEY"
    disk_files = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize // layout.file_size(BLOCK)
    capacities = []
    for run in range(4):
        caplog.clear()
        with (
            pytest.warns(UserWarning, match="the capacity needs"),
            caplog.at_level(logging.WARNING, "kv_offload.fs_tier"),
        ):
            m = build_fs_stack(disk / "kv", cpu_blocks=64, capacity_blocks=20_000, **extra)
            tier = m.tiers[0]
            assert isinstance(tier, FileSystemTier)
            ctx = ReqContext(f"run{run}")
            for i in range(0, 1_400, 4):  # many cascades in flight, as a replay has
                keys = [key(run * 10_000 + j) for j in range(i, i + 4)]
                out = m.prepare_store(keys, ctx)
                assert out is not None
                m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows(keys, BLOCK))
                m.complete_store(keys, ctx)
                m.on_schedule_end()
                if i % 64 == 60:
                    m.drain()
            m.drain()
        stats = tier.get_stats()
        shrinks = [
            r.getMessage() for r in caplog.records if "the capacity is now" in r.getMessage()
        ]
        assert stats.capacity_shrinks == 1 and len(shrinks) == 1, shrinks
        assert stats.store_errors.get("ENOSPC", 0) == 0, stats.store_errors
        assert stats.capacity >= 0.9 * disk_files, (stats.capacity, disk_files)
        assert len(tier) == stats.capacity  # full to its capacity, on a disk that holds it
        assert tier.lookup(key(run * 10_000 + 1_399), ctx) is True
        capacities.append(stats.capacity)
        check_no_leaks(m)
        m.shutdown()
    assert len(set(capacities[1:])) == 1, capacities  # a restart finds the same bound


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES, errno.ENOSPC])
def test_store_errors_fail_the_job_with_one_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    m = build_fs_stack(tmp_path / "fs", cpu_blocks=4)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    monkeypatch.setattr(fs_io, "write_block", fail_with(code))
    ctx = ReqContext("r")
    store(m, [key(1), key(2), key(3)], ctx)
    name = errno.errorcode[code]
    assert tier.get_stats().store_errors == {name: 1}
    assert tier.get_stats().failed_store_jobs == 1
    assert tier.lookup(key(1), ctx) is False
    check_no_leaks(m)
    serves_from_cpu(m)
    monkeypatch.undo()
    store(m, [key(4)], ctx)  # the tier works again once the disk does
    assert tier.lookup(key(4), ctx) is True
    m.shutdown()


def test_a_read_error_is_a_failed_promotion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = build_fs_stack(tmp_path / "fs", cpu_blocks=4)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    store(m, [key(1), key(2)], ctx)
    evict_from_cpu(m, ctx)
    monkeypatch.setattr(fs_io, "read_block", fail_with(errno.EIO))
    assert promote(m, key(1), ctx) is MISS
    assert tier.get_stats().drop_reasons == {"EIO": 1}
    check_no_leaks(m)
    monkeypatch.undo()
    assert promote(m, key(2), ctx) is HIT
    serves_from_cpu(m)
    m.shutdown()


def test_an_io_thread_that_raises_still_reports_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = build_fs_stack(tmp_path / "fs", cpu_blocks=4, io_threads=2)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    store(m, [key(1)], ctx)
    evict_from_cpu(m, ctx)

    def broken(data: memoryview) -> int:
        raise RuntimeError("checksum library broke")

    monkeypatch.setattr(layout, "checksum", broken)
    store(m, [key(2), key(3), key(4)], ctx)  # the store job fails, reported
    assert promote(m, key(1), ctx) is MISS  # the load job fails, reported
    stats = tier.get_stats()
    assert stats.failed_store_jobs == 1 and stats.store_errors.get("internal", 0) >= 1
    assert stats.drop_reasons == {"internal": 1}
    check_no_leaks(m)
    serves_from_cpu(m)
    monkeypatch.undo()
    store(m, [key(5)], ctx)  # the I/O threads survived
    evict_from_cpu(m, ctx, start=2 * 10**6)
    assert promote(m, key(5), ctx) is HIT
    m.shutdown()


# -- the root directory ---------------------------------------------------------------------------


def test_a_read_only_root_is_reported_at_construction(tmp_path: Path, mounts: list[Path]) -> None:
    root = tmp_path / "ro"
    build_fs_stack(root).shutdown()  # an existing tier directory, then made read-only
    fresh = tmp_path / "empty"
    fresh.mkdir()
    if os.geteuid() == 0:  # permissions do not stop root: a read-only bind mount does
        ro = tmp_path / "ro-view"
        ro.mkdir()
        if not (
            can_mount()
            and mount(mounts, "--bind", str(tmp_path), str(ro))
            and mount(mounts, "-o", "remount,ro,bind", str(ro))
        ):
            pytest.skip("running as root without the right to mount: no way to be read-only")
        targets = [ro / "ro", ro / "empty"]
    else:
        for path in (root, fresh):
            path.chmod(0o500)
        targets = [root, fresh]
    for target in targets:
        with pytest.raises(ConfigError, match="is not writable"):
            build_fs_stack(target)


def test_symlinked_subdirectories_are_refused_and_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "fs", tmp_path / "outside"
    outside.mkdir()
    build_fs_stack(root).shutdown()
    shard = root / "blocks" / "7f"
    shard.rmdir()
    shard.symlink_to(outside)
    with pytest.raises(ConfigError, match="'7f' as a symlink"):
        build_fs_stack(root)
    shard.unlink()
    # Swapped while the tier runs: the tier keeps writing into the directories it opened.
    m = build_fs_stack(root, cpu_blocks=4)
    (root / "moved").mkdir()
    for sub in ("tmp", "blocks"):
        (root / sub).rename(root / "moved" / sub)
        (root / sub).symlink_to(outside)
    ctx = ReqContext("r")
    store(m, [key(i) for i in range(4)], ctx)
    store(m, [key(i) for i in range(4, 8)], ctx)
    assert m.get_stats().tiers[0].cascaded_blocks == 8
    assert list(outside.iterdir()) == []
    assert len(block_files(root / "moved")) == 8
    m.shutdown()


def test_files_are_0600_and_directories_0700(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    m = build_fs_stack(root, cpu_blocks=8)
    store(m, [key(i) for i in range(8)], ReqContext("r"))
    m.shutdown()
    assert os.lstat(root).st_mode & 0o777 == 0o700
    modes = dict(all_modes(root))
    assert len(modes) > 256
    for path, mode in modes.items():
        assert mode == (0o700 if path.is_dir() else 0o600), path


def test_one_process_per_directory(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    here = Path(__file__).parent
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
            "from _fs import build_fs_stack\n"
            f"m = build_fs_stack({str(root)!r})\n"
            "print('ready', flush=True)\nsys.stdin.read()\nm.shutdown()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        with pytest.raises(ConfigError, match=rf"in use by another process \(pid {holder.pid}\)"):
            build_fs_stack(root)
    finally:
        holder.communicate("", timeout=60)
    m = build_fs_stack(root)  # released when the other process shut its tier down
    # A second tier of the same process is told so, not sent looking for another process.
    with pytest.raises(ConfigError, match="used by another fs tier of this process"):
        build_fs_stack(root)
    m.shutdown()
    build_fs_stack(root).shutdown()  # released at shutdown


def test_delete_on_shutdown_removes_what_the_tier_wrote(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "kv"
    m = build_fs_stack(root, cpu_blocks=8, delete_on_shutdown=True)
    store(m, [key(i) for i in range(8)], ReqContext("r"))
    assert len(block_files(root)) == 8
    m.shutdown()
    assert not root.exists() and (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"root_dir": None}, "root_dir is required"),
        ({"root_dir": 3}, "root_dir must be a path"),
        ({"capacity_blocks": None}, "exactly one of capacity_bytes or capacity_blocks"),
        ({"capacity_bytes": 10**9}, "exactly one of capacity_bytes or capacity_blocks"),
        ({"capacity_blocks": 0}, "capacity_blocks must be a positive integer"),
        ({"capacity_blocks": True}, "capacity_blocks must be a positive integer"),
        ({"capacity_blocks": None, "capacity_bytes": 100}, "smaller than one block"),
        ({"fsync": "sometimes"}, "fsync must be one of 'always', 'never'"),
        ({"io_threads": 0}, "io_threads must be a positive integer"),
        ({"io_threads": 1000}, "io_threads must be at most 64"),
        ({"delete_on_shutdown": "yes"}, "delete_on_shutdown must be true or false"),
    ],
)
def test_bad_arguments_are_config_errors_naming_the_key(
    tmp_path: Path, args: dict[str, Any], match: str
) -> None:
    tier: dict[str, Any] = {"root_dir": str(tmp_path / "fs"), "capacity_blocks": 10, **args}
    tier = {"type": "fs", **{k: v for k, v in tier.items() if v is not None}}
    with pytest.raises(ConfigError, match=match) as info:
        build_manager({"num_blocks": 4, "block_size_bytes": BLOCK, "tiers": [tier]})
    assert "tier 'fs'" in str(info.value)
    assert not (tmp_path / "fs").exists()  # refused before anything was created


def test_a_root_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        build_fs_stack(tmp_path / "file")


# -- capacity -------------------------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["blocks", "bytes"])
def test_capacity_holds_under_concurrent_stores(
    tmp_path: Path, unit: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Many store jobs in flight at once (results collected now and then): the index plus the
    blocks being written never exceed the bound; a job that finds the whole capacity held by
    blocks in flight is refused ("full"), not squeezed in; once drained, the files on disk
    are the index, and their bytes are right."""
    cpu = CPUOffloadingManager(64, block_size_bytes=BLOCK)
    assert cpu.kv_buffer is not None
    file_size = 4096 + BLOCK
    bound = {"capacity_blocks": 20} if unit == "blocks" else {"capacity_bytes": 20 * file_size}
    tier = standalone_tier(tmp_path / "fs", cpu, io_threads=4, **bound)
    rows = cpu.kv_buffer.array
    rows[:] = np.random.default_rng(0).integers(0, 256, rows.shape, dtype=np.uint8)
    source = {}  # key -> the CPU row it was stored from
    results = []
    caplog.set_level(logging.ERROR, "kv_offload.fs_tier")  # the refusals are expected here

    def submit(job_id: int) -> None:
        keys = [key(job_id * 4 + j) for j in range(4)]
        slots = np.arange(job_id % 16 * 4, job_id % 16 * 4 + 4, dtype=np.int64)
        source.update(zip(keys, slots.tolist()))
        tier.submit_store(JobMetadata(job_id, keys, slots, JobDirection.STORE, ReqContext("r")))
        assert len(tier) + tier.blocks_being_stored <= 20

    def collect(total: int) -> None:
        while len(results) < total:
            results.extend(tier.get_finished())

    # Waves of 4 jobs (16 blocks) in flight on 4 threads, evicting as they go: all fit.
    for wave in range(12):
        for job_id in range(wave * 4, wave * 4 + 4):
            submit(job_id)
        collect(wave * 4 + 4)
    assert all(r.success for r in results)
    assert tier.get_stats().evicted_blocks == 48 * 4 - 20
    # A burst of 12 jobs (48 blocks) at once: what the in-flight blocks cannot make room for
    # is refused.
    for job_id in range(48, 60):
        submit(job_id)
    collect(60)
    ok = {r.job_id for r in results if r.success}
    stats = tier.get_stats()
    assert 48 < len(ok) < 60 and stats.store_errors == {"full": 60 - len(ok)}
    assert len(tier) == 20 and stats.used == (20 if unit == "blocks" else 20 * file_size)
    held = tier.stored_keys()
    assert all(int.from_bytes(k[:8], "big") // 4 in ok for k in held)
    tier.shutdown()  # finishes the background deletes
    assert len(block_files(tmp_path / "fs")) == 20
    reader_cpu = CPUOffloadingManager(20, block_size_bytes=BLOCK)
    reader = standalone_tier(tmp_path / "fs", reader_cpu, **bound)
    assert sorted(reader.stored_keys()) == sorted(held)
    slots = np.arange(20, dtype=np.int64)
    reader.submit_load(JobMetadata(0, held, slots, JobDirection.LOAD, ReqContext("r")))
    done: list[Any] = []
    while not done:
        done = reader.get_finished()
    assert done[0].success
    assert reader_cpu.kv_buffer is not None
    expected = rows[[source[k] for k in held]]
    np.testing.assert_array_equal(reader_cpu.kv_buffer.array, expected)
    reader.shutdown()


def test_a_removed_root_dir_is_reported_once_and_the_tier_recovers_when_it_is_back(
    tmp_path: Path, caplog: Any
) -> None:
    """It logged one ENOENT warning per job forever and never stored again."""
    import shutil
    import time

    root = tmp_path / "fs"
    m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=1000)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    store(m, [key(1), key(2)], ctx)
    m.drain()
    assert tier.lookup(key(1), ctx) is True
    while root.exists():  # the I/O threads may be creating spare files meanwhile
        shutil.rmtree(root, ignore_errors=True)
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        for i in range(10, 70, 2):
            store(m, [key(i), key(i + 1)], ctx)
            m.drain()
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("was removed" in w for w in warnings) == 1, warnings
    assert str(root) in warnings[-1] or any(str(root) in w for w in warnings)
    assert len(warnings) <= 2, warnings  # the removal, not a line per job
    stats = tier.get_stats()
    assert stats.root_lost == 1 and stats.root_gone_jobs > 0
    assert tier.lookup(key(1), ctx) is False  # its blocks went with the directory
    check_no_leaks(m)
    serves_from_cpu(m)
    root.mkdir()  # the directory is back: the tier stores again
    time.sleep(1.1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        for i in range(200, 210, 2):
            store(m, [key(i), key(i + 1)], ctx)
            m.drain()
    assert any("is back" in r.getMessage() for r in caplog.records)
    assert tier.lookup(key(209), ctx) is True
    assert promote(m, key(209), ctx) is HIT  # and its bytes come back from the new directory
    m.shutdown()


def in_shard(shard: int, start: int) -> int:
    """The first ``i >= start`` whose ``key(i)`` goes to ``shard``."""
    from kv_offload_fs_tier.layout import shard_of

    return next(i for i in itertools.count(start) if shard_of(key(i)) == shard)


@pytest.mark.parametrize(
    "removed",
    [["blocks"], ["shards"], ["tmp"], ["blocks", "tmp", "lock", "kv-offload-fs.json"]],
    ids=["blocks", "two shards", "tmp", "everything in it"],
)
def test_a_removed_part_of_root_dir_is_named_and_recreated_with_its_blocks_dropped(
    tmp_path: Path, caplog: Any, removed: list[str]
) -> None:
    """``root_dir/blocks`` removed, ``root_dir`` kept: the log said "root_dir ... was
    removed" (false), no "is back" ever came (the tier's own lock refused the reopen), and
    every cascade failed for the rest of the run. Now the warning names what is missing, the
    blocks that were in it leave the index at once, the tier recreates the layout (it owns
    the directory: it holds its lock), says it is back, and stores again."""
    from kv_offload_fs_tier.layout import shard_of

    root = tmp_path / "fs"
    m = build_fs_stack(root, cpu_blocks=4, capacity_blocks=1000)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("r")
    for i in range(0, 40, 2):
        store(m, [key(i), key(i + 1)], ctx)
    if removed == ["shards"]:
        shards = sorted({shard_of(key(i)) for i in (0, 1)})
        removed = [f"blocks/{s:02x}" for s in shards]
        probes = [in_shard(s, 1000) for s in shards]  # stores that find their shard gone
    else:
        probes = [1000]
    for name in removed:
        path = root / name
        while path.exists():  # the I/O threads may be creating spare files meanwhile
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()
    on_disk = {p.name for p in block_files(root)}
    kept = {i for i in range(40) if key(i).hex() in on_disk}
    assert kept != set(range(40)) or removed == ["tmp"]
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        for i in [*probes, *range(100, 140)]:
            store(m, [key(i)], ctx)
    warnings = [r.getMessage() for r in caplog.records]
    lost = [w for w in warnings if "while the tier ran" in w]
    assert len(lost) == 1 and len(warnings) <= 2, warnings  # the loss, not a line per job
    assert f"under root_dir {root} " in lost[0]  # not "root_dir ... was removed"
    named = ["blocks", "tmp"] if "lock" in removed else removed
    assert all(f"{name}/" in lost[0] for name in named), lost
    assert tier.get_stats().root_lost == 1
    for i in sorted(set(range(40)) - kept):  # the blocks that were in it are gone, at once
        assert tier.lookup(key(i), ctx) is False
    time.sleep(1.1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        for i in range(200, 210, 2):
            store(m, [key(i), key(i + 1)], ctx)
    back = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
    assert len(back) == 1, [r.getMessage() for r in caplog.records]
    assert all((root / name).exists() for name in removed)  # recreated
    assert (root / "lock").read_text().strip() == str(os.getpid())
    assert tier.lookup(key(209), ctx) is True
    assert promote(m, key(209), ctx) is HIT
    for i in kept:  # the blocks of the directories left in place still load
        assert tier.lookup(key(i), ctx) is True, i
        assert promote(m, key(i), ctx) is HIT
    check_no_leaks(m)
    m.shutdown()
    again = build_fs_stack(root, cpu_blocks=4, capacity_blocks=1000)  # a restart finds them
    assert key(209) in again.tiers[0]  # type: ignore[operator]
    again.shutdown()


def test_validate_warns_when_the_capacity_is_larger_than_the_disk(
    tmp_path: Path, mounts: list[Path]
) -> None:
    """It passed in silence, and every store then failed with ENOSPC once the disk filled."""
    from kv_offload import load_config

    disk = tmp_path / "disk"
    disk.mkdir()
    if not (can_mount() and mount(mounts, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk))):
        pytest.skip("mounting a small tmpfs is not allowed here")
    config = {
        "num_blocks": 4,
        "block_size_bytes": 4096,
        "tiers": [{"type": "fs", "root_dir": str(disk / "kvo"), "capacity_blocks": 100_000}],
    }
    with pytest.warns(UserWarning, match=r"needs 819,200,000 bytes .* has 1,048,576 bytes free"):
        load_config(config)
    config["tiers"][0]["capacity_blocks"] = 100  # type: ignore[index]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(config)  # fits: no warning
