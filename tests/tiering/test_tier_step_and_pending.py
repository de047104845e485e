"""Two parts of the tier contract: ``on_schedule_end`` reaches every tier before the step's
promotions are submitted, and a tier ``lookup`` answering ``None`` ("ask again") makes the
tiered manager answer ``PENDING`` while no tier holds the key."""

from __future__ import annotations

import logging

import pytest
from _tiers import RecordingTier, expected_rows, key
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.tiering import JobMetadata, OffloadingConfig

BLOCK = 64
HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING


class StepTier(RecordingTier):
    """Records ``on_schedule_end`` calls and submitted loads into one shared log; answers
    ``None`` for the keys in ``unsure``."""

    def __init__(self, *args: object, log: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.log = log
        self.unsure: set[OffloadKey] = set()
        self.raise_on_step = False

    def on_schedule_end(self) -> None:
        self.log.append(f"{self.tier_type}.on_schedule_end")
        if self.raise_on_step:
            raise RuntimeError("step failed")

    def submit_load(self, job: JobMetadata) -> None:
        self.log.append(f"{self.tier_type}.submit_load")
        super().submit_load(job)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self.unsure:
            return None
        return super().lookup(key, req_context)


def stack(
    num_blocks: int, *names: str
) -> tuple[TieringOffloadingManager, list[StepTier], list[str]]:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(num_blocks, BLOCK)
    log: list[str] = []
    tiers = [StepTier(config, primary.kv_buffer.view, name, log=log) for name in names]
    return TieringOffloadingManager(primary, tiers, drain_timeout=5.0), tiers, log


def store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows(out.keys_to_store, BLOCK))
    m.complete_store(out.keys_to_store, ctx)


def test_on_schedule_end_reaches_every_tier_before_promotions_go_out() -> None:
    m, _, log = stack(1, "a", "b")
    ctx = ReqContext("r")
    store(m, [0], ctx)
    m.on_schedule_end()
    store(m, [1], ctx)  # evicts 0 from the CPU tier; tier a still has it
    m.on_schedule_end()
    log.clear()
    assert m.lookup(key(0), ReqContext("s")) is PENDING  # promotion queued from tier a
    m.on_schedule_end()
    assert log == ["a.on_schedule_end", "b.on_schedule_end", "a.submit_load"]
    m.drain()
    m.shutdown()


def test_a_tier_raising_from_on_schedule_end_is_logged_and_the_step_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m, (a, _), log = stack(4, "a", "b")
    a.raise_on_step = True
    with caplog.at_level(logging.ERROR, logger="kv_offload.tiering"):
        m.on_schedule_end()
    assert log == ["a.on_schedule_end", "b.on_schedule_end"]
    assert "on_schedule_end" in caplog.text
    m.shutdown()


def test_the_base_tier_on_schedule_end_is_a_no_op() -> None:
    m, _, _ = stack(4)
    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = RecordingTier(OffloadingConfig(4, BLOCK), primary.kv_buffer.view, "plain")
    assert tier.on_schedule_end() is None
    m.shutdown()


def test_ask_again_answers_pending_until_the_tier_knows() -> None:
    m, (a,), _ = stack(4, "a")
    ctx = ReqContext("r")
    a.unsure.add(key(7))
    assert m.lookup(key(7), ctx) is PENDING  # not known yet: not a miss
    assert m.get_stats().cpu.misses == 1  # the CPU tier itself did miss
    a.unsure.clear()
    assert m.lookup(key(7), ctx) is MISS  # the tier now says it does not have it
    m.shutdown()


def test_a_later_tier_holding_the_key_wins_over_ask_again() -> None:
    m, (a, b), _ = stack(2, "a", "b")
    ctx = ReqContext("r")
    store(m, [0], ctx)
    m.on_schedule_end()
    store(m, [1, 2], ctx)  # evicts 0 from the CPU tier; both tiers hold it
    m.on_schedule_end()
    a.unsure.add(key(0))
    assert m.lookup(key(0), ReqContext("s")) is PENDING
    m.on_schedule_end()
    m.drain()
    assert [len(t.loads()) for t in (a, b)] == [0, 1]  # promoted from b, which knew
    assert m.lookup(key(0), ReqContext("s")) is HIT
    m.shutdown()


def test_ask_again_reserves_nothing() -> None:
    m, (a,), _ = stack(2, "a")
    a.unsure.add(key(9))
    assert m.lookup(key(9), ReqContext("r")) is PENDING
    stats = m.get_stats()
    assert stats.promotions_queued == 0
    assert stats.cpu.pending_blocks == 0
    assert not m.has_pending_work()
    m.shutdown()
