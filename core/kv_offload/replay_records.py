"""What a timed replay records: its requests, the tier jobs it saw finish, its result, and
the probe (a hook plugin registered for the run) that sees promotions land and jobs finish.

Where a hit came from: a block the engine stored is a CPU hit; the first hit on a block a
promotion brought in counts for that tier (later hits on it would have been CPU hits without
the tier too). :class:`ReplayProbe` hears each promotion land (``blocks_loaded`` with the
tier's name as the medium) and every tier job finish (bytes and seconds, for the tier's
achieved throughput).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .keys import OffloadKey
from .plugins.hookspecs import hookimpl
from .types import ReqContext

__all__ = [
    "CPU",
    "ReplayProbe",
    "TierJob",
    "TimedReplayResult",
    "TimedRequest",
    "register_probe",
]

CPU = "CPU"


@dataclass(frozen=True)
class TimedRequest:
    """A request of a timed replay: its context, prefix keys and arrival (trace seconds)."""

    ctx: ReqContext
    keys: list[OffloadKey]
    arrival_s: float


@dataclass(frozen=True)
class TierJob:
    """One finished tier job as :class:`ReplayProbe` saw it (``done`` is ``time.monotonic``
    when the manager collected it, ``seconds`` the time since its submission)."""

    tier: str
    direction: str
    nbytes: int
    seconds: float
    done: float
    success: bool


class ReplayProbe:
    """A hook plugin the replay registers for its run: which tier each promoted block came
    from, and every finished tier job."""

    def __init__(self) -> None:
        self.origin: dict[OffloadKey, str] = {}
        self.jobs: list[TierJob] = []

    @hookimpl
    def kv_offload_blocks_loaded(self, keys: list[OffloadKey], medium: str) -> None:
        if medium != CPU:  # a promotion landed in the CPU tier
            origin = self.origin
            for key in keys:
                origin[key] = medium

    @hookimpl
    def kv_offload_tier_job_finished(
        self, tier: str, direction: str, success: bool, nbytes: int, seconds: float
    ) -> None:
        self.jobs.append(TierJob(tier, direction, nbytes, seconds, time.monotonic(), success))


@dataclass
class TimedReplayResult:
    """What a timed replay measured; wall-clock figures in seconds."""

    requests: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    #: Hits by where the block came from: ``"CPU"`` or a tier's name (first hit after its
    #: promotion landed).
    hits_by_origin: Counter[str] = field(default_factory=Counter)
    late_blocks: int = 0
    waited_requests: int = 0
    stored_blocks: int = 0
    rejected_stores: int = 0
    #: Per rejected store, the blocks it asked for (see ``ReplayResult``).
    rejected_store_sizes: list[int] = field(default_factory=list)
    verified_blocks: int = 0
    corrupted_blocks: int = 0
    steps: int = 0
    #: ``time.monotonic()`` (the replay's clock) at the start.
    started: float = 0.0
    seconds: float = 0.0
    trace_seconds: float = 0.0
    speed: float = 1.0
    #: Seconds from a block's first ``PENDING`` answer to the ``HIT`` its request used.
    promotion_latencies: list[float] = field(default_factory=list)
    #: Seconds between a request's arrival and the step that admitted it.
    admission_lags: list[float] = field(default_factory=list)

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def promoted_hit_blocks(self) -> int:
        return self.hit_blocks - self.hits_by_origin.get(CPU, 0)

    @property
    def blocks_per_second(self) -> float:
        return self.blocks / self.seconds if self.seconds else 0.0


def register_probe(manager: Any, probe: ReplayProbe) -> Callable[[], None]:
    """Register ``probe`` on ``manager``'s plugin manager; returns the undo."""
    pm = getattr(manager, "plugin_manager", None)
    if pm is None:
        return lambda: None
    pm.register(probe, name=f"kv-offload-replay-probe-{id(probe)}")
    return lambda: pm.unregister(probe)
