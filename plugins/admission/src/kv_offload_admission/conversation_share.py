"""``conversation-share``: blocks wanted before, plus every block of a fixed share of
conversations. The research admission of this distribution (README: research log).

On conversation traces most reuse is a block's *first* reuse: the next turn of a
conversation reads the whole previous turn. An admission waiting for a second sighting
(``seen-before``, ``tinylfu``) gives up most of those hits, and no feature of a request we
measured (how much of its prefix was found, its length, a block's position) tells the turns
that will continue from those that will not. What does help is the tier's residency: a tier
written half as often keeps each block about twice as long, so the conversations it does
keep are kept through longer pauses. This admission therefore writes

* every block wanted before (offered or looked up, within ``history_blocks`` keys, as
  ``seen-before``), and
* every block of ``share_percent`` percent of conversations, chosen by a hash of the
  conversation's block at depth ``root_block`` (0-based; deep enough to be past the prompts
  all conversations share): a conversation's turns share that block, so a chosen
  conversation is written whole, turn after turn, and its prefix stays unbroken in the tier.

Under write-back the request that evicts a block is not the block's own, so the choice is
made by the evicting request's conversation: still a fixed, unbiased share of the blocks.
Decisions use BLAKE2b of key bytes, never ``hash()``: they do not depend on
``PYTHONHASHSEED``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from kv_offload import OffloadKey, ReqContext
from kv_offload.admission import AdmissionPolicy
from kv_offload.errors import ConfigError

from .history import KeyHistory
from .options import int_option
from .seen_before import DEFAULT_HISTORY_BLOCKS

__all__ = ["ConversationShare"]


class ConversationShare(AdmissionPolicy):
    """Admits blocks wanted before, and every block of ``share_percent`` percent of
    conversations (chosen by their block at depth ``root_block``)."""

    def __init__(
        self,
        *,
        share_percent: Any = 40,
        root_block: Any = 4,
        history_blocks: Any = None,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(capacity_blocks=capacity_blocks)
        self.share = int_option("conversation-share", "share_percent", share_percent, 0)
        if self.share > 100:
            raise ConfigError(
                f"conversation-share option share_percent must be <= 100, got {self.share}",
                key="admission_options",
            )
        self.root = int_option("conversation-share", "root_block", root_block, 0)
        size = history_blocks
        if size is None:
            size = capacity_blocks if capacity_blocks is not None else DEFAULT_HISTORY_BLOCKS
        self.history = KeyHistory(int_option("conversation-share", "history_blocks", size, 1))
        #: req_id -> the request's first ``root_block + 1`` keys seen (lookups, then offers).
        self._prefixes: dict[str, list[OffloadKey]] = {}

    def _note_prefix(self, req_id: str, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        prefix = self._prefixes.setdefault(req_id, [])
        for key in keys:
            if len(prefix) > self.root:
                break
            prefix.append(key)
        return prefix

    def chosen(self, prefix: Sequence[OffloadKey]) -> bool:
        """Whether the conversation whose first blocks are ``prefix`` is in the share."""
        if not prefix:
            return False
        root = bytes(prefix[min(self.root, len(prefix) - 1)])
        draw = int.from_bytes(hashlib.blake2b(root, digest_size=8).digest(), "little") % 100
        return draw < self.share

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        chosen = self.chosen(self._note_prefix(req_context.req_id, keys))
        note = self.history.note
        return [note(key) or chosen for key in keys]  # note() first: every key is noted

    def record_lookup(self, key: OffloadKey, req_context: ReqContext) -> None:
        self._note_prefix(req_context.req_id, (key,))
        self.history.note(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._prefixes.pop(req_context.req_id, None)

    def describe(self) -> str:
        return (
            f"conversation-share ({self.share}% of conversations by block {self.root}, "
            f"plus blocks wanted before; history of {self.history.size})"
        )
