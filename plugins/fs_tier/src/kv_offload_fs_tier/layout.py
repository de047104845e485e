"""The fs tier on disk: the block file format, the root directory, what a start finds in it,
and a ``root_dir`` removed while the tier runs.

Nothing here keeps state of the tier: :class:`RootDir` is a set of directory descriptors the
scheduler opens (and the I/O threads write through), :func:`scan` and :class:`RootWatch` run
on the scheduler thread, and the format's functions are pure (the I/O threads call them).

**The block file.** A header page of :data:`HEADER_SPACE` bytes (``HEADER``, 32 bytes little
endian, then the key, then zeros) followed by the block's bytes::

    magic         8s   b"KVOFSBLK"
    version       u16  FORMAT_VERSION
    key_len       u16  length of the key that follows the header
    flags         u32  0, or FLAG_AUTHENTICATED
    payload_len   u64  block size in bytes
    checksum      u64  xxh3-64 of the block's bytes (0 when authenticated)

With ``auth_key_env`` the tier sets ``FLAG_AUTHENTICATED`` and writes, right after the key,
the 40-byte record of :class:`kv_offload.block_auth.BlockAuth`: algorithm, key id and a MAC
keyed by the tenant's secret over the key, block size, format version and the block's bytes.
The MAC replaces the checksum (it catches every change the checksum would, and forgeries).
A tier with authentication refuses unsigned files and files signed with a secret it does not
hold; one without refuses signed files (it cannot check them). Like every block that fails
its check, they are deleted: the root has one owner process, no other reader could use them.

The header takes a whole page so that the block's bytes, and the file's end, are page aligned:
overwriting a recycled file whose last page is partial and no longer cached makes the kernel
read that page first, ~4x the cost of the write (measured on ext4, see
``benchmarks/fs_tier.py``).

On load every field is compared with what the reader expects (this format, this key, this
block size) and the checksum of the bytes read is recomputed, so a truncated, bit-flipped,
swapped or foreign file is refused instead of served.

**Speed** (docs/architecture.md, "Speed and where it is allowed"): :func:`verify` checks a
block as this tier writes it in one comparison (its header page rebuilt from the key, the
block size and the checksum of the bytes read, compared whole: a 4 KiB ``memcmp``) and runs
the field by field checks, which name what is wrong, only when that fails. Benchmark:
``benchmarks/fs_tier.py`` (loads against raw ``preadv`` and vLLM 0.34's fs tier, same run);
reference: the field checks, which ``tests/fs_tier/test_fs_format.py`` holds the comparison
to (every one-byte change of a written header page is refused), and the corruption tests.

**The root directory**::

    root_dir/
      kv-offload-fs.json   format version, block size, checksum (written once, atomically)
      lock                 flock()ed by the process using the directory
      tmp/                 blocks being written (emptied at every start)
      blocks/00 .. ff/     one file per block, named by the hex of its key

The marker (:data:`MARKER_NAME`) names the format version and block size, so a directory
written with another block size or format is refused at construction instead of misread
block by block. Keys never become paths: a file name is the key's hex, under one of 256 shard
directories chosen by a hash of the key. Every directory is opened once, here, with
``O_NOFOLLOW`` and checked to be a real directory; the I/O threads then only use names
relative to those descriptors, so nothing is ever created outside ``root_dir``, even if a
subdirectory is replaced by a symlink while the tier runs. Directories are 0700, files 0600.

**A start** (:func:`scan`): a block file is complete once it is under ``blocks/`` (stores
write in ``tmp/`` and rename), so whatever is in ``tmp/`` is a killed process's unfinished
store or a spare file, and goes. A file in a shard of the wrong size cannot be a block of this
tier, and goes too; anything else that is not a block file is counted and left alone (it is
not ours to delete).

**A removed ``root_dir``** (:class:`RootWatch`): someone removes the directory (a cleanup
script, an unmounted volume), or part of it (``blocks/``, a shard, ``tmp/``): the blocks in it
are gone. Rather than fail each store with its own ``ENOENT`` warning, the tier says once what
is missing, drops its index (the blocks still on disk are found again) and fails its jobs at
once, and looks again at most every :data:`ROOT_RETRY_S` seconds (only with no job in flight
on the old directory). A removed ``root_dir`` is waited for, never recreated (it may be an
unmounted volume's mount point); a ``root_dir`` still in place gets its layout recreated, as
at start. Either way it is then scanned like at start (a remounted volume may come back with
its blocks). Directories it replaced stay open until shutdown: I/O queued before the loss may
still use their descriptors.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash
from kv_offload.block_auth import RECORD_SIZE, BlockAuth
from kv_offload.errors import ConfigError

__all__ = [
    "AUTH_CONTEXT",
    "CHECKSUM_NAME",
    "FLAG_AUTHENTICATED",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_SPACE",
    "MAGIC",
    "MARKER_NAME",
    "MAX_KEY_BYTES",
    "NUM_SHARDS",
    "ROOT_RETRY_S",
    "RootDir",
    "RootWatch",
    "ScanResult",
    "bad_key",
    "checksum",
    "file_size",
    "key_hash",
    "key_name",
    "marker_bytes",
    "pack_header",
    "pack_signed_header",
    "parse_marker",
    "scan",
    "shard_of",
    "verify",
]

logger = logging.getLogger("kv_offload.fs_tier")

# -- the block file ---------------------------------------------------------------------------

FORMAT_VERSION = 1
MAGIC = b"KVOFSBLK"
HEADER = struct.Struct("<8sHHIQQ")
HEADER_SPACE = 4096
_ZEROS = bytes(HEADER_SPACE)
CHECKSUM_NAME = "xxh3_64"
MARKER_NAME = "kv-offload-fs.json"
#: A key becomes a file name as hex: 2 characters a byte, under the usual 255-byte limit.
MAX_KEY_BYTES = 120
FLAG_AUTHENTICATED = 1
#: What the MAC binds a block to besides its key (a block of another tier never verifies).
AUTH_CONTEXT = b"kv-offload-fs-tier"


def bad_key(keys: Iterable[object]) -> str | None:
    """Why a job's keys cannot name block files (the first that cannot), or ``None``."""
    for key in keys:
        if not isinstance(key, bytes) or not key or len(key) > MAX_KEY_BYTES:
            return (
                f"key {key!r} is not 1..{MAX_KEY_BYTES} bytes (build keys with "
                "kv_offload.make_offload_key)"
            )
    return None


