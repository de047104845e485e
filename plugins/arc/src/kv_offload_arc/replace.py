"""ARC's REPLACE, run ``n`` times at once: which resident blocks to evict, without changing any.

REPLACE takes T1's LRU while |T1| > p, else T2's. Repeated ``n`` times over idle blocks that
is the first ``ceil(|T1| - p)`` victims from T1 and the rest from T2, back to T1 when T2 runs
out. The policy commits what these functions choose; choosing never mutates, so a failed
eviction has nothing to undo.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import chain, islice
from math import ceil

from kv_offload import OffloadKey
from kv_offload.policies import BlockStatus

__all__ = ["split", "scan"]

_Victims = list[tuple[OffloadKey, BlockStatus]]


def split(n: int, len1: int, len2: int, p: float) -> tuple[int, int]:
    """How many of ``n`` victims REPLACE takes from T1 and from T2 when every block is idle."""
    from1 = min(n, max(0, ceil(len1 - p)))
    from2 = n - from1
    if from2 > len2:
        return n - len2, len2
    return from1, from2


def scan(
    n: int,
    from1: int,
    t1: Iterable[OffloadKey],
    resident: dict[OffloadKey, BlockStatus],
    t2: OrderedDict[OffloadKey, BlockStatus],
    protected: set[OffloadKey],
) -> tuple[_Victims, _Victims] | None:
    """REPLACE stepping over busy or protected blocks: up to ``from1`` idle blocks of T1 (oldest
    first), the rest from T2, then T1 again if T2 has too few; ``None`` if there are not ``n``.
    """
    idle1 = (
        (key, block) for key in t1 if (block := resident[key]).ref_cnt == 0 and key not in protected
    )
    picked1 = list(islice(idle1, from1))
    idle2 = (
        (key, block) for key, block in t2.items() if block.ref_cnt == 0 and key not in protected
    )
    picked2 = list(islice(idle2, n - len(picked1)))
    missing = n - len(picked1) - len(picked2)
    if missing:
        picked1 = list(chain(picked1, islice(idle1, missing)))
        if len(picked1) + len(picked2) < n:
            return None
    return picked1, picked2
