"""Reuse-aware eviction for kv-offload (entry point ``kv_offload.policies: reuse``).

ARC (Megiddo & Modha, FAST'03) with a long, compact memory of evicted blocks. On KV prefix
traces the reuse that LRU and ARC miss is the *first* reuse of a block, which comes back
several cache lifetimes after it was stored: by then ARC's ghost lists (bounded at one cache
of keys) have forgotten it, so it re-enters as a first sighting and is evicted again before
its next turn. This policy remembers every eviction of the last :data:`WINDOW` x capacity
stored blocks, and a block that comes back within that window is a reuse: it enters ARC's
frequency side (T2) directly, with every key before it in its batch (prefix hashes chain, so
a key vouches for its prefix). ``p`` adapts as in ARC, from remembered evictions still within
ARC's ghost bounds; and miniature copies of the policy (:mod:`kv_offload_reuse.duel`) decide
whether REPLACE uses that ``p`` or ``p = 0``, and whether the long memory or only ARC's own
ghosts decide T2; an exact LRU shadow (:mod:`kv_offload_reuse.safety`) bounds the loss
against LRU.

The memory is a hash table of 16-bit words, :data:`SLOTS_PER_BLOCK` per cache block (64 bytes
per block): each word holds an 8-bit fingerprint of the key, the 6-bit epoch of its eviction
(an epoch is capacity/8 stored blocks, so 64 epochs are the window) and which list it left.
A collision overwrites the older record, which then reads as "never seen" (a missed reuse, as
in plain ARC); a false match needs the same slot and fingerprint (under 1 in 256 of those).
Every 8 epochs the 8 oldest are wiped in one numpy pass, so nothing outlives the window and
memory never grows. Ghost-list sizes for ``p``'s step are counted per epoch: evictions, less
the ghosts that came back (a record lost to a collision stays counted until its epoch ends).

Modules: :mod:`.policy` (the policy; its speed tricks are guarded by
``benchmarks/reuse_policy.py``), :mod:`.memory` (the eviction memory), :mod:`.duel` (the
miniatures), :mod:`.reference` (the same
algorithm on plain lists and a dict, the oracle the tests hold the policy to step by step).
The research behind the design, with every variant measured, is in this distribution's
README.
"""

from __future__ import annotations

from .memory import SLOTS_PER_BLOCK, WINDOW, slot_of
from .policy import MODES, ReuseCachePolicy

__all__ = ["ReuseCachePolicy", "WINDOW", "SLOTS_PER_BLOCK", "MODES", "slot_of"]
