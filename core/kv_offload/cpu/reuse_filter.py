"""The reuse filter: store a block in the CPU tier only once it has been offered often enough.

Most prefixes of a conversation trace are seen once; writing each of them to the CPU tier
costs a GPU->CPU copy and evicts a block that might have been reused. With
``store_threshold = n`` (``n >= 2``) a block is stored only from its ``n``-th offer on (an
offer: the block's key in a ``prepare_store`` call, whether it is stored already or not), as
vLLM 0.33's ``CPUOffloadingManager`` does. Offers are counted per key in an LRU-ordered table
of at most ``max_tracker_size`` keys: the least recently offered key is forgotten first, but
never a key of the call being counted (a call larger than the table tracks what fits and
leaves the rest uncounted, so those keys are not stored by that call).

The counts describe how often the engine offered a prefix, not what the cache holds, so
``reset_cache`` keeps them (vLLM too). Values below 2 mean "off"; the manager then holds no
filter at all and its store path pays one ``is None`` check.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..errors import ConfigError
from ..keys import OffloadKey

__all__ = ["DEFAULT_MAX_TRACKER_SIZE", "ReuseFilter", "check_filter_args"]

#: vLLM's default size of the offer table (keys).
DEFAULT_MAX_TRACKER_SIZE = 64_000


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


def check_filter_args(store_threshold: Any, max_tracker_size: Any) -> tuple[int, int]:
    """Both arguments, checked (a :class:`~kv_offload.ConfigError` names the bad one)."""
    threshold = _int("store_threshold", store_threshold)
    if threshold < 0:
        raise ConfigError(
            f"store_threshold must be >= 0 (offers before a block is stored; 0 or 1: no "
            f"filter), got {threshold}"
        )
    size = _int("max_tracker_size", max_tracker_size)
    if size <= 0:
        raise ConfigError(
            f"max_tracker_size must be > 0 (keys whose offers are counted; default "
            f"{DEFAULT_MAX_TRACKER_SIZE}), got {size}"
        )
    return threshold, size


class ReuseFilter:
    """Counts offers per key (bounded LRU table) and passes the keys offered often enough."""

    __slots__ = ("counts", "max_size", "threshold")

    def __init__(self, threshold: int, max_size: int) -> None:
        self.threshold = threshold
        self.max_size = max_size
        #: key -> offers counted, least recently offered first.
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    def offer(self, keys: list[OffloadKey], candidates: list[OffloadKey]) -> list[OffloadKey]:
        """Count one offer of each of ``keys`` (unique), then return the ``candidates`` (the
        keys not stored yet, in order) whose count reached the threshold."""
        counts = self.counts
        current = 0  # keys of this call already tracked: moved to the end, so never dropped
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts[key] = count + 1
                counts.move_to_end(key)
                current += 1
        droppable = len(counts) - current
        room = self.max_size - len(counts)
        for key in keys:
            if key in counts:
                continue
            if room <= 0:
                if not droppable:
                    continue  # the table holds only this call's keys: leave this one out
                counts.popitem(last=False)
                droppable -= 1
            else:
                room -= 1
            counts[key] = 1
        threshold = self.threshold
        return [key for key in candidates if counts.get(key, 0) >= threshold]

    def count(self, key: OffloadKey) -> int:
        """How many offers of ``key`` are counted (0 if it is not tracked)."""
        return self.counts.get(key, 0)

    def __len__(self) -> int:
        return len(self.counts)