def checksum(data: memoryview) -> int:
    """xxh3-64 of ``data``, hashed in place (no copy)."""
    return xxhash.xxh3_64_intdigest(data)


def file_size(block_size: int) -> int:
    return HEADER_SPACE + block_size


def pack_header(key: bytes, block_size: int, digest: int) -> list[memoryview]:
    """The header page as buffers for ``pwritev`` (the zero padding is not copied)."""
    head = HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, block_size, digest) + key
    return [memoryview(head), memoryview(_ZEROS)[len(head) :]]


def pack_signed_header(
    key: bytes, block_size: int, row: memoryview, auth: BlockAuth
) -> list[memoryview]:
    """The header page of an authenticated block: flagged, the record after the key."""
    record = auth.sign(key, block_size, FORMAT_VERSION, row)
    head = (
        HEADER.pack(MAGIC, FORMAT_VERSION, len(key), FLAG_AUTHENTICATED, block_size, 0)
        + key
        + record
    )
    return [memoryview(head), memoryview(_ZEROS)[len(head) :]]


def verify(
    head: bytearray,
    key: bytes,
    block_size: int,
    nread: int,
    row: memoryview,
    auth: BlockAuth | None = None,
) -> tuple[str, str] | None:
    """Why the file read into ``head`` + ``row`` (``nread`` bytes in all) is not ``key``'s
    block, as ``(kind, message)``, or ``None`` when it is. With ``auth`` the block must be
    signed by a secret it holds (kinds of :data:`kv_offload.block_auth.AUTH_KINDS`).

    A block as this tier writes it is checked in one comparison: its header page rebuilt
    from ``key``, the block size and the checksum of the bytes read, against the page read
    (a 4 KiB ``memcmp``; the field by field checks below, which name what is wrong, run only
    when it differs)."""
    expected = HEADER_SPACE + block_size
    if auth is None and nread == expected:
        head_len = HEADER.size + len(key)
        page = HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, block_size, checksum(row))
        if head == page + key + _ZEROS[head_len:]:
            return None
    if nread < expected:
        return "truncated", f"truncated ({nread} of {expected} bytes)"
    if nread > expected:
        return "too_long", f"longer than a block file ({expected} bytes)"
    magic, version, key_len, flags, payload_len, digest = HEADER.unpack_from(head)
    if magic != MAGIC:
        return "foreign", "not a kv-offload block file (bad magic)"
    if version != FORMAT_VERSION:
        return "version", f"format version {version}, this tier reads {FORMAT_VERSION}"
    if flags & ~FLAG_AUTHENTICATED:  # a set bit is damage (or a newer writer), never ignored
        return "header", f"unknown header flags {flags:#x}"
    signed = bool(flags & FLAG_AUTHENTICATED)
    if signed and auth is None:
        return "signed", "a signed block, and this tier has no auth_key_env to check it"
    if auth is not None and not signed:
        return "unsigned", "an unsigned block in an authenticated tier"
    if payload_len != block_size:
        return "block_size", f"a block of {payload_len} bytes, this tier stores {block_size}"
    end = HEADER.size + len(key)
    if key_len != len(key) or head[HEADER.size : end] != key:
        return "wrong_key", "the file holds another key's block"
    stop = end + RECORD_SIZE if signed else end
    if head.count(0, stop) != HEADER_SPACE - stop:
        return "header", "damaged header padding"
    if auth is not None:
        failure = auth.verify(memoryview(head)[end:stop], key, block_size, FORMAT_VERSION, row)
        return None if failure is None else (failure.kind, failure.message)
    if checksum(row) != digest:
        return "checksum", "checksum mismatch"
    return None


