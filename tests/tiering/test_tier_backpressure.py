"""Backpressure on cascades: the EMA detector, the drop policies, the per-tier gate in the
tiered manager, its config, and a tier 10x slower than the cascade rate.

The manager scenarios are vLLM 0.33's ``tests/v1/kv_offload/tiering/test_backpressure.py``
ported to our API (a tier that holds its results until released; the detector's clock is
injected instead of back-dating submit times), plus our own edge cases.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    LookupResult,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TierFilter,
    TieringOffloadingManager,
    build_manager,
    make_offload_key,
)
from kv_offload.tier_types import Locality
from kv_offload.tiering import JobMetadata, JobResult, OffloadingConfig, TierEntry
from kv_offload.tiering.backpressure import (
    DEFAULT_WATER_MARKS,
    MIB,
    BackpressureDetector,
    DropAll,
    EMADetector,
    ThrottledDrop,
    UtilizationDetector,
    detector_registry,
    drop_policy_registry,
)
from kv_offload.tiering.cascade_gate import CascadeGate, build_gate
from kv_offload_example_tier import ExampleSecondaryTierManager

ROOT = Path(__file__).resolve().parents[2]
CTX = ReqContext("r")
BLOCK = 64


def k(i: int) -> bytes:
    return make_offload_key(i)


class Clock:
    """A hand-driven ``time.monotonic``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ema(clock: Clock | None = None, **options: Any) -> EMADetector:
    options.setdefault("warmup", 0)
    return EMADetector(clock=clock or Clock(), **options)


# -- the EMA detector --------------------------------------------------------------------


def test_warmup_seeds_the_average_with_the_mean_and_never_signals() -> None:
    detector = ema(warmup=4, high_water_s_per_mib=0.01, low_water_s_per_mib=0.002)
    for seconds in (1.0, 1.0, 1.0):  # far above the high water mark
        detector.on_store_completed(seconds, MIB)
        assert not detector.under_pressure()
        assert detector.ema == 0.0
    detector.on_store_completed(0.2, MIB)
    assert detector.ema == pytest.approx(0.8)  # the mean of the four samples
    assert detector.under_pressure()


def test_average_is_seconds_per_mib_whatever_the_job_size() -> None:
    small, large = ema(alpha=1.0), ema(alpha=1.0)
    small.on_store_completed(0.001, MIB // 4)
    large.on_store_completed(0.016, 4 * MIB)
    assert small.ema == pytest.approx(0.004) == large.ema
    small.on_store_completed(5.0, 0)  # an empty job says nothing
    assert small.ema == pytest.approx(0.004)


def test_pressure_above_high_water_and_hysteresis() -> None:
    high, low = 0.010, 0.002
    detector = ema(alpha=1.0, high_water_s_per_mib=high, low_water_s_per_mib=low)
    mid = (high + low) / 2
    detector.on_store_completed(mid, MIB)
    assert not detector.under_pressure()  # between the marks: stays off
    detector.on_store_completed(5 * high, MIB)
    assert detector.under_pressure()
    assert detector.overshoot() == pytest.approx(4.0)
    detector.on_store_completed(mid, MIB)
    assert detector.under_pressure()  # between the marks: stays on
    assert detector.overshoot() == 0.0  # but nothing to throttle
    detector.on_store_completed(low / 2, MIB)
    assert not detector.under_pressure()


def test_idle_decay_releases_a_tier_nobody_writes_to() -> None:
    clock = Clock()
    detector = ema(clock, alpha=1.0, high_water_s_per_mib=0.01, low_water_s_per_mib=0.002)
    detector.on_store_completed(0.04, MIB)
    assert detector.under_pressure()
    clock.now += 2.0  # one half-life: 0.02, still above the low mark
    assert detector.under_pressure()
    assert detector.ema == pytest.approx(0.02)
    clock.now += 2 * 2.0  # two more: 0.005 < 0.01 but > low
    assert detector.under_pressure()
    clock.now += 2.0  # 0.0025
    clock.now += 1.0  # 0.0018
    assert not detector.under_pressure()  # below 0.002


def test_failures_put_a_tier_under_pressure_only_when_counted() -> None:
    quiet = ema()
    for _ in range(10):
        quiet.on_store_failed()
    assert not quiet.under_pressure()
    counted = ema(failure_threshold=3)
    counted.on_store_failed()
    counted.on_store_failed()
    assert not counted.under_pressure()
    counted.on_store_failed()
    assert counted.under_pressure()
    assert counted.overshoot() >= 2.0  # enough for the throttled policy to drop everything


def test_reset_forgets_everything() -> None:
    detector = ema(alpha=1.0)
    detector.on_store_completed(1.0, MIB)
    assert detector.under_pressure()
    detector.reset()
    assert not detector.under_pressure() and detector.ema == 0.0 and detector.completions == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alpha": 0}, "alpha must be > 0"),
        ({"alpha": 1.5}, r"alpha must be in \(0, 1\]"),
        ({"alpha": "fast"}, "alpha must be a number"),
        ({"high_water_s_per_mib": 0}, "high_water_s_per_mib must be > 0"),
        ({"high_water_s_per_mib": True}, "high_water_s_per_mib must be a number"),
        ({"low_water_s_per_mib": -1}, "low_water_s_per_mib must be >= 0"),
        ({"high_water_s_per_mib": 0.01, "low_water_s_per_mib": 0.02}, "must be <="),
        ({"warmup": -1}, "warmup must be an integer >= 0"),
        ({"warmup": 2.5}, "warmup must be an integer"),
        ({"failure_threshold": -2}, "failure_threshold must be an integer"),
    ],
)
def test_bad_detector_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EMADetector(**options)


