"""Backpressure on cascades: detectors that watch a tier's store jobs, drop policies that
decide which cascades to shed while the tier is under pressure.

Both are plugins resolved by name like policies and tiers (runtime registration, then entry
points, then ``module_path``): detectors in ``kv_offload.backpressure_detectors``, drop
policies in ``kv_offload.drop_policies``. The built-ins below are entry points of the core
distribution, found the same way as third-party ones.

The built-in detector, ``ema``, tracks an exponential moving average of completed store jobs
in **seconds per MiB**, seeded with the mean of the first ``warmup`` jobs (no pressure before
that). The tier is under pressure once the average rises above ``high_water_s_per_mib`` and
until it falls below ``low_water_s_per_mib`` (hysteresis). While no job completes (because
every cascade is being dropped) the average halves every ``decay_half_life_s`` seconds, so a
tier that recovered gets cascades again. With ``failure_threshold = n`` (0: off), ``n``
consecutive failed jobs put the tier under pressure too.

The default water marks, by the tier's ``locality``, are :data:`DEFAULT_WATER_MARKS`: the one
place they are written (the plugin guide prints them in a table a test checks against it).

The other built-in detector, ``utilization``, asks whether the tier keeps up with the traffic
rather than how fast each job is: the share of the last ``window_s`` seconds during which at
least one cascade job was in flight (each job from its submission to when it finished, as
:class:`~kv_offload.tiering.jobs.JobTable` times it). A tier busy more than
``high_water_utilization`` of the time has no headroom left: it is under pressure until its
share falls below ``low_water_utilization``. Per-job seconds per MiB cannot say that: a disk
whose 4 KiB blocks each cost a file's open and rename moves few MiB per second per job yet
takes a trace's cascades with time to spare, and one job's latency says nothing about how
many jobs a tier runs at once.

The built-in drop policies: ``throttled`` drops a share of cascades growing with the
overshoot (0 at the high water mark, all of them at ``1 + ramp`` times it; the fractions
accumulate, so a drop rate of 0.25 drops exactly every fourth cascade), ``drop_all`` drops
every cascade while under pressure.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from ..errors import ConfigError
from ..plugins.registry import PluginRegistry
from ..tier_types import Locality

__all__ = [
    "BackpressureDetector",
    "DEFAULT_WATER_MARKS",
    "DETECTOR_ENTRY_POINT_GROUP",
    "DROP_POLICY_ENTRY_POINT_GROUP",
    "DropAll",
    "UtilizationDetector",
    "DropPolicy",
    "EMADetector",
    "ThrottledDrop",
    "detector_registry",
    "drop_policy_registry",
]

MIB = 1 << 20
DETECTOR_ENTRY_POINT_GROUP = "kv_offload.backpressure_detectors"
DROP_POLICY_ENTRY_POINT_GROUP = "kv_offload.drop_policies"

#: (high, low) water marks in seconds per MiB, by tier locality: the one place they live.
DEFAULT_WATER_MARKS: dict[Locality, tuple[float, float]] = {
    Locality.LOCAL: (0.010, 0.002),
    Locality.REMOTE: (0.050, 0.010),
}

Clock = Callable[[], float]


class BackpressureDetector(ABC):
    """Watches one tier's finished cascade jobs and says whether the tier is under pressure.

    Constructed as ``cls(locality=..., clock=..., **options)`` where ``options`` are the
    keys of the tier's ``backpressure`` table that the constructor accepts.
    """

    def __init__(self, *, locality: Locality = Locality.LOCAL, clock: Clock = time.monotonic):
        self.locality = locality
        self.clock = clock

    @abstractmethod
    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        """A cascade job of ``nbytes`` succeeded ``seconds`` after it was submitted."""

    def on_store_failed(self) -> None:  # noqa: B027
        """A cascade job failed (ignored unless the detector counts failures)."""

    @abstractmethod
    def under_pressure(self) -> bool:
        """Whether cascades to the tier should be shed now."""

    def overshoot(self) -> float:
        """How far past the pressure threshold the tier is, relative to it (0: at or below
        it). Drop policies that scale with severity read it."""
        return 1.0 if self.under_pressure() else 0.0

    @abstractmethod
    def reset(self) -> None:
        """Forget everything measured (``reset_cache``)."""

    def stats(self) -> dict[str, float]:
        """Figures for ``TierStats.backpressure`` (e.g. the smoothed latency)."""
        return {}


class EMADetector(BackpressureDetector):
    """Smoothed seconds per MiB of completed stores, with warm-up, hysteresis and idle decay
    (see the module docstring)."""

    def __init__(
        self,
        *,
        high_water_s_per_mib: float | None = None,
        low_water_s_per_mib: float | None = None,
        alpha: float = 0.15,
        warmup: int = 10,
        decay_half_life_s: float = 2.0,
        failure_threshold: int = 0,
        locality: Locality = Locality.LOCAL,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(locality=locality, clock=clock)
        high, low = DEFAULT_WATER_MARKS[locality]
        self.high = _number("high_water_s_per_mib", high_water_s_per_mib, high, positive=True)
        self.low = _number("low_water_s_per_mib", low_water_s_per_mib, low, positive=False)
        if self.low > self.high:
            raise ConfigError(
                f"backpressure: low_water_s_per_mib ({self.low}) must be <= "
                f"high_water_s_per_mib ({self.high})"
            )
        self.alpha = _number("alpha", alpha, 0.15, positive=True)
        if self.alpha > 1:
            raise ConfigError(f"backpressure: alpha must be in (0, 1], got {alpha!r}")
        self.warmup = _count("warmup", warmup)
        self.decay_half_life_s = _number("decay_half_life_s", decay_half_life_s, 2.0)
        self.failure_threshold = _count("failure_threshold", failure_threshold)
        self.reset()

    def reset(self) -> None:
        self.ema = 0.0
        self.completions = 0
        self.consecutive_failures = 0
        self._samples: list[float] = []
        self._pressure = False
        self._updated = self.clock()

    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        if nbytes <= 0:
            return
        sample = max(seconds, 0.0) / (nbytes / MIB)
        self.consecutive_failures = 0
        self.completions += 1
        self._updated = self.clock()
        if self.completions <= self.warmup:
            self._samples.append(sample)
            if self.completions == self.warmup:
                self.ema = sum(self._samples) / len(self._samples)
                self._update_pressure()
            return
        self.ema += self.alpha * (sample - self.ema)
        self._update_pressure()

    def on_store_failed(self) -> None:
        if not self.failure_threshold:
            return
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failure_threshold:
            # Pressure severe enough for any drop policy; idle decay lets a probe through.
            self.ema = max(self.ema, 4 * self.high)
            self._updated = self.clock()
            self._pressure = True

    def _update_pressure(self) -> None:
        if self.ema > self.high:
            self._pressure = True
        elif self.ema < self.low:
            self._pressure = False

    def under_pressure(self) -> bool:
        if self._pressure and self.decay_half_life_s > 0:
            now = self.clock()
            idle = now - self._updated
            if idle > 0:
                self.ema *= 0.5 ** (idle / self.decay_half_life_s)
                self._updated = now
                self._update_pressure()
        return self._pressure

    def overshoot(self) -> float:
        if not self.under_pressure():
            return 0.0
        return max(0.0, self.ema - self.high) / self.high

    def stats(self) -> dict[str, float]:
        return {"store_s_per_mib": self.ema, "under_pressure": float(self._pressure)}


class UtilizationDetector(BackpressureDetector):
    """The share of the last ``window_s`` seconds the tier had a cascade job in flight, with
    hysteresis (see the module docstring)."""

    def __init__(
        self,
        *,
        high_water_utilization: float = 0.9,
        low_water_utilization: float = 0.7,
        window_s: float = 2.0,
        locality: Locality = Locality.LOCAL,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(locality=locality, clock=clock)
        self.high = _number("high_water_utilization", high_water_utilization, 0.9, positive=True)
        self.low = _number("low_water_utilization", low_water_utilization, 0.7)
        if not self.low <= self.high <= 1:
            raise ConfigError(
                f"backpressure: need low_water_utilization ({self.low}) <= "
                f"high_water_utilization ({self.high}) <= 1"
            )
        self.window_s = _number("window_s", window_s, 2.0, positive=True)
        self.reset()

    def reset(self) -> None:
        #: Busy intervals (start, end) ending inside the window, merged, oldest first.
        self._busy: list[tuple[float, float]] = []
        self._pressure = False
        self._since = self.clock()

    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        end = self.clock()
        start = end - max(seconds, 0.0)
        busy = self._busy
        if busy and start <= busy[-1][1]:
            busy[-1] = (min(busy[-1][0], start), max(busy[-1][1], end))
        else:
            busy.append((start, end))
        self._update()

    def utilization(self) -> float:
        """Busy share of the last ``window_s`` seconds (of the time since the start or the
        last reset, while that is shorter)."""
        now = self.clock()
        begin = now - self.window_s
        busy = self._busy
        while busy and busy[0][1] <= begin:
            busy.pop(0)
        span = min(self.window_s, now - self._since)
        if span <= 0:
            return 0.0
        covered = sum(min(end, now) - max(start, begin) for start, end in busy)
        return min(1.0, max(0.0, covered / span))

    def _update(self) -> None:
        if self.clock() - self._since < self.window_s:
            return  # warm-up: one window before any verdict
        share = self.utilization()
        if share > self.high:
            self._pressure = True
        elif share < self.low:
            self._pressure = False

    def under_pressure(self) -> bool:
        if self._pressure:
            self._update()  # the window slides on while every cascade is dropped
        return self._pressure

    def overshoot(self) -> float:
        if not self.under_pressure():
            return 0.0
        headroom = max(1.0 - self.high, 1e-9)
        return max(0.0, self.utilization() - self.high) / headroom

    def stats(self) -> dict[str, float]:
        return {"utilization": self.utilization(), "under_pressure": float(self._pressure)}


class DropPolicy(ABC):
    """Decides, per cascade job, whether a tier the detector reports under pressure still
    gets it. Constructed as ``cls(**options)``."""

    @abstractmethod
    def should_store(self, detector: BackpressureDetector, num_blocks: int) -> bool:
        """``False`` drops the cascade job of ``num_blocks`` blocks (it is counted and
        reported by the tiered manager)."""

    def reset(self) -> None:  # noqa: B027
        """Forget any state (``reset_cache``)."""


class DropAll(DropPolicy):
    """Drop every cascade while the tier is under pressure."""

    def should_store(self, detector: BackpressureDetector, num_blocks: int) -> bool:
        return not detector.under_pressure()


class ThrottledDrop(DropPolicy):
    """Drop a share of cascades that grows with the detector's overshoot: ``overshoot /
    ramp`` (capped at 1); fractions accumulate so the share is exact over a run."""

    def __init__(self, *, ramp: float = 2.0) -> None:
        self.ramp = _number("ramp", ramp, 2.0, positive=True)
        self._owed = 0.0

    def should_store(self, detector: BackpressureDetector, num_blocks: int) -> bool:
        rate = min(1.0, detector.overshoot() / self.ramp)
        if rate <= 0.0:
            return True
        if rate >= 1.0:
            return False
        self._owed += rate
        if self._owed >= 1.0:
            self._owed -= 1.0
            return False
        return True

    def reset(self) -> None:
        self._owed = 0.0


def _number(key: str, value: object, default: float, *, positive: bool = False) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"backpressure: {key} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"backpressure: {key} must be {'> 0' if positive else '>= 0'}, "
                          f"got {value!r}")  # fmt: skip
    return float(value)


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"backpressure: {key} must be an integer >= 0, got {value!r}")
    return value


detector_registry: PluginRegistry[BackpressureDetector] = PluginRegistry(
    "backpressure detector",
    DETECTOR_ENTRY_POINT_GROUP,
    BackpressureDetector,  # type: ignore[type-abstract]  # only used for issubclass checks
    "the backpressure table's detector_module_path",
)
drop_policy_registry: PluginRegistry[DropPolicy] = PluginRegistry(
    "drop policy",
    DROP_POLICY_ENTRY_POINT_GROUP,
    DropPolicy,  # type: ignore[type-abstract]  # only used for issubclass checks
    "the backpressure table's drop_policy_module_path",
)