def marker_bytes(block_size: int) -> bytes:
    marker = {
        "format": "kv-offload-fs",
        "format_version": FORMAT_VERSION,
        "block_size_bytes": block_size,
        "checksum": CHECKSUM_NAME,
    }
    return (json.dumps(marker, indent=2) + "\n").encode()


def parse_marker(data: bytes) -> dict[str, Any] | None:
    """The marker's fields, or ``None`` if ``data`` is not a marker this tier wrote."""
    try:
        marker = json.loads(data)
    except ValueError:
        return None
    if not isinstance(marker, dict) or marker.get("format") != "kv-offload-fs":
        return None
    return marker


# -- the root directory -----------------------------------------------------------------------

NUM_SHARDS = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def key_hash(key: bytes) -> int:
    """The key's 64-bit hash: modulo :data:`NUM_SHARDS` its shard (:func:`shard_of`); the I/O
    side picks the key's thread from the rest, so one hash places a key on disk and on a
    thread."""
    return xxhash.xxh3_64_intdigest(key)


def shard_of(key: bytes) -> int:
    """The shard directory (``blocks/<shard:02x>``) holding ``key``'s file."""
    return key_hash(key) % NUM_SHARDS


def key_name(key: bytes) -> str:
    return key.hex()


def _in_place(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file or directory open as ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class RootDir:
    """Opens (creating if needed), locks and checks ``root_dir`` for blocks of ``block_size``."""

    def __init__(self, root_dir: Path, block_size: int, tier: str) -> None:
        self.path = root_dir
        self.block_size = block_size
        self.tier = tier
        self.created = False
        self._fds: list[int] = []
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _error(self, what: str, fix: str) -> ConfigError:
        return ConfigError(f"tier {self.tier!r}: root_dir {str(self.path)!r} {what}; {fix}")

    def _open(self) -> None:
        path = self.path
        if not path.exists():
            try:
                path.mkdir(mode=0o700, parents=True)
            except OSError as exc:
                raise self._error(
                    f"cannot be created ({exc.strerror})", "choose a writable location"
                ) from exc
            self.created = True
        try:
            self.root_fd = self._keep(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as exc:
            raise self._error(
                f"is not a usable directory ({exc.strerror})", "fix the path"
            ) from exc
        self._lock()
        self._check_marker()
        self.tmp_fd = self._subdir(self.root_fd, "tmp")
        self.blocks_fd = self._subdir(self.root_fd, "blocks")
        self.shard_fds = [self._subdir(self.blocks_fd, f"{i:02x}") for i in range(NUM_SHARDS)]
        self._probe_writable()

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _lock(self) -> None:
        try:
            fd = self.lock_fd = self._keep(
                os.open(
                    "lock",
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                    dir_fd=self.root_fd,
                )
            )
        except OSError as exc:
            raise self._read_only(exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            if owner == str(os.getpid()):  # flock is per open file: a second tier here
                raise self._error(
                    "is used by another fs tier of this process",
                    "give each fs tier of a stack its own root_dir",
                ) from exc
            raise self._error(
                f"is in use by another process (pid {owner})",
                "give each process its own root_dir, or stop the other process",
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def _read_only(self, exc: OSError) -> ConfigError:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return self._error(
                f"is not writable ({exc.strerror})",
                "the fs tier writes blocks there: choose a writable directory or fix its "
                "permissions",
            )
        return self._error(f"cannot be used ({exc.strerror})", "check the path")

    def _check_marker(self) -> None:
        want = marker_bytes(self.block_size)
        try:
            fd = os.open(MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.root_fd)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            try:
                data = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
            marker = parse_marker(data)
            if marker is None:
                raise self._error(
                    f"has a damaged or foreign {MARKER_NAME}",
                    "point root_dir at a directory of its own, or delete this one",
                )
            version = marker.get("format_version")
            if version != FORMAT_VERSION:
                raise self._error(
                    f"was written in fs-tier format version {version!r}, this version reads "
                    f"{FORMAT_VERSION}",
                    "point root_dir at another directory, or delete this one",
                )
            size = marker.get("block_size_bytes")
            if size != self.block_size:
                raise self._error(
                    f"holds blocks of {size!r} bytes, this stack's block_size_bytes is "
                    f"{self.block_size}",
                    "use a root_dir per block size, or delete this one",
                )
            return
        for name in ("blocks", "tmp"):
            try:
                os.stat(name, dir_fd=self.root_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            raise self._error(
                f"has a {name!r} entry but no {MARKER_NAME}: it was not written by the "
                "kv-offload fs tier",
                "point root_dir at an empty or new directory",
            )
        tmp = MARKER_NAME + ".tmp"
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                0o600,
                dir_fd=self.root_fd,
            )
            try:
                os.write(fd, want)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, MARKER_NAME, src_dir_fd=self.root_fd, dst_dir_fd=self.root_fd)
            os.fsync(self.root_fd)
        except OSError as exc:
            raise self._read_only(exc) from exc

    def _subdir(self, parent_fd: int, name: str) -> int:
        try:
            fd = self._keep(self._open_or_make(parent_fd, name))
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._error(
                    f"has {name!r} as a symlink or a file, not a directory",
                    "the fs tier creates nothing outside root_dir: remove that entry",
                ) from exc
            raise self._read_only(exc) from exc
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
            try:
                os.fchmod(fd, 0o700)
            except OSError as exc:
                raise self._read_only(exc) from exc
        return fd

    def _open_or_make(self, parent_fd: int, name: str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._read_only(exc) from exc
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)

    def _probe_writable(self) -> None:
        """A read-only root_dir fails here, at construction, not on the first store."""
        try:
            fd = os.open(
                "probe.tmp",
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                0o600,
                dir_fd=self.tmp_fd,
            )
            os.close(fd)
            os.unlink("probe.tmp", dir_fd=self.tmp_fd)
        except OSError as exc:
            raise self._read_only(exc) from exc

    def free_files(self) -> int | None:
        """Block files the filesystem has room for (bytes and, where it counts them, inodes);
        ``None`` where it reports no size (some FUSE filesystems)."""
        try:
            info = os.fstatvfs(self.tmp_fd)
        except OSError:
            return None
        if info.f_blocks == 0:
            return None
        files = info.f_bavail * info.f_frsize // file_size(self.block_size)
        return min(files, info.f_favail) if info.f_files else files

    def missing(self) -> list[str]:
        """What of the layout is no longer in place (removed, or replaced by another entry),
        relative to ``root_dir``: ``[]`` when all is, ``["."]`` when ``root_dir`` itself is
        gone. (A shard is only named when ``blocks/`` itself is in place.)"""
        path = self.path
        if not _in_place(path, self.root_fd):
            return ["."]
        entries = [("tmp/", self.tmp_fd), ("blocks/", self.blocks_fd), ("lock", self.lock_fd)]
        gone = [name for name, fd in entries if not _in_place(path / name, fd)]
        if "blocks/" not in gone:
            gone += [
                f"blocks/{shard:02x}/"
                for shard, fd in enumerate(self.shard_fds)
                if not _in_place(path / "blocks" / f"{shard:02x}", fd)
            ]
        if not (path / MARKER_NAME).exists():
            gone.append(MARKER_NAME)
        return gone

    def release_lock(self) -> None:
        """Let go of ``root_dir``'s lock (to reopen the directory in this process: ``flock``
        is per open file, the new one would be refused); the other descriptors stay open
        for the I/O queued on them."""
        fd = self.lock_fd
        if fd in self._fds:
            self._fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Close every descriptor; closing the lock file releases the lock."""
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            with contextlib.suppress(OSError):
                os.close(fd)

    def destroy(self) -> None:
        """Delete everything the tier wrote (after :meth:`close`), and ``root_dir`` itself if
        the tier created it and it is now empty."""
        for name in ("blocks", "tmp"):
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
        for name in (MARKER_NAME, "lock"):
            with contextlib.suppress(OSError):
                (self.path / name).unlink()
        if self.created:
            with contextlib.suppress(OSError):
                self.path.rmdir()


# -- what a start finds ----------------------------------------------------------------------


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
    size = file_size(root.block_size)
    for entry in os.scandir(fd):
        key = _parse_name(entry.name)
        if key is None or shard_of(key) != shard or entry.is_symlink():
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
    if len(name) % 2 or len(name) > 2 * MAX_KEY_BYTES:
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


# -- a removed root_dir ----------------------------------------------------------------------

#: Seconds between two looks for a removed ``root_dir``.
ROOT_RETRY_S = 1.0


class RootWatch:
    """Whether ``root_dir`` is gone, since when, and the directories it replaced."""

    def __init__(self, path: Path, block_size: int, tier: str) -> None:
        self.path = path
        self.block_size = block_size
        self.tier = tier
        #: monotonic time the directory was found removed (``None``: present)
        self.lost_since: float | None = None
        self._checked = 0.0
        self._missing: list[str] = []
        self._old: list[RootDir] = []

    @property
    def gone(self) -> bool:
        return self.lost_since is not None

    def lose(self, blocks: int, missing: list[str]) -> None:
        """Part of the directory (``missing``, from :meth:`RootDir.missing`; ``["."]``: all
        of it) was removed with ``blocks`` blocks indexed: say what, once."""
        self.lost_since = self._checked = time.monotonic()
        self._missing = missing
        if missing == ["."]:
            logger.warning(
                "tier %r: root_dir %s was removed while the tier ran (its %d blocks are "
                "gone); its jobs fail at once until the directory exists again (looked for "
                "every %.0f s)",
                self.tier,
                self.path,
                blocks,
                ROOT_RETRY_S,
            )
            return
        logger.warning(
            "tier %r: %s under root_dir %s %s removed while the tier ran (the %d blocks "
            "indexed leave the index; those still on disk are found again); its jobs fail at "
            "once until the tier has recreated what is missing, within %.0f s once no job is "
            "in flight",
            self.tier,
            ", ".join(missing),
            self.path,
            "was" if len(missing) == 1 else "were",
            blocks,
            ROOT_RETRY_S,
        )

    def reopen(self, current: RootDir, jobs_in_flight: bool) -> tuple[RootDir, ScanResult] | None:
        """While gone: the directory opened and scanned again once it exists (looked for at
        most every :data:`ROOT_RETRY_S`, and only with no job in flight on ``current``). A
        ``root_dir`` that is still the one the tier opened (only entries in it were removed)
        is the tier's: its layout is recreated. One that was removed is never recreated
        here (it may be an unmounted volume's mount point): it must come back."""
        now = time.monotonic()
        if now - self._checked < ROOT_RETRY_S or jobs_in_flight:
            return None
        self._checked = now
        if not self.path.is_dir():
            return None
        kept = current.missing() != ["."]
        if kept:
            current.release_lock()  # the new RootDir takes it again (flock is per open file)
        try:
            root = RootDir(self.path, self.block_size, self.tier)
            found = scan(root)
        except (ConfigError, OSError) as exc:
            logger.debug("tier %r: root_dir %s not usable yet: %s", self.tier, self.path, exc)
            return None
        self._old.append(current)
        recreated = f"{', '.join(self._missing)} recreated, " if kept else ""
        logger.warning(
            "tier %r: root_dir %s is back after %.1f s (%s%d blocks in it); storing again",
            self.tier,
            self.path,
            now - (self.lost_since or now),
            recreated,
            len(found.keys),
        )
        self.lost_since = None
        return root, found

    def close(self) -> None:
        """Shutdown: close the directories the current one replaced."""
        for old in self._old:
            old.close()
        self._old.clear()
