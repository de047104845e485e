"""vLLM 0.33's ARC variant as a kv-offload eviction policy (entry point
``kv_offload.policies: vllm-arc``).

kv-offload's ``arc`` (kv-offload-arc) is ARC as Megiddo & Modha state it, adapted to the
manager's contract: a hit moves a block to T2 when it is touched, a ghost key stored again
enters T2, ``p`` adapts when a ghost is stored. vLLM 0.33's ``arc`` decides differently, and a
deployment moving between kv-offload and vLLM should be able to keep vLLM's decisions, so this
distribution ships vLLM's variant under its own name rather than changing ``arc``:

* a request's accesses count once, when it ends, in head-to-tail order (by key position when
  the context has them): a block it reused moves to T2 (or to T2's newest end), a block it
  only inserted moves to the newest end of the list it is in, a store is never a second use;
* a stored key always enters T1, also when it was a ghost: a returning ghost does not skip
  T1 (the textbook puts it in T2);
* the target adapts when a store misses a ghost key (once per request and key), before
  anything is evicted for it; the ghost moves to its list's newest end and stays until the
  key is stored;
* eviction walks T1 while T1 (less the victims it gave) is at least ``int(target)``, else T2,
  else T1 after all; the ghost lists are cut to the capacity each, after the eviction;
* ``touch`` (not called by vLLM's scheduler) is an immediate use: ready T1 blocks go to T2.

``tests/vllm_bridge/test_vllm_parity.py`` drives it in kv-offload's manager next to vLLM's
``arc`` in vLLM's manager on seeded random request flows and compares every answer after every
step. The per-request record vLLM's manager keeps is rebuilt by
:class:`kv_offload.policies.request_access.RequestAccessLog`.
"""

from __future__ import annotations

from .policy import VLLMARCCachePolicy

__all__ = ["VLLMARCCachePolicy"]
