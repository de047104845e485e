"""Which stack each engine of a fleet runs, and which tiers the engines share.

A tier whose storage every engine reaches (a tier class with ``shared_across_engines =
True``, such as the Redis tier) is shared through its server; any other tier is private to
its engine, and one with a ``root_dir`` gets a directory per engine (``root_dir/engine-K``),
since two processes must not manage one directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import StackConfig
from ..tiering import SecondaryTierFactory

__all__ = ["FINISH_MARGIN_S", "FleetPlan", "finish_timeout", "plan_fleet"]

#: Past the last request: how long engines may take to finish, on top of their drain and
#: promotion timeouts, before they are stopped.
FINISH_MARGIN_S = 60.0


@dataclass(frozen=True)
class FleetPlan:
    """The engines' stacks and which tiers they share."""

    stacks: list[StackConfig]
    shared: list[str]
    private: list[str]

    def note(self) -> str | None:
        """What a user should know before reading the figures (``None``: nothing)."""
        if self.stacks and not self.shared:
            kinds = ", ".join(self.private) or "none"
            return (
                f"nothing is shared: every tier of this stack is private to its engine "
                f"(tiers: {kinds}); the fleet is {len(self.stacks)} isolated engines. Add a "
                f'shared tier (type = "redis" or "s3") to measure what sharing buys'
            )
        return None


def _tier_name(tier: Any) -> str:
    return str(tier.name or tier.type)


def plan_fleet(stack: StackConfig, engines: int) -> FleetPlan:
    """One stack per engine: shared tiers as they are, a private tier's ``root_dir`` moved
    to ``root_dir/engine-K``."""
    shared: list[str] = []
    private: list[str] = []
    for tier in stack.tiers:
        cls = SecondaryTierFactory.registry.resolve(tier.type, tier.module_path)
        (shared if getattr(cls, "shared_across_engines", False) else private).append(
            _tier_name(tier)
        )
    stacks = []
    for index in range(engines):
        tiers = []
        for tier in stack.tiers:
            root = tier.arguments.get("root_dir")
            if _tier_name(tier) in private and isinstance(root, str):
                arguments = {**tier.arguments, "root_dir": str(Path(root) / f"engine-{index}")}
                tier = replace(tier, arguments=arguments)
            tiers.append(tier)
        stacks.append(replace(stack, tiers=tuple(tiers)))
    return FleetPlan(stacks, shared, private)


def finish_timeout(stack: StackConfig) -> float:
    """How long engines may take after the last request: their drain and promotion bounds
    plus a margin (their waiting requests, their shutdown)."""
    bound = stack.drain_timeout_s + stack.promotion_timeout_s + FINISH_MARGIN_S
    return bound if math.isfinite(bound) else FINISH_MARGIN_S