def test_default_water_marks_depend_on_locality_and_are_documented_once() -> None:
    for locality, (high, low) in DEFAULT_WATER_MARKS.items():
        detector = EMADetector(locality=locality)
        assert (detector.high, detector.low) == (high, low)
    assert DEFAULT_WATER_MARKS[Locality.REMOTE][0] > DEFAULT_WATER_MARKS[Locality.LOCAL][0]
    # The plugin guide's table prints the constants (vLLM's docstring and constants
    # disagree; ours must not), and no other document restates them.
    guide = (ROOT / "docs/plugin-guide.md").read_text()
    for locality, (high, low) in DEFAULT_WATER_MARKS.items():
        row = rf"\| {locality.value.lower()} +\| {high:.3f} +\| {low:.3f} +\|"
        assert re.search(row, guide), f"the guide lacks the {locality} water marks {high}/{low}"
    from kv_offload.tiering import backpressure

    for where, text in (("README", (ROOT / "README.md").read_text()),
                        ("docstring", backpressure.__doc__ or "")):  # fmt: skip
        for high, low in DEFAULT_WATER_MARKS.values():
            assert f"{high:.3f}" not in text and f"{low:.3f}" not in text, where


# -- drop policies -----------------------------------------------------------------------


class Fixed(BackpressureDetector):
    def __init__(self, overshoot: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = overshoot

    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        pass

    def under_pressure(self) -> bool:
        return self.value > 0

    def overshoot(self) -> float:
        return self.value

    def reset(self) -> None:
        self.value = 0.0


@pytest.mark.parametrize(("overshoot", "stored_of_8"), [(0.0, 8), (0.5, 6), (1.0, 4), (2.0, 0)])
def test_throttled_drop_share_follows_the_overshoot(overshoot: float, stored_of_8: int) -> None:
    policy = ThrottledDrop(ramp=2.0)
    detector = Fixed(overshoot)
    assert sum(policy.should_store(detector, 1) for _ in range(8)) == stored_of_8


def test_drop_all_drops_everything_under_pressure_only() -> None:
    policy = DropAll()
    assert all(policy.should_store(Fixed(0.0), 1) for _ in range(5))
    assert not any(policy.should_store(Fixed(0.01), 1) for _ in range(5))


def test_built_ins_are_entry_points_of_the_core_distribution() -> None:
    detectors = {i.name: i for i in detector_registry.available()}
    policies = {i.name: i for i in drop_policy_registry.available()}
    assert detectors["ema"].distribution == "kv-offload"
    assert {"throttled", "drop_all"} <= set(policies)
    assert policies["drop_all"].distribution == "kv-offload"
    assert detector_registry.resolve("ema") is EMADetector
    assert drop_policy_registry.resolve("throttled") is ThrottledDrop


# -- the gate ----------------------------------------------------------------------------


def test_gate_bounds_jobs_in_flight() -> None:
    gate = CascadeGate(Fixed(0.0), DropAll(), max_in_flight_jobs=2)
    assert gate.admit(1) is None and gate.admit(1) is None
    assert gate.admit(1) == "in_flight_limit"
    gate.finished(True, 0.001, BLOCK)
    assert gate.admit(1) is None
    assert gate.peak_in_flight == 2


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"detector": "nope"}, "unknown backpressure detector 'nope'; available: 'ema'"),
        ({"drop_policy": "later"}, "unknown drop policy 'later'"),
        ({"detector": 3}, "detector must be a plugin name"),
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"max_in_flight_jobs": -1}, "max_in_flight_jobs must be an integer >= 0"),
        ({"high_water": 0.1}, "unknown key 'high_water'"),
        ({"ramp": 0}, "ramp must be > 0"),
    ],
)
def test_bad_tables_name_the_tier_and_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="tier 'slow'") as info:
        build_gate(table, "slow", Locality.LOCAL)
    assert re.search(message, str(info.value)), str(info.value)


