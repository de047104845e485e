"""The shipped ``faulty`` wrapper tier: validation, each fault kind, determinism, and that a
stack soaked through it loses no pin and serves no wrong byte."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
from kv_offload import (
    ConfigError,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    load_config,
    make_offload_key,
)
from kv_offload.errors import PluginNotFoundError
from kv_offload.replay import replay
from kv_offload.tiering import JobDirection, JobMetadata, OffloadingConfig, SecondaryTierFactory
from kv_offload_example_tier import ExampleSecondaryTierManager
from kv_offload_faulty_tier import FaultyTier, InjectedFault

BLOCK = 4096
MIB = 1 << 20


pytestmark = pytest.mark.usefixtures("quiet_tiering_log")


def stack(num_blocks: int = 64, **faults: Any) -> TieringOffloadingManager:
    inner = faults.pop("inner", {"type": "example", "capacity_blocks": 4096})
    manager = build_manager(
        {
            "num_blocks": num_blocks,
            "block_size_bytes": BLOCK,
            "tiers": [{"type": "faulty", "inner": inner, **faults}],
        }
    )
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def workload(requests: int = 400, seed: int = 0) -> list[tuple[ReqContext, list[bytes]]]:
    """Prefix chains drawn from a few documents, so blocks are reused after eviction."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(requests):
        doc = int(rng.integers(0, 40))
        length = int(rng.integers(2, 9))
        keys = [make_offload_key(doc * 100 + j) for j in range(length)]
        out.append((ReqContext(req_id=f"r{i}"), keys))
    return out


def faulty_of(manager: TieringOffloadingManager) -> FaultyTier:
    tier = manager.tiers[0]
    assert isinstance(tier, FaultyTier)
    return tier


def assert_idle(manager: TieringOffloadingManager) -> None:
    manager.drain(timeout=10)
    stats = manager.get_stats()
    assert stats.jobs_in_flight == 0
    assert stats.cpu.pinned_blocks == 0
    assert stats.cpu.pending_blocks == 0
    assert faulty_of(manager).in_flight == 0


def test_installed_as_a_distribution() -> None:
    info = {i.name: i for i in SecondaryTierFactory.available_tiers()}["faulty"]
    assert info.distribution == "kv-offload-faulty-tier"
    assert SecondaryTierFactory.get_tier_class({"type": "faulty"}) is FaultyTier


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"fail_rate": 1.5}, "fail_rate"),
        ({"fail_rate": "often"}, "fail_rate"),
        ({"raise_rate": -0.1}, "raise_rate"),
        ({"lookup_raise_rate": True}, "lookup_raise_rate"),
        ({"delay_polls": -1}, "delay_polls"),
        ({"delay_polls": 2.5}, "delay_polls"),
        ({"min_delay_polls": -1}, "min_delay_polls"),
        ({"delay_polls": 1, "min_delay_polls": 2}, "min_delay_polls"),
        ({"defer_transfer": "yes"}, "defer_transfer"),
        ({"delay_s": -1}, "delay_s"),
        ({"seconds_per_mib": "fast"}, "seconds_per_mib"),
        ({"seed": "x"}, "seed"),
        ({"inner": "example"}, "inner"),
        ({"inner": {"capacity_blocks": 5}}, "inner"),
    ],
)
def test_bad_settings_name_the_key(arguments: dict[str, Any], named: str) -> None:
    config = {"type": "faulty", "inner": {"type": "example"}, **arguments}
    with pytest.raises(ConfigError, match=named) as raised:
        build_manager({"num_blocks": 8, "block_size_bytes": BLOCK, "tiers": [config]})
    assert "faulty" in str(raised.value)
    # Config validation finds it too, before anything is built, and locates it at the key.
    with pytest.raises(ConfigError, match=named) as validated:
        load_config({"num_blocks": 8, "block_size_bytes": BLOCK, "tiers": [config]})
    assert validated.value.key == f"tiers[0].{named}"


def test_unknown_inner_tier_is_a_plugin_error() -> None:
    with pytest.raises(PluginNotFoundError, match="no-such-tier"):
        stack(inner={"type": "no-such-tier"})


