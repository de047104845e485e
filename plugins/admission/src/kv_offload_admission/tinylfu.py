"""``tinylfu``: write a block only if it is wanted more often than what it would displace.

The admission keeps a shadow of the tier: the keys it admitted, in LRU order, as many as
the tier holds (``window_blocks``, default the tier's capacity). While the shadow has room
every offered block is admitted; once it is full, a new block is admitted only if its
estimated frequency (:mod:`.sketch`: offers and lookups, aged) beats the frequency of the
shadow's least recently used key, the block the tier would evict for it. Both offers and
lookups count as accesses; a lookup of a key in the shadow refreshes it.

The shadow models an LRU tier; against a tier evicting otherwise it is an estimate, which
costs only hit ratio, never a block: a refused block is one not written to this tier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kv_offload import OffloadKey, ReqContext
from kv_offload.admission import AdmissionPolicy
from kv_offload.errors import ConfigError

from .options import int_option, window
from .sketch import FrequencySketch

__all__ = ["TinyLFU"]


class TinyLFU(AdmissionPolicy):
    """Frequency admission against the tier's LRU victim (count-min sketch, aging,
    doorkeeper)."""

    def __init__(
        self,
        *,
        window_blocks: Any = None,
        sample_factor: Any = 10,
        depth: Any = 4,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(capacity_blocks=capacity_blocks)
        self.window = window("tinylfu", "window_blocks", window_blocks, capacity_blocks)
        factor = int_option("tinylfu", "sample_factor", sample_factor, 1)
        rows = int_option("tinylfu", "depth", depth, 1)
        if rows > 16:  # each row takes 4 bytes of one BLAKE2b digest (at most 64)
            raise ConfigError(
                f"tinylfu option depth must be <= 16 (hash rows), got {rows}",
                key="admission_options",
            )
        self.sketch = FrequencySketch(self.window, factor * self.window, rows)
        #: The keys admitted, least recently used first: what the tier is modelled to hold.
        self.shadow: OrderedDict[OffloadKey, None] = OrderedDict()

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        sketch, shadow = self.sketch, self.shadow
        answers = []
        for key in keys:
            sketch.increment(key)
            if key in shadow:
                shadow.move_to_end(key)
                answers.append(True)
                continue
            if len(shadow) >= self.window:
                victim = next(iter(shadow))
                if sketch.estimate(key) <= sketch.estimate(victim):
                    answers.append(False)
                    continue
                del shadow[victim]
            shadow[key] = None
            answers.append(True)
        return answers

    def record_lookup(self, key: OffloadKey, req_context: ReqContext) -> None:
        self.sketch.increment(key)
        if key in self.shadow:
            self.shadow.move_to_end(key)

    def describe(self) -> str:
        return f"tinylfu (window {self.window} blocks, sketch {self.sketch.width} wide)"
