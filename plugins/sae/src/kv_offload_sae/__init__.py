"""Session-aware eviction for kv-offload (entry point ``kv_offload.policies: sae``).

A conversation's blocks are useful as a chain: a lookup hits a leading run of a request's
blocks, so a block whose predecessor is gone is worth nothing. :class:`SessionAwareCachePolicy`
(:mod:`.policy`) groups resident blocks into sessions inferred from prefix sharing (a trace
or an engine carries no session id), scores each session by its predicted next use (its last
use plus the gap it has shown between uses), and evicts the worst session first (ended ones,
then those expected back too late to survive anyway, then the least recently used), its tail
first, so that shared prefixes outlive the suffixes built on them. :mod:`.sessions` infers
the sessions; :mod:`.reference` states the same policy plainly, the oracle the tests hold the
shipped one to step by step.
"""

from __future__ import annotations

from .policy import SessionAwareCachePolicy

__all__ = ["SessionAwareCachePolicy"]
