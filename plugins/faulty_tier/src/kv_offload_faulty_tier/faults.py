"""What to inject, validated once, and the seeded decisions drawn from it.

Kept apart from the tier so the decision sequence is easy to reason about: one
``random.Random(seed)`` draws every decision in call order, so a seed replays the same faults
for the same sequence of calls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from kv_offload.errors import ConfigError

__all__ = ["FaultCounters", "FaultPlan", "InjectedFault"]

MIB = 1 << 20


class InjectedFault(RuntimeError):
    """Raised from ``submit_*`` or ``lookup`` on purpose (``raise_rate``, ``lookup_raise_rate``)."""


def _rate(tier: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(
            f"tier {tier!r}: {name} must be a number from 0 to 1, got {value!r}", key=name
        )
    return float(value)


def _non_negative(tier: str, name: str, value: Any, kind: type = float) -> Any:
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed) or value < 0:
        what = "an int" if kind is int else "a number"
        raise ConfigError(f"tier {tier!r}: {name} must be {what} >= 0, got {value!r}", key=name)
    return kind(value)


@dataclass(frozen=True)
class FaultPlan:
    """The fault settings of one ``faulty`` tier (see the package docstring for config).

    ``fail_rate``: fraction of jobs reported ``success=False`` without reaching the inner
    tier (a failing promotion first scribbles over its CPU rows, as a torn transfer would).
    ``raise_rate`` / ``lookup_raise_rate``: fraction of ``submit_*`` / ``lookup`` calls that
    raise :class:`InjectedFault`. ``delay_polls``: each result is held for a random number
    of ``get_finished`` polls, ``min_delay_polls`` to ``delay_polls``. ``delay_s`` and
    ``seconds_per_mib``: a serial device; a job's result is released ``delay_s + MiB *
    seconds_per_mib`` seconds after the previous job's (or its own submission, whichever is
    later). ``defer_transfer``: a job reaches the inner tier only when its result is due, so
    its bytes move at the last moment an asynchronous tier may move them (see the tier).
    """

    fail_rate: float = 0.0
    raise_rate: float = 0.0
    lookup_raise_rate: float = 0.0
    delay_polls: int = 0
    min_delay_polls: int = 0
    delay_s: float = 0.0
    seconds_per_mib: float = 0.0
    seed: int = 0
    defer_transfer: bool = False

    @classmethod
    def from_arguments(cls, tier: str, **arguments: Any) -> FaultPlan:
        """Validate config values, naming the tier and the key on error."""
        seed = arguments.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"tier {tier!r}: seed must be an int, got {seed!r}", key="seed")
        defer = arguments.get("defer_transfer", False)
        if not isinstance(defer, bool):
            raise ConfigError(
                f"tier {tier!r}: defer_transfer must be true or false, got {defer!r}",
                key="defer_transfer",
            )
        polls = _non_negative(tier, "delay_polls", arguments.get("delay_polls", 0), int)
        min_polls = _non_negative(tier, "min_delay_polls", arguments.get("min_delay_polls", 0), int)
        if min_polls > polls:
            raise ConfigError(
                f"tier {tier!r}: min_delay_polls ({min_polls}) must not exceed delay_polls "
                f"({polls}); set delay_polls = {min_polls} for a fixed delay",
                key="min_delay_polls",
            )
        return cls(
            fail_rate=_rate(tier, "fail_rate", arguments.get("fail_rate", 0.0)),
            raise_rate=_rate(tier, "raise_rate", arguments.get("raise_rate", 0.0)),
            lookup_raise_rate=_rate(
                tier, "lookup_raise_rate", arguments.get("lookup_raise_rate", 0.0)
            ),
            delay_polls=polls,
            min_delay_polls=min_polls,
            delay_s=_non_negative(tier, "delay_s", arguments.get("delay_s", 0.0)),
            seconds_per_mib=_non_negative(
                tier, "seconds_per_mib", arguments.get("seconds_per_mib", 0.0)
            ),
            seed=seed,
            defer_transfer=defer,
        )

    def transfer_seconds(self, nbytes: int) -> float:
        return self.delay_s + nbytes / MIB * self.seconds_per_mib


@dataclass
class FaultCounters:
    """What was injected and what came of the jobs, for tests and soak reports.

    ``submitted`` jobs were accepted (not ``raised``); each is ``released`` exactly once, as
    ``failed`` (injected or by the inner tier) or as ``stored_blocks`` / ``loaded_blocks``.
    ``torn_loads``: failed promotions (injected or failed by the inner tier), each of which
    scribbled over its CPU rows. ``shutdowns``:
    ``shutdown`` calls (a manager should make exactly one).
    """

    submitted: int = 0
    raised: int = 0
    lookup_raised: int = 0
    failed: int = 0
    delayed: int = 0
    torn_loads: int = 0
    released: int = 0
    stored_blocks: int = 0
    loaded_blocks: int = 0
    shutdowns: int = 0


@dataclass
class Dice:
    """The seeded decisions, drawn in call order."""

    plan: FaultPlan
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.plan.seed)

    def raises(self) -> bool:
        return self.plan.raise_rate > 0 and self.rng.random() < self.plan.raise_rate

    def lookup_raises(self) -> bool:
        rate = self.plan.lookup_raise_rate
        return rate > 0 and self.rng.random() < rate

    def fails(self) -> bool:
        return self.plan.fail_rate > 0 and self.rng.random() < self.plan.fail_rate

    def polls(self) -> int:
        plan = self.plan
        if not plan.delay_polls:
            return 0
        return self.rng.randint(plan.min_delay_polls, plan.delay_polls)