def test_table_routes_keys_to_the_detector_and_the_policy() -> None:
    gate = build_gate({"warmup": 3, "ramp": 4.0, "max_in_flight_jobs": 5}, "t", Locality.REMOTE)
    assert gate is not None
    assert isinstance(gate.detector, EMADetector) and gate.detector.warmup == 3
    assert gate.detector.high == DEFAULT_WATER_MARKS[Locality.REMOTE][0]
    assert isinstance(gate.policy, ThrottledDrop) and gate.policy.ramp == 4.0
    assert gate.max_in_flight_jobs == 5
    assert build_gate({"enabled": False, "warmup": 3}, "t", Locality.LOCAL) is None
    assert build_gate(None, "t", Locality.LOCAL) is None


class ConstantDetector(BackpressureDetector):
    """A third-party detector, registered at run time by name."""

    def __init__(self, *, pressured: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pressured = pressured

    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        pass

    def under_pressure(self) -> bool:
        return self.pressured

    def reset(self) -> None:
        pass


def test_runtime_registered_detector_resolves_like_a_built_in() -> None:
    detector_registry.register("constant", __name__, "ConstantDetector")
    try:
        gate = build_gate(
            {"detector": "constant", "pressured": True, "drop_policy": "drop_all"},
            "t",
            Locality.LOCAL,
        )
        assert gate is not None and isinstance(gate.detector, ConstantDetector)
        assert gate.admit(1) == "pressure"
    finally:
        detector_registry.unregister("constant")


# -- the tiered manager ------------------------------------------------------------------


class HeldTier(ExampleSecondaryTierManager):
    """The example tier, holding cascade results until :meth:`release` (vLLM's
    ``DelayedSecondaryTierManager``); ``whole`` asks for every request whole."""

    whole = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[JobResult] = []

    def submit_store(self, job: JobMetadata) -> None:
        super().submit_store(job)
        self.held += [r for r in self._finished if r.job_id == job.job_id]
        self._finished = [r for r in self._finished if r.job_id != job.job_id]

    def release(self) -> None:
        self._finished += self.held
        self.held = []

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        return RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL) if self.whole else None


def stack(
    gate: CascadeGate | None, num_blocks: int = 20
) -> tuple[TieringOffloadingManager, HeldTier]:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = HeldTier(OffloadingConfig(num_blocks, BLOCK), primary.kv_buffer.view, "held")
    entry = TierEntry(tier, cascade_gate=gate)
    return TieringOffloadingManager(primary, [entry], drain_timeout=2.0), tier


