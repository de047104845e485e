"""The root directory of an fs tier: its layout and its lock (:mod:`._scan` reads what is
in it).

::

    root_dir/
      kv-offload-fs.json   format version, block size, checksum (written once, atomically)
      lock                 flock()ed by the process using the directory
      tmp/                 blocks being written (emptied at every start)
      blocks/00 .. ff/     one file per block, named by the hex of its key

Keys never become paths: a file name is the key's hex, under one of 256 shard directories
chosen by a hash of the key. Every directory is opened once, here, with ``O_NOFOLLOW`` and
checked to be a real directory; the I/O threads then only use names relative to those
descriptors, so nothing is ever created outside ``root_dir``, even if a subdirectory is
replaced by a symlink while the tier runs. Directories are 0700, files 0600.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path

import xxhash
from kv_offload.errors import ConfigError

from . import _format

__all__ = ["RootDir", "key_name", "shard_of"]


NUM_SHARDS = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def shard_of(key: bytes) -> int:
    """The key's 64-bit hash: the low byte picks the shard, the rest the I/O thread."""
    return xxhash.xxh3_64_intdigest(key)


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
        want = _format.marker_bytes(self.block_size)
        try:
            fd = os.open(_format.MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.root_fd)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            try:
                data = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
            marker = _format.parse_marker(data)
            if marker is None:
                raise self._error(
                    f"has a damaged or foreign {_format.MARKER_NAME}",
                    "point root_dir at a directory of its own, or delete this one",
                )
            version = marker.get("format_version")
            if version != _format.FORMAT_VERSION:
                raise self._error(
                    f"was written in fs-tier format version {version!r}, this version reads "
                    f"{_format.FORMAT_VERSION}",
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
                f"has a {name!r} entry but no {_format.MARKER_NAME}: it was not written by the "
                "kv-offload fs tier",
                "point root_dir at an empty or new directory",
            )
        tmp = _format.MARKER_NAME + ".tmp"
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
            os.rename(tmp, _format.MARKER_NAME, src_dir_fd=self.root_fd, dst_dir_fd=self.root_fd)
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
        if not (path / _format.MARKER_NAME).exists():
            gone.append(_format.MARKER_NAME)
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
        for name in (_format.MARKER_NAME, "lock"):
            with contextlib.suppress(OSError):
                (self.path / name).unlink()
        if self.created:
            with contextlib.suppress(OSError):
                self.path.rmdir()
