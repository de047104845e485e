"""The CPU tier's KV buffer: one row of ``block_size_bytes`` per CPU slot.

The scheduler-side manager only hands out slot ids; the bytes live here. Workers write rows
(GPU -> CPU) and read them (CPU -> GPU); secondary tiers read rows to cascade them and write
rows to promote them, through :attr:`CPUKVBuffer.view`. An engine's scheduler and workers run
in different processes, so the buffer can live in POSIX shared memory (``shared=True``; attach
from another process with :meth:`CPUKVBuffer.attach`) or in a file (``path=``), which a worker
maps with the same constructor.
"""

from __future__ import annotations

import sys
import threading
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import ConfigError, InvalidArgumentError

__all__ = ["CPUKVBuffer"]

Slots = npt.ArrayLike

_attach_lock = threading.Lock()
# Closed shared buffers whose rows other arrays still view (see CPUKVBuffer.close).
_still_mapped: list[shared_memory.SharedMemory] = []


def _close_unviewed() -> None:
    """Unmap the closed shared buffers nobody views any more."""
    for shm in list(_still_mapped):
        try:
            shm.close()
        except BufferError:
            continue
        _still_mapped.remove(shm)


def _attach_shm(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without handing it to this process's resource tracker.

    The creator owns the segment and unlinks it. Before Python 3.13, attaching registers the
    segment with the attaching process's resource tracker too (bpo-39959), and when that
    process is not a multiprocessing child of the creator its tracker *unlinks the segment*
    at exit, under the creator's feet (whose ``close()`` then fails). Python 3.13 has
    ``track=False`` for this; older versions skip the registration.
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg,unused-ignore]
    with _attach_lock:
        register = resource_tracker.register
        resource_tracker.register = lambda name, rtype: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