def test_every_cascade_failing_leaks_nothing() -> None:
    manager = stack(fail_rate=1.0)
    result = replay(manager, workload(200), data_plane=True)
    assert_idle(manager)
    tier_stats = manager.get_stats().tiers[0]
    assert tier_stats.cascaded_blocks == 0
    assert tier_stats.failed_cascades > 0
    inner = faulty_of(manager).inner
    assert isinstance(inner, ExampleSecondaryTierManager)
    assert len(inner) == 0
    assert result.corrupted_blocks == 0
    manager.shutdown()


def test_torn_promotions_are_never_served() -> None:
    manager = stack(num_blocks=24, fail_rate=0.3, delay_polls=2, seed=3)
    result = replay(manager, workload(600, seed=1), data_plane=True)
    assert_idle(manager)
    tier = faulty_of(manager)
    assert tier.counters.torn_loads > 0, "the workload must exercise failed promotions"
    assert result.promoted_hit_blocks > 0
    assert result.corrupted_blocks == 0
    assert manager.get_stats().tiers[0].failed_promotions == tier.counters.torn_loads
    manager.shutdown()


def test_raising_submits_are_contained() -> None:
    manager = stack(num_blocks=24, raise_rate=0.2, seed=5)
    result = replay(manager, workload(400, seed=2), data_plane=True)
    assert_idle(manager)
    assert faulty_of(manager).counters.raised > 0
    assert result.corrupted_blocks == 0
    manager.shutdown()


def test_counters_account_for_every_job() -> None:
    manager = stack(num_blocks=24, fail_rate=0.2, raise_rate=0.05, delay_polls=2, seed=9)
    replay(manager, workload(300, seed=5), data_plane=True)
    assert_idle(manager)
    c = faulty_of(manager).counters
    tier_stats = manager.get_stats().tiers[0]
    assert c.submitted > 0 and c.raised > 0 and c.failed > 0
    assert c.released == c.submitted, "every accepted job is reported exactly once"
    assert c.stored_blocks == tier_stats.cascaded_blocks > 0
    assert c.loaded_blocks == tier_stats.promoted_blocks > 0
    assert c.shutdowns == 0
    manager.shutdown()
    assert c.shutdowns == 1


def test_same_seed_same_faults() -> None:
    def counters(seed: int) -> Any:
        manager = stack(num_blocks=24, fail_rate=0.2, raise_rate=0.05, delay_polls=3, seed=seed)
        replay(manager, workload(300, seed=4), data_plane=True)
        manager.drain(timeout=10)
        found = faulty_of(manager).counters
        manager.shutdown()
        return found

    assert counters(11) == counters(11)
    assert counters(11) != counters(12)


# -- the tier alone ------------------------------------------------------------------------


def direct(**faults: Any) -> tuple[FaultyTier, np.ndarray]:
    rows = np.zeros((16, BLOCK), np.uint8)
    inner = faults.pop("inner", {"type": "example"})
    tier = FaultyTier(OffloadingConfig(16, BLOCK), memoryview(rows), "faulty", inner, **faults)
    return tier, rows


def job(job_id: int, direction: JobDirection, keys: list[bytes], slots: list[int]) -> JobMetadata:
    return JobMetadata(
        job_id, keys, np.array(slots, np.int64), direction, ReqContext(req_id=f"j{job_id}")
    )


def test_held_store_answers_ask_again_until_released() -> None:
    tier, rows = direct(delay_polls=1)
    k = make_offload_key(1)
    ctx = ReqContext(req_id="q")
    rows[0] = 7
    tier.submit_store(job(1, JobDirection.STORE, [k], [0]))
    released = []
    polls = 0
    while not released:
        assert tier.lookup(k, ctx) is None
        released = tier.get_finished()
        polls += 1
        assert polls <= 2, "a result is held for at most delay_polls polls"
    assert released[0].success
    assert tier.lookup(k, ctx) is True
    rows[3] = 0
    tier.submit_load(job(2, JobDirection.LOAD, [k], [3]))
    while not tier.get_finished():
        pass
    assert (rows[3] == 7).all()


