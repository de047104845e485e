"""The token-id prompts the real-engine tests send, phase by phase.

A phase is one ``generate`` call. Prompts are drawn from fixed seeds over the tiny model's
vocabulary; a prompt served in one phase comes back in a later one, alone or extended by a
new turn, so that its KV blocks (32 tokens each) can only come from the offload path the
engine under test runs (prefix caching is off). Every phase is also sent to the baseline
engine, without offload, which gives the token ids to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = 1000


def prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids from ``seed`` (ids 3.. leave bos/eos/pad out)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, length)]


@dataclass(frozen=True)
class Phase:
    name: str
    prompts: list[list[int]]


def _reuse(tag: int) -> tuple[Phase, Phase]:
    """Four prompts (200-330 tokens), then the same four and two of them a turn longer."""
    first = [prompt(tag + i, 200 + 43 * i) for i in range(4)]
    longer = [first[0] + prompt(tag + 10, 70), first[2] + prompt(tag + 11, 100)]
    return Phase(f"first-{tag}", first), Phase(f"again-{tag}", first + longer)


#: The policy, faulty-tier and hook tests: serve, then serve again.
FIRST, AGAIN = _reuse(100)
#: The fs tier: written by one engine, read back by the next.
FS_WRITE, FS_MORE = _reuse(200)
#: Served by the engine killed with SIGKILL: its first phase completes, then the kill.
KILLED_FIRST, KILLED_MORE = _reuse(300)
#: The Redis tier: one engine serves, a second one asks.
REDIS_SERVE, REDIS_MORE = _reuse(400)
REDIS_AUTH_SERVE, REDIS_AUTH_MORE = _reuse(500)


def single(phase: Phase, name: str, index: int = 0) -> Phase:
    """One prompt of ``phase``, alone: a new engine's first request."""
    return Phase(name, [phase.prompts[index]])


REDIS_FIRST = single(REDIS_SERVE, "redis-first")
REDIS_AUTH_FIRST = single(REDIS_AUTH_SERVE, "redis-auth-first")
FS_FIRST = single(FS_WRITE, "fs-first")

ALL_PHASES = [
    FIRST,
    AGAIN,
    FS_WRITE,
    FS_MORE,
    FS_FIRST,
    KILLED_FIRST,
    KILLED_MORE,
    REDIS_SERVE,
    REDIS_MORE,
    REDIS_FIRST,
    REDIS_AUTH_SERVE,
    REDIS_AUTH_MORE,
    REDIS_AUTH_FIRST,
]
