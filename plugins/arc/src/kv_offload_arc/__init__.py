"""Adaptive Replacement Cache eviction for kv-offload (entry point ``kv_offload.policies: arc``).

ARC (Megiddo & Modha, FAST'03) splits the cache between blocks seen once recently (T1) and
blocks seen at least twice (T2), and remembers the keys it recently evicted from each (the
ghost lists B1 and B2). A miss on a ghost key means that side of the cache was too small, so
the target size ``p`` of T1 moves towards it. One-time keys only ever cycle through T1, which is
what keeps a long scan from flushing the frequently used blocks in T2.

Adapting ARC to the manager's contract changes when things happen, not what happens:

* the manager evicts *before* it inserts the keys that caused the misses, so ``evict`` applies
  ARC's REPLACE rule with the current ``p`` (:mod:`.replace`), and ``insert_many`` does the
  adaptation of ``p`` and the promotion of ghost keys to T2;
* REPLACE skips blocks that are pinned, pending or protected, taking the next block of the same
  list and falling back to the other list when the preferred one has none left;
* only insertions can push the ghost lists past their bounds (an eviction moves a key from T1
  to B1 or from T2 to B2, which changes neither bound), so the ghosts are trimmed there.

Modules: :mod:`.policy` (the policy and its layout), :mod:`.replace` (choosing victims),
:mod:`.ghosts` (B1 and B2), :mod:`.reference` (the same ARC on four ``OrderedDict``\\ s, the
oracle the tests hold the policy to).
"""

from __future__ import annotations

from .policy import ARCCachePolicy

__all__ = ["ARCCachePolicy"]
