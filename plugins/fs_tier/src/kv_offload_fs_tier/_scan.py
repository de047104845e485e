"""What a start (or a ``root_dir`` coming back) finds in the root directory: the blocks to
index, oldest first, and what it cleans up on the way.

A block file is complete once it is under ``blocks/`` (stores write in ``tmp/`` and rename),
so whatever is in ``tmp/`` is a killed process's unfinished store or a spare file, and goes.
A file in a shard of the wrong size cannot be a block of this tier, and goes too; anything
else that is not a block file is counted and left alone (it is not ours to delete).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from . import _format
from ._layout import RootDir, shard_of

__all__ = ["ScanResult", "scan"]

logger = logging.getLogger("kv_offload.fs_tier")


@dataclass
class ScanResult:
    """What a start found: blocks oldest first, and what it cleaned up."""

    keys: list[bytes] = field(default_factory=list)
    temporary_files: int = 0
    wrong_size_files: int = 0
    foreign_entries: int = 0

    def log(self, tier: str, root_dir: Path) -> None:
        """Say what the start cleaned up or left alone (nothing when all was in order)."""
        if self.temporary_files or self.wrong_size_files:
            logger.info(
                "tier %r: removed %d unfinished and %d wrong-size block file(s) left in %s",
                tier,
                self.temporary_files,
                self.wrong_size_files,
                root_dir,
            )
        if self.foreign_entries:
            logger.warning(
                "tier %r: %d entries under %s/blocks are not block files; left alone",
                tier,
                self.foreign_entries,
                root_dir,
            )


def scan(root: RootDir) -> ScanResult:
    """Empty ``tmp/`` (blocks a killed process was writing, spare files) and list the
    complete blocks, least recently written first. Files of the wrong size are removed;
    entries that are not block files are counted and left alone (symlinks are removed,
    never followed). (Listing shards on several threads was no faster: the loop is
    bound by the interpreter, not by ``stat``.)"""
    result = ScanResult()
    for entry in os.scandir(root.tmp_fd):
        if _remove_entry(root.tmp_fd, entry):
            result.temporary_files += 1
    parts = [_scan_shard(root, shard) for shard in enumerate(root.shard_fds)]
    found: list[tuple[int, bytes]] = []
    for part, wrong_size, foreign in parts:
        found += part
        result.wrong_size_files += wrong_size
        result.foreign_entries += foreign
    found.sort()
    result.keys = [key for _, key in found]
    return result


def _scan_shard(
    root: RootDir, shard_fd: tuple[int, int]
) -> tuple[list[tuple[int, bytes]], int, int]:
    """One shard's blocks as (mtime, key), and its wrong-size and foreign entry counts."""
    shard, fd = shard_fd
    found: list[tuple[int, bytes]] = []
    wrong_size = foreign = 0
    size = _format.file_size(root.block_size)
    for entry in os.scandir(fd):
        key = _parse_name(entry.name)
        if key is None or shard_of(key) & 0xFF != shard or entry.is_symlink():
            foreign += 1
            if entry.is_symlink():
                _remove_entry(fd, entry)
            continue
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            foreign += 1
        elif info.st_size != size:
            os.unlink(entry.name, dir_fd=fd)
            wrong_size += 1
        else:
            found.append((info.st_mtime_ns, key))
    return found, wrong_size, foreign


def _parse_name(name: str) -> bytes | None:
    if len(name) % 2 or len(name) > 2 * _format.MAX_KEY_BYTES:
        return None
    try:
        key = bytes.fromhex(name)
    except ValueError:
        return None
    return key if key.hex() == name else None


def _remove_entry(dir_fd: int, entry: os.DirEntry[str]) -> bool:
    """Unlink a file or symlink (never following it); ``False`` for anything else."""
    if entry.is_dir(follow_symlinks=False):
        return False
    try:
        os.unlink(entry.name, dir_fd=dir_fd)
    except OSError:
        return False
    return True
