"""The system calls of one block file, run on the tier's I/O threads.

Every name is opened relative to a directory file descriptor the tier opened (and checked to
be a real directory inside ``root_dir``) at construction, with ``O_NOFOLLOW``: a symlink
planted later in place of a block file or a directory cannot redirect a write outside the root.

Copy-free: a store writes the header and the CPU buffer row with one ``pwritev`` straight from
the row; a load reads the header and the row with one ``preadv`` straight into the row. The
``spare`` byte of a load detects a file longer than a block without a ``stat`` (a file of the
right size is read in one ``preadv``: a regular file reads short only at its end).

Crash safety: a block is written under a temporary name in ``tmp/`` and renamed into its shard
directory only once complete (and, with ``durable``, synced), so a block file is either absent
or whole; a process killed mid-write leaves only a temporary file, removed at the next start.
Evicted files are recycled (moved back to ``tmp/``, overwritten by a later store, renamed
into place like a new one), so a full tier rarely creates or deletes a file.
"""

from __future__ import annotations

import contextlib
import os

__all__ = [
    "create_spare",
    "read_block",
    "recycle_block",
    "remove_block",
    "sync_dir",
    "write_block",
]

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# macOS has no fdatasync; fsync is the same guarantee there, and more.
_datasync = getattr(os, "fdatasync", os.fsync)
_REUSE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    """``pwritev`` until every byte is written (a short write happens, e.g. on a full disk,
    before the error that follows it)."""
    offset = 0
    while buffers:
        written = os.pwritev(fd, buffers, offset)
        if written == 0:  # pragma: no cover - regular files never write 0 bytes without error
            raise OSError("pwritev wrote nothing")
        offset += written
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers and written:
            buffers[0] = buffers[0][written:]


def write_block(
    tmp_fd: int,
    shard_fd: int,
    name: str,
    header: list[memoryview],
    row: memoryview,
    durable: bool,
    spare: tuple[str, int] | None = None,
) -> None:
    """Write ``header`` (buffers) + ``row`` as block file ``name`` of the shard, atomically.

    ``spare`` (name in ``tmp/``, size) is an evicted block's file to overwrite instead of
    creating a new one: on ext4 a new file's first write costs ~10x an overwrite (measured
    by ``benchmarks/fs_tier.py``, "cold" against "steady" stores). It is as invisible as a
    new temporary file until the rename.
    """
    size = sum(len(part) for part in header) + len(row)
    if spare is None:
        tmp_name = name + ".tmp"
        fd = os.open(tmp_name, _WRITE_FLAGS, 0o600, dir_fd=tmp_fd)
    else:
        tmp_name = spare[0]
        fd = os.open(tmp_name, _REUSE_FLAGS, dir_fd=tmp_fd)
    try:
        try:
            _write_all(fd, [*header, row])
            if spare is not None and spare[1] > size:
                os.ftruncate(fd, size)
            if durable:
                _datasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=shard_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name, dir_fd=tmp_fd)
        raise


def create_spare(tmp_fd: int, name: str) -> None:
    """An empty file ``tmp/name`` for a later store to fill (see ``write_block``'s
    ``spare``): creating a file is most of the cost of storing a block in a new one."""
    os.close(os.open(name, _WRITE_FLAGS, 0o600, dir_fd=tmp_fd))


def recycle_block(shard_fd: int, name: str, tmp_fd: int, spare_name: str) -> bool:
    """Move an evicted block file out of its shard, to ``tmp/spare_name`` for reuse;
    ``False`` if it was already gone."""
    try:
        os.rename(name, spare_name, src_dir_fd=shard_fd, dst_dir_fd=tmp_fd)
    except FileNotFoundError:
        return False
    return True


def read_block(shard_fd: int, name: str, head: bytearray, row: memoryview, spare: bytearray) -> int:
    """Read block file ``name`` into ``head`` then ``row`` (then ``spare``, for a file too
    long); the number of bytes read."""
    fd = os.open(name, _READ_FLAGS, dir_fd=shard_fd)
    try:
        buffers = [memoryview(head), row, memoryview(spare)]
        block_file = len(head) + len(row)
        total = 0
        while buffers:
            got = os.preadv(fd, buffers, total)
            if got == 0:
                break
            total += got
            if total == block_file:
                # A short read of a regular file ends at its end: the file is one block
                # long, the spare byte stays empty (one system call, not a second for EOF).
                break
            while buffers and got >= len(buffers[0]):
                got -= len(buffers[0])
                buffers.pop(0)
            if buffers and got:
                buffers[0] = buffers[0][got:]
        return total
    finally:
        os.close(fd)


def remove_block(shard_fd: int, name: str) -> bool:
    """Delete block file ``name``; ``False`` if it was already gone."""
    try:
        os.unlink(name, dir_fd=shard_fd)
    except FileNotFoundError:
        return False
    return True


def sync_dir(dir_fd: int) -> None:
    """Make the renames into a directory durable."""
    os.fsync(dir_fd)
