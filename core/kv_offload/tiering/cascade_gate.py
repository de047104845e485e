"""The per-tier gate every cascade job passes when backpressure is on for that tier.

A tier gets a gate from its ``backpressure`` table (``[tiers.backpressure]`` over the global
``[backpressure]``, key by key); without either the tier has no gate and cascades are never
dropped (the default, and the manager's fast path). Keys of the table:

=========================  ===========  =================================================
key                        default      meaning
=========================  ===========  =================================================
``enabled``                true         false: no gate for this tier (overrides the global)
``detector``               "ema"        backpressure detector plugin name
``drop_policy``            "throttled"  drop policy plugin name ("throttled", "drop_all")
``max_in_flight_jobs``     32           cascade jobs in flight to the tier at most; a
                                        cascade beyond it is dropped (0: unbounded)
``detector_module_path``,  unset        out-of-tree classes (like a policy's module_path)
``drop_policy_module_``
``path``
any other key                           an argument of the detector or the drop policy
                                        (whichever constructor takes it), e.g.
                                        ``high_water_s_per_mib``, ``warmup``, ``ramp``
=========================  ===========  =================================================

The detector's defaults depend on the tier's ``locality``; see
:mod:`kv_offload.tiering.backpressure` for them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, KVOffloadError
from ..tier_types import Locality
from .backpressure import BackpressureDetector, DropPolicy, detector_registry, drop_policy_registry

__all__ = [
    "CascadeGate",
    "DEFAULT_MAX_IN_FLIGHT_JOBS",
    "build_gate",
    "merged_table",
]

DEFAULT_MAX_IN_FLIGHT_JOBS = 32
_OWN_KEYS = (
    "enabled",
    "detector",
    "drop_policy",
    "max_in_flight_jobs",
    "detector_module_path",
    "drop_policy_module_path",
)

#: Why a cascade was dropped, as the stats and the ``kv_offload_cascade_dropped`` hook say it.
PRESSURE = "pressure"
IN_FLIGHT = "in_flight_limit"


class CascadeGate:
    """Admits or drops one tier's cascade jobs; measures the jobs it admitted."""

    def __init__(
        self, detector: BackpressureDetector, policy: DropPolicy, max_in_flight_jobs: int
    ) -> None:
        self.detector = detector
        self.policy = policy
        self.max_in_flight_jobs = max_in_flight_jobs
        self.in_flight = 0
        #: The most cascade jobs that were in flight at once.
        self.peak_in_flight = 0

    def admit(self, num_blocks: int) -> str | None:
        """``None`` to submit the cascade job (counted in flight), else why it is dropped."""
        if self.max_in_flight_jobs and self.in_flight >= self.max_in_flight_jobs:
            return IN_FLIGHT
        if not self.policy.should_store(self.detector, num_blocks):
            return PRESSURE
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return None

    def finished(self, success: bool, seconds: float, nbytes: int) -> None:
        """An admitted job reported."""
        self.in_flight -= 1
        if success:
            self.detector.on_store_completed(seconds, nbytes)
        else:
            self.detector.on_store_failed()

    def reset(self) -> None:
        self.detector.reset()
        self.policy.reset()
        self.peak_in_flight = self.in_flight


def merged_table(
    default: Mapping[str, Any] | None, own: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """A tier's ``backpressure`` table: the global ``default`` under the tier's ``own`` keys
    (the tier's win, key by key); ``None`` when neither is given. The one place the global
    table meets a tier's, for a config file and for tiers built in code alike."""
    if default is None:
        return None if own is None else dict(own)
    return {**default, **(own or {})}


def build_gate(
    table: Mapping[str, Any] | None, tier: str, locality: Locality
) -> CascadeGate | None:
    """The gate a ``backpressure`` table describes, or ``None`` (no table, ``enabled =
    false``). Errors name the tier and the key."""
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError(f"tier {tier!r}: backpressure must be a table, got {table!r}")
    try:
        return _build(table, locality)
    except KVOffloadError as exc:
        raise ConfigError(f"tier {tier!r}: {exc}") from exc


def _build(table: Mapping[str, Any], locality: Locality) -> CascadeGate | None:
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"backpressure: enabled must be true or false, got {enabled!r}")
    if not enabled:
        return None
    limit = table.get("max_in_flight_jobs", DEFAULT_MAX_IN_FLIGHT_JOBS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(
            f"backpressure: max_in_flight_jobs must be an integer >= 0, got {limit!r}"
        )
    detector_cls = detector_registry.resolve(
        _name(table, "detector", "ema"), table.get("detector_module_path")
    )
    policy_cls = drop_policy_registry.resolve(
        _name(table, "drop_policy", "throttled"), table.get("drop_policy_module_path")
    )
    detector_args: dict[str, Any] = {}
    policy_args: dict[str, Any] = {}
    detector_keys, policy_keys = _arguments(detector_cls), _arguments(policy_cls)
    for key, value in table.items():
        if key in _OWN_KEYS:
            continue
        if key in detector_keys:
            detector_args[key] = value
        elif key in policy_keys:
            policy_args[key] = value
        else:
            known = sorted({*_OWN_KEYS, *detector_keys, *policy_keys})
            raise ConfigError(f"backpressure: unknown key {key!r} (known: {', '.join(known)})")
    try:
        detector = detector_cls(locality=locality, **detector_args)
        policy = policy_cls(**policy_args)
    except KVOffloadError:
        raise
    except Exception as exc:
        raise ConfigError(f"backpressure: {type(exc).__name__}: {exc}") from exc
    return CascadeGate(detector, policy, limit)


def _name(table: Mapping[str, Any], key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"backpressure: {key} must be a plugin name, got {value!r}")
    return value


def _arguments(cls: type[BackpressureDetector] | type[DropPolicy]) -> set[str]:
    parameters = inspect.signature(cls).parameters
    return {
        name
        for name, p in parameters.items()
        if name not in ("self", "locality", "clock")
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
