"""Admission policies for kv-offload tiers (entry-point group ``kv_offload.admission``).

* ``always`` (:class:`Always`): every offered block.
* ``seen-before`` (:class:`SeenBefore`): blocks offered or looked up before.
* ``tinylfu`` (:class:`TinyLFU`): blocks wanted more often than the tier's LRU victim.
* ``conversation-share`` (:class:`ConversationShare`): blocks wanted before, and every
  block of a fixed share of conversations.

Measured trade-offs (hit ratio against bytes written) and the research log: the README.
"""

from __future__ import annotations

from .always import Always
from .conversation_share import ConversationShare
from .seen_before import SeenBefore
from .sketch import FrequencySketch
from .tinylfu import TinyLFU

__all__ = ["Always", "ConversationShare", "FrequencySketch", "SeenBefore", "TinyLFU"]
