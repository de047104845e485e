"""Every PENDING answer becomes HIT or MISS within the promotion timeout, whatever a tier does
(kv_offload.tiering.promotions): loads that always fail, jobs that never report, tiers
that keep saying "ask again", lookups and results that break the contract, and jobs that
fail only some of their keys. Real tiers: the shipped ``faulty`` wrapper around the example
tier (bytes moved at the last moment), and tier classes of the test's own for the contract
breaches."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from _tiers import RecordingTier, block_bytes, faulty_tier, key
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.tiering import JobMetadata, JobResult, OffloadingConfig
from kv_offload.tiering.promotions import PromotionLimits
from kv_offload_example_tier import ExampleSecondaryTierManager

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 256

pytestmark = pytest.mark.usefixtures("quiet_tiering_log")


def _bytes(keys: Iterable[OffloadKey]) -> np.ndarray:
    return np.frombuffer(b"".join(block_bytes(k, BLOCK) for k in keys), np.uint8).reshape(-1, BLOCK)


def _manager(tier_factory: Any, capacity: int = 2, **limits: Any) -> TieringOffloadingManager:
    primary = CPUOffloadingManager(capacity, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = tier_factory(OffloadingConfig(capacity, BLOCK), primary.kv_buffer.view)
    return TieringOffloadingManager(
        primary, [tier], drain_timeout=5.0, promotion_limits=PromotionLimits(**limits)
    )


def _store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, _bytes(out.keys_to_store))
    m.complete_store(out.keys_to_store, ctx)


def _ask(m: TieringOffloadingManager, k: OffloadKey, ctx: ReqContext, steps: int) -> list[Any]:
    """Lookups of ``k`` as an engine asks them: once a step, until it is not PENDING."""
    answers = [m.lookup(k, ctx)]
    while answers[-1] is PENDING and len(answers) <= steps:
        m.on_schedule_end()
        answers.append(m.lookup(k, ctx))
    return answers


def test_loads_that_always_fail_resolve_as_miss_and_back_off() -> None:
    """A tier that holds the key but fails every load: the lookup resolves as MISS after one
    failed promotion, later lookups are misses without a new promotion while the tier backs
    off, and attempts per key end after ``max_failures`` (was: PENDING for every step, one new
    promotion per lookup)."""

    def tier(config: OffloadingConfig, view: memoryview) -> RecordingTier:
        return RecordingTier(config, view, "t", fail_loads=True)

    m = _manager(tier, backoff=0.05, max_failures=2)
    recording = m.tiers[0]
    assert isinstance(recording, RecordingTier)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)
    m.on_schedule_end()
    _store(m, [3, 4], ctx)  # key 1 and 2 leave the CPU tier: only the tier holds them
    m.on_schedule_end()
    answers = _ask(m, key(1), ctx, steps=300)
    assert answers == [PENDING, MISS]
    for _ in range(50):  # backing off: no new promotion, no PENDING
        assert m.lookup(key(1), ctx) is MISS
        m.on_schedule_end()
    assert len(recording.loads()) == 1
    stats = m.get_stats().tiers[0]
    assert stats.failed_promotions == 1 and stats.backed_off_lookups >= 50
    time.sleep(0.06)  # the backoff passes: one more attempt, then never again (max_failures)
    assert _ask(m, key(1), ctx, steps=5) == [PENDING, MISS]
    time.sleep(0.3)
    for _ in range(20):
        assert m.lookup(key(1), ctx) is MISS
        m.on_schedule_end()
    assert len(recording.loads()) == 2
    # Stored to the tier again: it may be promoted from it again.
    recording.fail_loads = False
    m.reset_cache()
    _store(m, [1], ctx)
    m.on_schedule_end()
    _store(m, [5, 6], ctx)
    m.on_schedule_end()
    assert _ask(m, key(1), ctx, steps=5) == [PENDING, HIT]
    m.shutdown()


def test_a_promotion_that_never_lands_becomes_a_miss_and_keeps_its_slot() -> None:
    """A load that does not report within the timeout: the lookup answers MISS; the reserved
    slot is not reused while the tier may still write into it, and the late result lands the
    right bytes (the faulty tier moves them only when the result is released)."""
    delay = 0.6

    def tier(config: OffloadingConfig, view: memoryview) -> Any:
        return faulty_tier(config, view, "slow", capacity_blocks=8, delay_s=delay)

    m = _manager(tier, capacity=2, timeout=0.2)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)
    m.drain()
    _store(m, [3, 4], ctx)
    m.drain()
    start = time.monotonic()
    answers = []
    while not answers or answers[-1] is PENDING:
        answers.append(m.lookup(key(1), ctx))
        m.on_schedule_end()
        time.sleep(0.01)
    waited = time.monotonic() - start
    assert answers[-1] is MISS and 0.2 <= waited < delay
    assert m.get_stats().tiers[0].expired_promotions == 1
    # The engine recomputes key 1 and stores it: it is not handed a second slot.
    out = m.prepare_store([key(1), key(7)], ctx)
    assert out is not None and out.keys_to_store == [key(7)]  # key 4 evicted, not key 1's slot
    m.kv_buffer.write_blocks(out.store_spec.block_ids, _bytes(out.keys_to_store))
    m.complete_store(out.keys_to_store, ctx)
    m.drain()  # the late load lands
    assert m.lookup(key(1), ctx) is HIT
    spec = m.prepare_load([key(1)], ctx)
    assert m.kv_buffer.read_blocks(spec.block_ids).tobytes() == block_bytes(key(1), BLOCK)
    m.complete_load([key(1)], ctx)
    m.shutdown()


class _AskAgainForever(ExampleSecondaryTierManager):
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return None


def test_a_tier_that_keeps_saying_ask_again_is_a_miss_after_the_timeout() -> None:
    def tier(config: OffloadingConfig, view: memoryview) -> Any:
        return _AskAgainForever(config, view, "t")

    m = _manager(tier, timeout=0.1)
    ctx = ReqContext("r")
    deadline = time.monotonic() + 5
    answers = []
    while (not answers or answers[-1] is PENDING) and time.monotonic() < deadline:
        answers.append(m.lookup(key(9), ctx))
        m.on_schedule_end()
        time.sleep(0.01)
    assert answers[0] is PENDING and answers[-1] is MISS
    assert m.get_stats().tiers[0].ask_again_timeouts == 1
    m.shutdown()


class _Garbage(ExampleSecondaryTierManager):
    """Breaks the contract without raising: a lookup answer that is not True/False/None, and
    ``get_finished`` items that are not JobResults (beside the real ones)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        return "yes"

    def get_finished(self) -> Any:
        return [*super().get_finished(), 42, "done"]


