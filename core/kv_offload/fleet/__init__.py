"""Fleet replays: a trace through several engine processes sharing the stack's shared tiers
(``kv-offload replay ... --engines N --router NAME``). :mod:`.routers` picks each request's
engine, :mod:`.engine` is one engine's process, :mod:`.dispatch` keeps the clock and the
accounts."""

from __future__ import annotations

from .dispatch import FleetError, FleetPlan, finish_timeout, plan_fleet, run_fleet
from .engine import EngineSettings
from .routers import (
    ROUTER_ENTRY_POINT_GROUP,
    LeastLoaded,
    PrefixHash,
    RoundRobin,
    Router,
    router_registry,
)

__all__ = [
    "ROUTER_ENTRY_POINT_GROUP",
    "EngineSettings",
    "FleetError",
    "FleetPlan",
    "LeastLoaded",
    "PrefixHash",
    "RoundRobin",
    "Router",
    "finish_timeout",
    "plan_fleet",
    "router_registry",
    "run_fleet",
]
