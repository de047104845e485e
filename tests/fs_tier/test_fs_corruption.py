"""Damaged block files are failed loads (the CPU slot freed, the key a MISS), dropped, counted,
and never served; a directory of another block size or format is refused at construction."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
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
)
from _tiers import key
from kv_offload import ConfigError, ReqContext, TieringOffloadingManager
from kv_offload_fs_tier import FileSystemTier

HEADER = 4096  # the header page: 32 bytes, the key, zeros


def file_of(root: Path, i: int) -> Path:
    (path,) = [p for p in block_files(root) if p.name == key(i).hex()]
    return path


def flip_payload_bit(root: Path) -> None:
    path = file_of(root, 1)
    data = bytearray(path.read_bytes())
    data[HEADER + 1000] ^= 0x10
    path.write_bytes(bytes(data))


def flip_header_key_bit(root: Path) -> None:
    path = file_of(root, 1)
    data = bytearray(path.read_bytes())
    data[32 + 11] ^= 0x01  # the last byte of the key in the header
    path.write_bytes(bytes(data))


def truncate(root: Path) -> None:
    path = file_of(root, 1)
    path.write_bytes(path.read_bytes()[: HEADER + BLOCK // 2])


def append(root: Path) -> None:
    path = file_of(root, 1)
    path.write_bytes(path.read_bytes() + b"x")


def swap(root: Path) -> None:
    a, b = file_of(root, 1), file_of(root, 2)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)


def other_version(root: Path) -> None:
    path = file_of(root, 1)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 8, 99)
    path.write_bytes(bytes(data))


def foreign_file(root: Path) -> None:
    path = file_of(root, 1)
    path.write_bytes(b"\0" * len(path.read_bytes()))


def other_block_size_header(root: Path) -> None:
    """A file claiming another block size (the file size still fits: a foreign writer)."""
    path = file_of(root, 1)
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, 16, BLOCK * 2)
    path.write_bytes(bytes(data))


def flip_padding_bit(root: Path) -> None:
    path = file_of(root, 1)
    data = bytearray(path.read_bytes())
    data[HEADER - 1] ^= 0x80
    path.write_bytes(bytes(data))


DAMAGE: dict[str, tuple[Callable[[Path], None], dict[str, int]]] = {
    "bit-flip": (flip_payload_bit, {"checksum": 1}),
    "header-bit-flip": (flip_header_key_bit, {"wrong_key": 1}),
    "padding-bit-flip": (flip_padding_bit, {"header": 1}),
    "truncated": (truncate, {"truncated": 1}),
    "appended": (append, {"too_long": 1}),
    "swapped": (swap, {"wrong_key": 2}),
    "other-version": (other_version, {"version": 1}),
    "zeroed": (foreign_file, {"foreign": 1}),
    "other-block-size": (other_block_size_header, {"block_size": 1}),
}


def stack_with_blocks(root: Path) -> tuple[TieringOffloadingManager, FileSystemTier]:
    m = build_fs_stack(root, cpu_blocks=4)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    ctx = ReqContext("w")
    store(m, [key(i) for i in range(1, 5)], ctx)
    evict_from_cpu(m, ctx)  # keys 1..4 now only on disk
    return m, tier


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_block_is_a_failed_load_never_wrong_bytes(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "fs"
    m, tier = stack_with_blocks(root)
    hurt, reasons = DAMAGE[damage]
    hurt(root)
    ctx = ReqContext("r")
    damaged = {1, 2} if damage == "swapped" else {1}
    for i in range(1, 5):
        expected = MISS if i in damaged else HIT
        assert promote(m, key(i), ctx) is expected, i  # a HIT's bytes are checked
    stats = tier.get_stats()
    assert stats.drop_reasons == reasons
    assert stats.dropped_blocks == len(damaged) == stats.failed_load_jobs
    assert m.get_stats().tiers[0].failed_promotions == len(damaged)
    for i in damaged:
        assert tier.lookup(key(i), ctx) is False  # dropped from the index...
        assert not any(p.name == key(i).hex() for p in block_files(root))  # ...and the disk
        assert m.primary.ref_count(key(i)) is None  # the reserved CPU slot was freed
    check_no_leaks(m)
    m.shutdown()


def test_a_truncated_file_found_at_start_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    m, _ = stack_with_blocks(root)
    m.shutdown()
    truncate(root)
    m = build_fs_stack(root, cpu_blocks=4)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    assert tier.get_stats().removed_wrong_size_files == 1
    assert tier.lookup(key(1), ReqContext("r")) is False
    assert promote(m, key(2), ReqContext("r")) is HIT
    m.shutdown()


def test_a_directory_of_another_block_size_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    m, _ = stack_with_blocks(root)
    m.shutdown()
    with pytest.raises(ConfigError) as info:
        build_fs_stack(root, cpu_blocks=4, block=BLOCK * 2)
    message = str(info.value)
    assert f"holds blocks of {BLOCK} bytes" in message and str(BLOCK * 2) in message
    assert str(root) in message and "tiers[0]" in message
    # Refused before anything changed: the blocks are still there for the right block size.
    m = build_fs_stack(root, cpu_blocks=4)
    assert promote(m, key(1), ReqContext("r")) is HIT
    m.shutdown()


def test_a_directory_of_another_format_version_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    build_fs_stack(root).shutdown()
    marker = root / "kv-offload-fs.json"
    data = json.loads(marker.read_text())
    data["format_version"] = 2
    marker.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="format version 2, this version reads 1"):
        build_fs_stack(root)
    marker.write_text("not json")
    with pytest.raises(ConfigError, match="damaged or foreign"):
        build_fs_stack(root)


def test_a_directory_with_foreign_contents_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    (root / "blocks").mkdir(parents=True)
    with pytest.raises(ConfigError, match="not written by the kv-offload fs tier"):
        build_fs_stack(root)