def store(m: TieringOffloadingManager, *nums: int, ctx: ReqContext = CTX) -> None:
    out = m.prepare_store([k(i) for i in nums], ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)


def ema_gate(clock: Clock, **options: Any) -> CascadeGate:
    detector = EMADetector(clock=clock, **{"warmup": 2, **options})
    return CascadeGate(detector, DropAll(), 0)


def pressured(**options: Any) -> tuple[TieringOffloadingManager, HeldTier, CascadeGate, Clock]:
    """A stack whose tier went under pressure: one store (block 0) held 2 ms, far above the
    1 us per MiB high-water mark (alpha 1: the last store is the average). A job counts from
    its submission to the last poll that found it unfinished (one engine step less than to
    the poll that collects it: the step is the engine's cadence, not the tier's time)."""
    clock = Clock()
    gate = ema_gate(clock, warmup=0, alpha=1.0, high_water_s_per_mib=1e-6,
                    low_water_s_per_mib=1e-7, **options)  # fmt: skip
    m, tier = stack(gate)
    m.on_new_request(CTX)
    store(m, 0)
    time.sleep(0.002)  # a slow store: way above 1 us per MiB
    m.on_schedule_end()  # still held 2 ms after its submission
    tier.release()
    m.on_schedule_end()
    return m, tier, gate, clock


def test_ema_updates_when_a_store_job_completes() -> None:
    clock = Clock()
    m, tier = stack(ema_gate(clock, warmup=0, alpha=0.5))
    m.on_new_request(CTX)
    store(m, 0, 1)
    m.on_schedule_end()
    assert m.tier_stats()[0].backpressure["store_s_per_mib"] == 0.0  # held: nothing yet
    assert m.tier_stats()[0].cascades_in_flight == 1
    time.sleep(0.01)
    tier.release()
    m.on_schedule_end()
    stats = m.tier_stats()[0]
    assert stats.backpressure["store_s_per_mib"] > 0.0
    assert stats.cascades_in_flight == 0 and stats.peak_cascades_in_flight == 1


def test_pressure_sheds_cascades_counts_them_and_keeps_the_blocks_in_cpu() -> None:
    m, tier, gate, _ = pressured(decay_half_life_s=0)
    assert gate.detector.under_pressure()
    store(m, 1, 2, 3)
    store(m, 4)
    stats = m.tier_stats()[0]
    assert (stats.dropped_cascades, stats.dropped_blocks) == (2, 4)
    assert stats.cascaded_blocks == 1 and stats.cascades_in_flight == 0
    assert all(m.lookup(k(i), CTX) is LookupResult.HIT for i in range(5))
    assert len(tier) == 1  # only block 0 reached the tier
    assert m.primary.ref_count(k(1)) == 0  # a dropped cascade pins nothing


def test_stores_resume_after_pressure_clears() -> None:
    m, tier, _, clock = pressured()
    store(m, 1)
    assert m.tier_stats()[0].dropped_cascades == 1
    clock.now += 600.0  # idle decay: the average is back under the low mark
    store(m, 2)
    tier.release()
    m.on_schedule_end()
    assert tier.lookup(k(2), CTX) is True and tier.lookup(k(1), CTX) is False


def test_in_flight_bound_drops_with_its_own_reason() -> None:
    m, tier = stack(CascadeGate(Fixed(0.0), DropAll(), max_in_flight_jobs=2))
    m.on_new_request(CTX)
    for i in range(5):
        store(m, i)
    stats = m.tier_stats()[0]
    assert stats.cascades_in_flight == 2 == stats.peak_cascades_in_flight
    assert stats.dropped_cascades == 3
    tier.release()
    m.on_schedule_end()
    store(m, 9)
    assert m.tier_stats()[0].cascades_in_flight == 1
    tier.release()
    m.drain()


