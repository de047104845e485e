"""ARC's ghost lists: keys recently evicted, without their blocks, oldest first."""

from __future__ import annotations

from collections.abc import Iterator

from kv_offload import OffloadKey
from kv_offload.policies import KeyQueue

__all__ = ["GhostList"]


class GhostList:
    """A set (membership) plus a key queue (trimming order).

    The set takes a batch of ghosts in or out with one C call (``update``,
    ``difference_update``) and lets ``insert_many`` tell "no ghost in this batch" with one
    ``isdisjoint``; the queue remembers which ghost is oldest at 8 bytes per key.
    """

    __slots__ = ("_queue", "keys")

    def __init__(self) -> None:
        self.keys: set[OffloadKey] = set()
        self._queue: KeyQueue[OffloadKey] = KeyQueue(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __iter__(self) -> Iterator[OffloadKey]:
        """Oldest first."""
        return iter(self._queue)

    def add_many(self, keys: list[OffloadKey]) -> None:
        """Remember evicted keys (none of them a ghost already), newest last."""
        self.keys.update(keys)
        self._queue.extend(keys)

    def discard_many(self, keys: list[OffloadKey]) -> None:
        """Forget ghosts that were hit (distinct keys, all in this list)."""
        self.keys.difference_update(keys)
        self._queue.forget_many(keys)

    def trim(self, count: int) -> None:
        """Forget the ``count`` oldest ghosts (at most as many as there are)."""
        count = min(count, len(self.keys))
        if count > 0:
            self.keys.difference_update(self._queue.pop_front(count))

    def clear(self) -> None:
        self.keys.clear()
        self._queue.clear()