class CPUKVBuffer:
    """``num_blocks x block_size_bytes`` bytes, numpy-backed, indexed by CPU slot id."""

    def __init__(
        self,
        num_blocks: int,
        block_size_bytes: int,
        *,
        shared: bool = False,
        shm_name: str | None = None,
        path: str | Path | None = None,
        create: bool = True,
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size_bytes", block_size_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"CPUKVBuffer: {name} must be a positive int, got {value!r}")
        if path is not None and (shared or shm_name is not None):
            raise ConfigError("CPUKVBuffer: choose either shared memory or a file path, not both")
        self.num_blocks = num_blocks
        self.block_size_bytes = block_size_bytes
        self.nbytes = num_blocks * block_size_bytes
        self._shm: shared_memory.SharedMemory | None = None
        self._owner = create
        self.path = Path(path) if path is not None else None
        array: npt.NDArray[np.uint8]
        if shared or shm_name is not None:
            if create:
                self._shm = shared_memory.SharedMemory(name=shm_name, create=True, size=self.nbytes)
            elif shm_name is None:
                raise ConfigError("CPUKVBuffer: attaching (create=False) needs the shm_name")
            else:
                self._shm = _attach_shm(shm_name)
            # frombuffer holds a buffer export, so the mapping cannot be unmapped while any
            # array derived from it (a tier's, a worker's) is alive; np.ndarray(buffer=...)
            # holds none, and close() then left such arrays pointing at unmapped memory.
            buf: memoryview = self._shm.buf  # type: ignore[assignment]  # None once closed
            array = np.frombuffer(buf, np.uint8, count=self.nbytes).reshape(
                num_blocks, block_size_bytes
            )
        elif self.path is not None:
            fresh = create and not self.path.exists()
            array = np.memmap(
                str(self.path), np.uint8, "w+" if fresh else "r+", 0, (num_blocks, block_size_bytes)
            )
        else:
            array = np.zeros((num_blocks, block_size_bytes), np.uint8)
        self._array = array

    @classmethod
    def attach(cls, shm_name: str, num_blocks: int, block_size_bytes: int) -> CPUKVBuffer:
        """Map a buffer another process created with ``shared=True`` (by its ``shm_name``)."""
        return cls(num_blocks, block_size_bytes, shm_name=shm_name, create=False)

    @property
    def shm_name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def array(self) -> npt.NDArray[np.uint8]:
        """The whole buffer as a ``(num_blocks, block_size_bytes)`` uint8 array (no copy)."""
        return self._array

    @property
    def view(self) -> memoryview:
        """A writable memoryview over the buffer, what secondary tiers read and write."""
        return self._array.data

    def _slots(self, block_ids: Slots) -> npt.NDArray[np.int64]:
        given = np.asarray(block_ids)
        if given.size and given.dtype.kind not in "iu":
            # int64 conversion would truncate 1.7 to slot 1 or fail with a bare ValueError.
            raise InvalidArgumentError(
                f"CPUKVBuffer: slot ids must be integers, got {given.dtype} values such as "
                f"{given.reshape(-1).tolist()[0]!r}"
            )
        ids = given.astype(np.int64, copy=False).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            bad = ids[(ids < 0) | (ids >= self.num_blocks)][0]
            raise InvalidArgumentError(
                f"CPUKVBuffer: slot id {int(bad)} is out of range [0, {self.num_blocks})"
            )
        return ids

    @staticmethod
    def _as_run(ids: npt.NDArray[np.int64]) -> slice | None:
        """``ids`` as one slice when they are consecutive (the common case after a fill)."""
        contiguous = ids.size and int(ids[-1]) - int(ids[0]) == ids.size - 1
        if contiguous and (ids.size < 3 or bool(np.all(np.diff(ids) == 1))):
            return slice(int(ids[0]), int(ids[-1]) + 1)
        return None

    def write_blocks(self, block_ids: Slots, data: Any) -> None:
        """Copy ``data`` (``len(block_ids)`` rows of bytes, any buffer) into the slots."""
        ids = self._slots(block_ids)
        src = (
            np.frombuffer(data, np.uint8)
            if isinstance(data, (bytes, bytearray, memoryview))
            else np.asarray(data)
        )
        if src.dtype != np.uint8:
            src = src.view(np.uint8)
        if src.size != ids.size * self.block_size_bytes:
            raise InvalidArgumentError(
                f"CPUKVBuffer.write_blocks: got {src.size} bytes for {ids.size} blocks of "
                f"{self.block_size_bytes} bytes"
            )
        src = src.reshape(ids.size, self.block_size_bytes)
        run = self._as_run(ids)
        if run is not None:
            np.copyto(self._array[run], src)
        else:
            self._array[ids] = src

    def read_blocks(
        self, block_ids: Slots, out: npt.NDArray[np.uint8] | None = None
    ) -> npt.NDArray[np.uint8]:
        """The slots' rows as a ``(len(block_ids), block_size_bytes)`` uint8 array (a copy)."""
        ids = self._slots(block_ids)
        shape = (ids.size, self.block_size_bytes)
        if out is None:
            out = np.empty(shape, np.uint8)
        elif out.shape != shape or out.dtype != np.uint8:
            raise InvalidArgumentError(
                f"CPUKVBuffer.read_blocks: out must be uint8 of shape {shape}, got "
                f"{out.dtype} {out.shape}"
            )
        run = self._as_run(ids)
        if run is not None:
            np.copyto(out, self._array[run])
        else:
            # The ids are checked above; mode="raise" would copy through a temporary.
            np.take(self._array, ids, axis=0, out=out, mode="clip")
        return out

    def close(self) -> None:
        """Release the mapping; the creator of a shared buffer also unlinks it.

        Arrays still viewing the rows (a tier's copy of :attr:`view`) stay valid: a shared
        mapping is then unmapped once they are gone, not under them.
        """
        array = self._array
        self._array = np.zeros((0, self.block_size_bytes), np.uint8)
        if isinstance(array, np.memmap):
            array.flush()
        del array
        if self._shm is not None:
            shm, self._shm = self._shm, None
            if self._owner:
                shm.unlink()
            try:
                shm.close()
            except BufferError:
                _still_mapped.append(shm)
        _close_unviewed()

    def __enter__(self) -> CPUKVBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
