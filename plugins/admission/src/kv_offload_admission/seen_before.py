"""``seen-before``: write a block to the tier only once it has been wanted before.

A block is admitted when the tier was offered it before, or a request looked it up before
(a lookup that reached it: the engine wanted those bytes). Most blocks of a conversation
trace are offered once and never read back, so this cuts writes several-fold; what it gives
up is every block's *first* reuse from this tier (the block was not written when it was
first offered). The memory is bounded: ``history_blocks`` keys (default: the tier's
capacity, or 65,536 when the tier declares none), least recently noted forgotten first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kv_offload import OffloadKey, ReqContext
from kv_offload.admission import AdmissionPolicy

from .history import KeyHistory
from .options import int_option

__all__ = ["SeenBefore"]

#: History size when neither the option nor the tier's capacity gives one.
DEFAULT_HISTORY_BLOCKS = 65_536


class SeenBefore(AdmissionPolicy):
    """Admits a block offered or looked up before (within ``history_blocks`` keys)."""

    def __init__(self, *, history_blocks: Any = None, capacity_blocks: int | None = None) -> None:
        super().__init__(capacity_blocks=capacity_blocks)
        size = history_blocks
        if size is None:
            size = capacity_blocks if capacity_blocks is not None else DEFAULT_HISTORY_BLOCKS
        self.history = KeyHistory(int_option("seen-before", "history_blocks", size, 1))

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        note = self.history.note
        return [note(key) for key in keys]

    def record_lookup(self, key: OffloadKey, req_context: ReqContext) -> None:
        self.history.note(key)

    def describe(self) -> str:
        return f"seen-before (history of {self.history.size} blocks)"