@pytest.mark.parametrize("delay", [0, 2, 5])
def test_min_delay_polls_fixes_the_delay(delay: int) -> None:
    tier, _ = direct(delay_polls=delay, min_delay_polls=delay)
    tier.submit_store(job(1, JobDirection.STORE, [make_offload_key(1)], [0]))
    polls = 1
    while not tier.get_finished():
        polls += 1
        assert polls <= delay + 1
    assert polls == delay + 1, "held for exactly delay_polls polls, released on the next"


@pytest.mark.parametrize(("defer", "stored"), [(False, 7), (True, 9)])
def test_defer_transfer_moves_bytes_when_the_result_is_due(defer: bool, stored: int) -> None:
    """A slot rewritten while its store is held (what a manager that unpinned too early would
    allow) reaches the tier only with ``defer_transfer``: then the bug shows in the bytes."""
    tier, rows = direct(delay_polls=1, min_delay_polls=1, defer_transfer=defer)
    k = make_offload_key(1)
    rows[0] = 7
    tier.submit_store(job(1, JobDirection.STORE, [k], [0]))
    rows[0] = 9
    assert tier.get_finished() == []
    (result,) = tier.get_finished()
    assert result.success
    tier.submit_load(job(2, JobDirection.LOAD, [k], [3]))
    while not tier.get_finished():
        pass
    assert (rows[3] == stored).all()


def test_deferred_submit_that_raises_fails_the_job(caplog: pytest.LogCaptureFixture) -> None:
    inner = {"type": "faulty", "raise_rate": 1.0, "inner": {"type": "example"}}
    tier, _ = direct(defer_transfer=True, inner=inner)
    tier.submit_store(job(1, JobDirection.STORE, [make_offload_key(1)], [0]))  # accepted
    with caplog.at_level(logging.ERROR, logger="kv_offload_faulty_tier"):
        (result,) = tier.get_finished()  # the inner tier raises now: the job fails
    assert not result.success
    assert "deferred submit" in caplog.text
    assert tier.counters.failed == 1 and tier.in_flight == 0
    assert tier.lookup(make_offload_key(1), ReqContext(req_id="q")) is False


def test_bandwidth_limit_serialises_transfers() -> None:
    tier, _ = direct(seconds_per_mib=0.25)  # 4 MiB/s; each job below moves 64 KiB
    keys = [make_offload_key(i) for i in range(16)]
    start = time.monotonic()
    for n in range(4):
        tier.submit_store(job(n, JobDirection.STORE, keys[4 * n : 4 * n + 4], [0, 1, 2, 3]))
    done: list[int] = []
    while len(done) < 4:
        done += [r.job_id for r in tier.get_finished()]
        time.sleep(0.002)
    elapsed = time.monotonic() - start
    expected = 4 * 4 * BLOCK / MIB * 0.25
    assert elapsed >= expected, f"4 serial transfers took {elapsed:.3f}s < {expected:.3f}s"
    assert done == [0, 1, 2, 3], "a serial device reports in submission order"


def test_lookup_can_raise() -> None:
    tier, _ = direct(lookup_raise_rate=1.0)
    with pytest.raises(InjectedFault, match="lookup"):
        tier.lookup(make_offload_key(1), ReqContext(req_id="q"))
    assert tier.counters.lookup_raised == 1


@pytest.mark.parametrize("fail_rate", [1.0, 0.0], ids=["injected", "inner-tier-failed"])
def test_failed_load_scribbles_its_rows(fail_rate: float) -> None:
    tier, rows = direct(fail_rate=fail_rate)  # the inner tier lacks the key: it fails the load
    rows[5] = 1
    tier.submit_load(job(1, JobDirection.LOAD, [make_offload_key(9)], [5]))
    (result,) = tier.get_finished()
    assert not result.success
    assert (rows[5] == 0xEE).all()
    assert tier.counters.torn_loads == tier.counters.failed == 1