def test_contract_breaches_are_counted_and_named(caplog: pytest.LogCaptureFixture) -> None:
    def tier(config: OffloadingConfig, view: memoryview) -> Any:
        return _Garbage(config, view, "garbage")

    m = _manager(tier)
    ctx = ReqContext("r")
    with caplog.at_level(logging.WARNING, logger="kv_offload.tiering"):
        for i in range(5):
            assert m.lookup(key(100 + i), ctx) is MISS
        _store(m, [1], ctx)
        m.on_schedule_end()
        m.on_schedule_end()
        m.shutdown()  # drains and polls again: no AttributeError
    stats = m.get_stats().tiers[0]
    assert stats.cascaded_blocks == 1  # the real result among the garbage counted
    assert stats.contract_errors >= 5 + 2
    text = caplog.text
    assert "'garbage'" in text and "True, False or None" in text
    assert "not a JobResult" in text
    assert text.count("True, False or None") == 1  # rate-limited: once, then counted


class _HalfFailing(ExampleSecondaryTierManager):
    """Fails the odd-numbered keys of every job, reporting them in ``failed_keys``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.odd = {key(i) for i in range(1, 100, 2)}

    def submit_store(self, job: JobMetadata) -> None:
        super().submit_store(job)
        self._finished[-1] = JobResult(job.job_id, True, failed_keys=frozenset(self.odd))
        for k in self.odd.intersection(job.keys):
            self._rows.pop(k, None)


def test_a_job_can_fail_some_keys_and_land_the_others() -> None:
    def tier(config: OffloadingConfig, view: memoryview) -> Any:
        return _HalfFailing(config, view, "half")

    m = _manager(tier, capacity=4)
    ctx = ReqContext("r")
    _store(m, [1, 2, 3, 4], ctx)
    m.on_schedule_end()
    stats = m.get_stats().tiers[0]
    assert (stats.cascaded_blocks, stats.failed_cascades) == (2, 2)
    assert stats.bytes_written == 2 * BLOCK
    assert sorted(held_blocks_of(m)) == sorted([key(2), key(4)])
    m.shutdown()


def held_blocks_of(m: TieringOffloadingManager) -> list[OffloadKey]:
    tier = m.tiers[0]
    assert isinstance(tier, ExampleSecondaryTierManager)
    return list(tier._rows)