def test_request_level_cascades_respect_backpressure() -> None:
    m, tier = stack(CascadeGate(Fixed(0.0), DropAll(), 0))
    m.on_new_request(CTX)
    store(m, 0, 1, 2)
    tier.release()
    m.on_schedule_end()
    tier.whole = True
    ctx = ReqContext("whole")
    assert m.on_new_request(ctx).policy is OffloadPolicy.REQUEST_LEVEL
    assert m.entries[0].cascade_gate is not None
    m.entries[0].cascade_gate.detector.value = 1.0  # type: ignore[attr-defined]
    before = len(tier)
    out = m.prepare_store([k(0), k(1), k(10)], ctx)
    assert out is not None
    assert len(tier) == before  # the present blocks would go to the tier, but it is pressured
    assert m.tier_stats()[0].dropped_blocks == 2


def test_loads_continue_under_pressure() -> None:
    detector = Fixed(0.0)
    m, tier = stack(CascadeGate(detector, DropAll(), 0))
    m.on_new_request(CTX)
    store(m, 7)
    tier.release()
    m.on_schedule_end()
    m.reset_cache()  # block 7 is only in the tier now
    detector.value = 3.0
    store(m, 8)
    assert m.tier_stats()[0].dropped_cascades == 1
    assert m.lookup(k(7), CTX) is LookupResult.PENDING  # promotion from a pressured tier
    m.on_schedule_end()
    assert m.lookup(k(7), CTX) is LookupResult.HIT


def test_reset_cache_clears_backpressure() -> None:
    m, _, gate, _ = pressured(decay_half_life_s=0)
    store(m, 1)
    assert gate.detector.under_pressure() and m.tier_stats()[0].dropped_cascades == 1
    m.reset_cache()
    assert not gate.detector.under_pressure() and gate.detector.ema == 0.0
    assert m.tier_stats()[0].dropped_cascades == 0


def test_no_backpressure_by_default() -> None:
    m, _ = stack(None)
    assert [entry.cascade_gate for entry in m.entries] == [None]


# -- config ------------------------------------------------------------------------------


def config(**extra: Any) -> dict[str, Any]:
    tiers = extra.pop("tiers", [{"type": "example", "name": "a"}, {"type": "example", "name": "b"}])
    return {"num_blocks": 16, "block_size_bytes": BLOCK, "tiers": tiers, **extra}


