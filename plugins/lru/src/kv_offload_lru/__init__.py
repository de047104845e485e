"""Least-recently-used eviction for kv-offload (entry points ``kv_offload.policies: lru`` and
``prefix-lru``).

:class:`LRUCachePolicy` keeps its recency order in the core's lazy-deletion key queue
(:mod:`kv_offload.policies.key_queue`) instead of an ``OrderedDict``: a plain dict and a queue
of key references cost 75 to 130 bytes per block where an ``OrderedDict`` costs 120 to 195,
which is what keeps a CPU tier of millions of blocks cheap to track. :mod:`.reference` states
the same policy on one ``OrderedDict``; the tests check the two agree step by step.

:class:`PrefixLRUCachePolicy` (:mod:`.prefix`) decides exactly as vLLM 0.33's own ``lru``:
a request's blocks share a provisional rank while it runs (tail before head, when its context
carries key positions) and every block it asked for is refreshed at its end, head last.
"""

from __future__ import annotations

from .policy import LRUCachePolicy
from .prefix import PrefixLRUCachePolicy

__all__ = ["LRUCachePolicy", "PrefixLRUCachePolicy"]
