"""The safety net: an exact LRU shadow of the whole cache, and the budget that bounds the
policy's loss against it.

The miniatures (:mod:`kv_offload_reuse.duel`) pick among the policy's own regimes from a
sample; nothing in them bounds what the policy loses against plain LRU, and on some traces it
lost (0.967x LRU on the bundled trace at 50,000 blocks). This module makes the bound a matter
of construction rather than of sampling luck:

* :class:`LRUShadow` replays every finished request through an exact LRU of the same capacity
  (keys only, no data), with the manager's access model: lookups in prefix order until the
  first miss, the hits touched (deepest first, so the prefix ends up most recent), the rest
  stored if absent, evicting the least recent keys outside the request.
* The policy counts its own hits and the shadow's. While it follows its own decisions, the
  deficit (shadow hits minus its hits) must stay under ``MARGIN`` x the blocks requested so
  far; the first request that takes it over switches the cache to *following LRU*: it evicts
  the blocks the shadow no longer holds first, then in the shadow's recency order. From then
  on the cache's contents converge to the shadow's (the blocks the shadow holds and the cache
  does not can only decrease; each request where the cache hits less than the shadow brings
  one of them back), after which the two hit the same blocks. The cache goes back to its own
  decisions once the budget has regrown by ``RESUME`` capacities' worth of blocks and the
  miniatures say its own regime is not plain recency.

The stated bound and why it holds are in this distribution's README ("The safety net").
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import compress, islice
from operator import not_

from kv_offload import OffloadKey

__all__ = ["MARGIN", "RESUME", "LRUShadow"]

_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend  # drains a map run for its side effects, at C speed

#: The policy's hits may trail the LRU shadow's by at most this share of the blocks requested.
MARGIN = 0.001
#: Budget (in capacities of blocks) the policy must have regained before it leaves LRU again.
RESUME = 1 / 256


class LRUShadow:
    """An exact LRU of ``capacity`` keys, driven one whole request at a time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Keys, least recent first.
        self.order: OrderedDict[OffloadKey, None] = OrderedDict()

    def clear(self) -> None:
        self.order.clear()

    def request(self, keys: list[OffloadKey]) -> tuple[int, list[OffloadKey]]:
        """Replay one request; returns its hits and the keys it evicted."""
        order = self.order
        present = list(map(order.__contains__, keys))
        hits = present.index(False) if False in present else len(keys)
        _consume(map(order.move_to_end, reversed(keys[:hits])))
        new = list(compress(keys, map(not_, present)))  # all after the first miss
        if not new:
            return hits, []
        need = len(order) + len(new) - self.capacity
        evicted: list[OffloadKey] = []
        if need > 0:
            evicted = list(islice(order, need))
            if not set(keys).isdisjoint(evicted):  # the request's own keys stay
                protected = set(keys)
                evicted = list(islice((key for key in order if key not in protected), need))
            if len(evicted) < need:  # the manager rejects such a store: nothing is stored
                return hits, []
            _consume(map(order.__delitem__, evicted))
        order.update(dict.fromkeys(new))
        return hits, evicted
