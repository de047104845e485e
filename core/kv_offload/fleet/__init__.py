"""Fleet replays: a trace through several engine processes sharing the stack's shared tiers
(``kv-offload replay ... --engines N --router NAME``). :mod:`.routers` picks each request's
engine, :mod:`.engine` is one engine's process, :mod:`.plan` says which tiers the engines
share, :mod:`.dispatch` keeps the clock and :mod:`.accounts` the report."""

from __future__ import annotations

from .dispatch import FleetError, run_fleet
from .engine import EngineSettings
from .plan import FleetPlan, finish_timeout, plan_fleet
from .routers import (
    ROUTER_ENTRY_POINT_GROUP,
    LeastLoaded,
    PrefixHash,
    RoundRobin,
    Router,
    build_router,
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
    "build_router",
    "finish_timeout",
    "plan_fleet",
    "router_registry",
    "run_fleet",
]