def test_global_table_applies_to_every_tier_and_tiers_override_key_by_key() -> None:
    m = build_manager(
        config(
            backpressure={"max_in_flight_jobs": 7, "warmup": 3},
            tiers=[
                {"type": "example", "name": "a"},
                {
                    "type": "example",
                    "name": "b",
                    "locality": "remote",
                    "backpressure": {"warmup": 5, "drop_policy": "drop_all"},
                },
                {"type": "example", "name": "c", "backpressure": {"enabled": False}},
            ],
        )
    )
    assert isinstance(m, TieringOffloadingManager)
    a, b, c = (entry.cascade_gate for entry in m.entries)
    assert a is not None and b is not None and c is None
    assert (a.max_in_flight_jobs, b.max_in_flight_jobs) == (7, 7)
    assert isinstance(a.detector, EMADetector) and isinstance(b.detector, EMADetector)
    assert (a.detector.warmup, b.detector.warmup) == (3, 5)
    assert isinstance(a.policy, ThrottledDrop) and isinstance(b.policy, DropAll)
    assert m.entries[1].locality is Locality.REMOTE
    assert b.detector.high == DEFAULT_WATER_MARKS[Locality.REMOTE][0]
    assert a.detector.high == DEFAULT_WATER_MARKS[Locality.LOCAL][0]
    m.shutdown()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (config(backpressure=3), r"backpressure: must be a table"),
        (config(backpressure={"detector": "nope"}), r"tiers\[0\]\..*unknown backpressure detector"),
        (config(tiers=[{"type": "example", "backpressure": {"alpha": 9}}]), r"alpha must be in"),
        (config(tiers=[{"type": "example", "locality": "moon"}]), "locality must be"),
    ],
)
def test_bad_config_is_a_clear_error(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_manager(data)


def test_toml_config_with_backpressure(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        "num_blocks = 16\nblock_size_bytes = 64\n"
        "[backpressure]\nmax_in_flight_jobs = 4\n"
        '[[tiers]]\ntype = "example"\nlocality = "REMOTE"\n'
        "[tiers.backpressure]\nhigh_water_s_per_mib = 0.5\n"
    )
    m = build_manager(path)
    assert isinstance(m, TieringOffloadingManager)
    gate = m.entries[0].cascade_gate
    assert gate is not None and gate.max_in_flight_jobs == 4
    assert isinstance(gate.detector, EMADetector) and gate.detector.high == 0.5
    assert gate.detector.low == DEFAULT_WATER_MARKS[Locality.REMOTE][1]
    m.shutdown()


# -- a tier 10x slower than the cascade rate ---------------------------------------------

STEP_S = 0.001
BLOCKS_PER_STORE = 4
SLOW_BLOCK = 64 * 1024


def run_workload(tiers: list[dict[str, Any]], steps: int, **extra: Any) -> dict[str, float]:
    """A skewed prefix workload: each step one request looks its prompt up in the CPU tier
    only (a ``TierFilter`` allowing no tier, so promotions do not blur the CPU figure) and
    stores what missed; one engine step is ``STEP_S`` long."""
    import random

    rng = random.Random(7)
    m = build_manager({"num_blocks": 400, "block_size_bytes": SLOW_BLOCK, "tiers": tiers, **extra})
    prompts = 300
    weights = [1.0 / (i + 1) ** 0.8 for i in range(prompts)]
    cpu_only = TierFilter(matchers=())
    peak = 0
    started = time.perf_counter()
    for step in range(steps):
        prompt = rng.choices(range(prompts), weights)[0]
        ctx = ReqContext(f"r{step}", load_tier_filter=cpu_only)
        m.on_new_request(ctx)
        keys = [k(prompt * 16 + j) for j in range(BLOCKS_PER_STORE)]
        first_miss = next(
            (i for i, key in enumerate(keys) if m.lookup(key, ctx) is not LookupResult.HIT),
            len(keys),
        )
        out = m.prepare_store(keys[first_miss:], ctx) if first_miss < len(keys) else None
        if out is not None and out.keys_to_store:
            m.complete_store(out.keys_to_store, ctx)
        m.on_request_finished(ctx)
        m.on_schedule_end()
        if isinstance(m, TieringOffloadingManager):
            peak = max(peak, m.get_stats().jobs_in_flight)
        time.sleep(STEP_S)
    elapsed = time.perf_counter() - started
    cpu = m.cpu_stats()
    figures: dict[str, float] = {
        "hit_ratio": cpu.hits / max(1, cpu.hits + cpu.misses),
        "step_s": elapsed / steps,
        "peak_jobs_in_flight": peak,
    }
    if isinstance(m, TieringOffloadingManager):
        tier = m.tier_stats()[0]
        figures.update(
            dropped_cascades=tier.dropped_cascades,
            dropped_blocks=tier.dropped_blocks,
            cascaded_blocks=tier.cascaded_blocks,
            peak_cascades_in_flight=tier.peak_cascades_in_flight,
        )
        m.drain(timeout=60)
    m.shutdown()
    return figures


def slow_tier(step_s: float, backpressure: dict[str, Any] | None) -> dict[str, Any]:
    # One step cascades BLOCKS_PER_STORE blocks at most; the tier needs 10x the step for that.
    mib_per_step = BLOCKS_PER_STORE * SLOW_BLOCK / MIB
    tier: dict[str, Any] = {
        "type": "faulty",
        "seconds_per_mib": 10 * step_s / mib_per_step,
        "inner": {"type": "example", "capacity_blocks": 4000},
    }
    if backpressure is not None:
        tier["backpressure"] = backpressure
    return tier


def test_a_tier_10x_slower_than_cascades_leaves_the_cpu_hit_ratio_alone() -> None:
    steps = 1200
    bound = 8
    baseline = run_workload([], steps)
    slow = slow_tier(baseline["step_s"], {"max_in_flight_jobs": bound})
    gated = run_workload([slow], steps)
    print(f"\nbackpressure 10x: baseline {baseline}\n gated {gated}")
    assert abs(gated["hit_ratio"] - baseline["hit_ratio"]) <= 0.01
    assert gated["peak_cascades_in_flight"] <= bound
    assert gated["peak_jobs_in_flight"] <= bound
    assert gated["dropped_cascades"] > 0 and gated["cascaded_blocks"] > 0


# -- issue 25: the engine's step is not the tier's time; the utilization detector ----------


def test_a_fast_tier_collected_once_per_engine_step_is_not_under_pressure() -> None:
    """A tier that finishes each cascade at once, collected every 10 ms as an engine's step
    collects it: before, each 4 KiB job counted 10 ms (0.16 s/MiB, 16x the local high water
    mark) and the gate dropped every cascade after the warm-up."""
    manager = build_manager(
        {
            "num_blocks": 400,
            "block_size_bytes": 4096,
            "tiers": [{"type": "example", "backpressure": {"warmup": 2}}],
        }
    )
    try:
        for step in range(20):
            ctx = ReqContext(f"r{step}")
            manager.on_new_request(ctx)
            store(manager, *range(step * 15, step * 15 + 15), ctx=ctx)
            manager.on_request_finished(ctx)
            time.sleep(0.01)
            manager.on_schedule_end()
        stats = manager.tier_stats()[0]
        assert stats.dropped_cascades == 0 and stats.cascaded_blocks == 300
        assert stats.backpressure["under_pressure"] == 0.0
    finally:
        manager.shutdown()


def utilization(clock: Clock, **options: Any) -> UtilizationDetector:
    return UtilizationDetector(clock=clock, **{"window_s": 1.0, **options})


def test_utilization_is_the_busy_share_of_the_window() -> None:
    clock = Clock()
    detector = utilization(clock)
    clock.now += 0.5
    detector.on_store_completed(0.25, 4096)  # busy [100.25, 100.5]
    assert detector.utilization() == pytest.approx(0.5)  # 0.25 of the 0.5 s so far
    clock.now += 1.0  # the window is [100.5, 101.5]: nothing busy in it
    assert detector.utilization() == 0.0
    detector.on_store_completed(0.6, 4096)  # busy [100.9, 101.5]
    detector.on_store_completed(0.3, 4096)  # inside it: merged, nothing added
    assert detector.utilization() == pytest.approx(0.6)


def test_utilization_pressure_has_warmup_and_hysteresis() -> None:
    clock = Clock()
    detector = utilization(clock, high_water_utilization=0.9, low_water_utilization=0.5)
    clock.now += 0.5
    detector.on_store_completed(0.5, 4096)  # busy the whole time, but still warming up
    assert not detector.under_pressure()
    clock.now += 0.6
    detector.on_store_completed(0.6, 4096)  # 100% of the window
    assert detector.under_pressure() and detector.overshoot() == pytest.approx(1.0)
    clock.now += 0.3  # 70% busy: between the marks, still under pressure
    assert detector.under_pressure()
    clock.now += 0.3  # 40%: released
    assert not detector.under_pressure()
    detector.reset()
    assert detector.utilization() == 0.0 and not detector.under_pressure()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"high_water_utilization": 1.5}, "<= 1"),
        ({"high_water_utilization": 0.5, "low_water_utilization": 0.6}, "low_water_utilization"),
        ({"window_s": 0}, "window_s"),
        ({"high_water_utilization": "x"}, "high_water_utilization"),
    ],
)
def test_bad_utilization_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        UtilizationDetector(**options)


def test_utilization_detector_is_a_built_in_by_name() -> None:
    assert detector_registry.resolve("utilization") is UtilizationDetector
    manager = build_manager(
        {
            "num_blocks": 8,
            "block_size_bytes": 64,
            "tiers": [{"type": "example", "backpressure": {"detector": "utilization"}}],
        }
    )
    try:
        assert "utilization" in manager.tier_stats()[0].backpressure
    finally:
        manager.shutdown()
