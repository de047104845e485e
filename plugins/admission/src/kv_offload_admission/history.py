"""A bounded memory of keys: which blocks this tier has heard of recently.

Shared by the admissions that ask "was this block wanted before?". It forgets the least
recently noted key first, so its size, not the trace's length, bounds the memory (about
100 bytes a key)."""

from __future__ import annotations

from collections import OrderedDict

from kv_offload import OffloadKey

__all__ = ["KeyHistory"]


class KeyHistory:
    """The last ``size`` distinct keys noted, least recently noted first."""

    __slots__ = ("_keys", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[OffloadKey, None] = OrderedDict()

    def note(self, key: OffloadKey) -> bool:
        """Remember ``key`` as just noted; whether it was remembered already."""
        keys = self._keys
        if key in keys:
            keys.move_to_end(key)
            return True
        keys[key] = None
        if len(keys) > self.size:
            keys.popitem(last=False)
        return False

    def __contains__(self, key: OffloadKey) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)
