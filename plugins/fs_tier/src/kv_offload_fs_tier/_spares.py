"""Spare block files: evicted files kept for reuse, and empty files made ahead of stores.

Creating a file costs more than writing a block into it (0.1 to 1 ms against ~0.2 ms for
256 KiB on the development VM's ext4, see ``benchmarks/fs_tier.py``). So an evicted block's
file is renamed into ``tmp/`` instead of deleted (up to :attr:`SparePool.limit`), and while the
I/O threads have nothing to do they create empty files ahead of stores (up to
``precreate_files``, never more than the capacity has room for); a store overwrites a spare
instead of creating a file. Shared by the scheduler and the I/O threads: the deque's ends are
thread-safe, and each spare is taken once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable

from . import _io

__all__ = ["PRECREATE_FILES", "SPARE_FILES", "SparePool"]

logger = logging.getLogger("kv_offload.fs_tier")

#: Evicted block files kept for reuse at most (the rest are deleted).
SPARE_FILES = 256
#: Empty files the I/O threads create ahead of stores while idle, at most: a burst of stores
#: into a tier with room fills files made while it was idle; a sustained stream beyond them
#: pays the creation again.
PRECREATE_FILES = 256

#: A spare: its name in ``tmp/`` and the bytes it holds (0 for an empty file).
Spare = tuple[str, int]


class SparePool:
    """The spare files of one tier, in its ``tmp/`` directory."""

    def __init__(self, tier: str, precreate_files: int) -> None:
        self.tier = tier
        self.precreate_files = precreate_files
        self._spares: deque[Spare] = deque()
        self._ids = itertools.count()
        self._precreate_lock = threading.Lock()
        self._precreating = precreate_files > 0
        #: spares kept at most: :data:`SPARE_FILES`, fewer on a disk the capacity nearly
        #: fills (their room is not in the capacity; see :mod:`._disk`)
        self.limit = SPARE_FILES
        self.precreated = 0

    def __len__(self) -> int:
        return len(self._spares)

    def take(self) -> Spare | None:
        """A spare for a store to overwrite, or ``None`` (the store creates its file)."""
        try:
            return self._spares.popleft()
        except IndexError:
            return None

    def recycle(self, shard_fd: int, name: str, tmp_fd: int, file_size: int) -> bool:
        """An evicted block's file: kept as a spare while the pool has room, else deleted;
        whether a file was there to remove (``OSError`` when the OS refuses)."""
        if len(self._spares) < self.limit:
            spare = f"spare-{next(self._ids)}"
            if not _io.recycle_block(shard_fd, name, tmp_fd, spare):
                return False
            self._spares.append((spare, file_size))
            return True
        return _io.remove_block(shard_fd, name)

    def precreate(self, tmp_fd: int, room: Callable[[], int], closed: Callable[[], bool]) -> bool:
        """Idle work of an I/O thread: create one empty spare if the pool is short of
        ``precreate_files`` and of ``room()`` (blocks the capacity still has room for; an
        estimate read without a lock is enough: a spare costs an inode and no data);
        ``False`` when there is nothing to do. A failure (a full disk, ...) stops it for good."""
        with self._precreate_lock:
            spares = self._spares
            if closed() or not self._precreating or len(spares) >= self.precreate_files:
                return False
            if len(spares) >= room():
                return False
            name = f"spare-{next(self._ids)}"
            try:
                _io.create_spare(tmp_fd, name)
            except OSError as exc:
                self._precreating = False
                logger.info("tier %r: no more files created ahead of stores: %s", self.tier, exc)
                return False
            spares.append((name, 0))
            self.precreated += 1
            return True

    def resume(self) -> None:
        """Create files ahead again (a new ``tmp/``: the failure that stopped it is past)."""
        self._precreating = self.precreate_files > 0

    def drop_all(self, tmp_fd: int | None) -> None:
        """Delete every spare (a full disk: their space is wanted for blocks; shutdown), or
        forget them (``tmp_fd`` ``None``: their directory is gone)."""
        spares = self._spares
        while True:
            try:
                name, _ = spares.popleft()  # an I/O thread may take one too: each once
            except IndexError:
                return
            if tmp_fd is not None:
                with contextlib.suppress(OSError):
                    _io.remove_block(tmp_fd, name)
