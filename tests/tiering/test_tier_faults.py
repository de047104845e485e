"""Fault injection: thousands of seeded requests through a small CPU tier and several faulty
secondary tiers (failed jobs, late results, ``submit_*`` raising), with real bytes.

The tiers are the shipped ``faulty`` wrapper around the example tier, with ``defer_transfer``:
bytes move when a job's result is released, not when it is submitted, so a manager that
released a pin or reused a reserved slot too early would corrupt what it reads back.

Every block's bytes derive from its key (:func:`_tiers.block_bytes`), so every read back is
checked. After the run and a drain: no pin or reservation leaks, no job outstanding, every
``PENDING`` answer resolved to ``HIT`` or ``MISS`` within a bounded number of steps, and the
bytes in the CPU tier and in every tier are the right ones.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from _tiers import block_bytes, faulty_tier, held_blocks, key
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.buffer import CPUKVBuffer
from kv_offload.tiering import OffloadingConfig, TierEntry
from kv_offload.tiering.promotions import PromotionLimits
from kv_offload.tiering.writes import WritePolicy
from kv_offload_faulty_tier import FaultyTier

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 256
TIERS = [
    # name, fault arguments, the inner example tier's capacity
    ("flaky", {"fail_rate": 0.15, "delay_polls": 2, "raise_rate": 0.05}, 80),
    ("slow", {"fail_rate": 0.02, "delay_polls": 5}, 300),
    ("crashy", {"fail_rate": 0.05, "delay_polls": 1, "raise_rate": 0.25}, None),
]
MAX_DELAY = max(args.get("delay_polls", 0) for _, args, _ in TIERS)
#: A promotion queued in step s is submitted at the end of s and reported within MAX_DELAY
#: more polls, one per on_schedule_end(): it resolves by the end of step s + MAX_DELAY.
PENDING_BOUND = MAX_DELAY + 1


pytestmark = pytest.mark.usefixtures("quiet_tiering_log")


class Bytes:
    """Expected block bytes, cached for the whole module: they depend only on the key, and the
    runs of every seed share most keys."""

    _rows: dict[OffloadKey, np.ndarray] = {}  # noqa: RUF012 - one cache for every instance

    def __call__(self, keys: list[OffloadKey]) -> np.ndarray:
        rows = self._rows
        for k in keys:
            if k not in rows:
                rows[k] = np.frombuffer(block_bytes(k, BLOCK), np.uint8)
        return np.stack([rows[k] for k in keys]) if keys else np.empty((0, BLOCK), np.uint8)


@dataclass
class Request:
    ctx: ReqContext
    keys: list[OffloadKey]
    admitted: int
    waits: int = 0


@dataclass
class Report:
    requests: int = 0
    steps: int = 0
    verified_loads: int = 0
    verified_blocks: int = 0
    pending_answers: int = 0
    resolved_hit: int = 0
    resolved_miss: int = 0
    max_pending_age: int = 0
    max_request_wait: int = 0
    rejected_stores: int = 0
    failed_engine_stores: int = 0
    ages: list[int] = field(default_factory=list)


def build(
    seed: int, capacity: int, policy: str, write_back: tuple[str, ...] = ()
) -> tuple[TieringOffloadingManager, list[FaultyTier]]:
    """The stack; tiers named in ``write_back`` are written back, through staging rows past
    the CPU tier's own (as few as 6, so stores wait for write-backs and some victims find no
    row: both paths run)."""
    buffer = CPUKVBuffer(capacity + (6 if write_back else 0), BLOCK)
    primary = CPUOffloadingManager(capacity, cache_policy=policy, kv_buffer=buffer)
    config = OffloadingConfig(capacity, BLOCK)
    tiers = [
        faulty_tier(config, buffer.view, name, inner, seed=seed * 31 + i, **args)
        for i, (name, args, inner) in enumerate(TIERS)
    ]
    back, through = WritePolicy.WRITE_BACK, WritePolicy.WRITE_THROUGH
    entries = [
        TierEntry(tier, write_policy=back if tier.tier_type in write_back else through)
        for tier in tiers
    ]
    # No backoff in seconds: a failed key is asked again at its next lookup, and not after
    # max_failures failures in a row. A 1 s backoff would make a run's answers depend on how
    # fast the machine runs it (a busy one sees fewer backoffs expire), and two runs of one
    # seed differ.
    limits = PromotionLimits(backoff=0.0)
    manager = TieringOffloadingManager(primary, entries, drain_timeout=5.0, promotion_limits=limits)
    return manager, tiers


def run(
    seed: int,
    num_requests: int = 1200,
    capacity: int = 24,
    policy: str = "lru",
    per_step: int = 4,
    write_back: tuple[str, ...] = (),
) -> tuple[TieringOffloadingManager, list[FaultyTier], Report, set[OffloadKey]]:
    rng = random.Random(seed)
    m, tiers = build(seed, capacity, policy, write_back)
    expect = Bytes()
    report = Report()
    primary = m.primary
    buffer = m.kv_buffer
    # Documents: prefix chains of 2..10 blocks, popularity ~ 1/rank.
    doc_lengths = [rng.randint(2, 10) for _ in range(160)]
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(doc_lengths))))
    docs = range(len(doc_lengths))
    all_keys: set[OffloadKey] = set()
    watch: dict[OffloadKey, int] = {}  # key answered PENDING -> step it did so first
    active: list[Request] = []
    step = 0
    submitted = 0

    def settle(k: OffloadKey) -> bool:
        """Close ``k``'s watch if its promotion resolved; ``False`` if still in flight. Also
        called before each lookup: a promotion can resolve mid-step (prepare_store collects
        finished tier jobs when blocks pinned by cascades are in its way), and the next
        PENDING answer for the key is then a new promotion."""
        ref = primary.ref_count(k)
        if ref is not None and ref < 0:
            return False
        age = step + 1 - watch.pop(k)
        report.ages.append(age)
        report.max_pending_age = max(report.max_pending_age, age)
        if ref is None:
            report.resolved_miss += 1
        else:
            report.resolved_hit += 1
        return True

    def new_request() -> Request:
        nonlocal submitted
        doc = rng.choices(docs, cum_weights=cum_weights)[0]
        length = rng.randint(1, doc_lengths[doc])
        keys = [key(doc * 1000 + i) for i in range(length)]
        keys += [key(10**7 + submitted * 16 + j) for j in range(rng.randint(0, 3))]  # unique tail
        all_keys.update(keys)
        ctx = ReqContext(f"req-{submitted}")
        submitted += 1
        m.on_new_request(ctx)
        return Request(ctx, keys, step)

    while submitted < num_requests or active:
        while submitted < num_requests and len(active) < per_step:
            active.append(new_request())
        rng.shuffle(active)
        still_waiting: list[Request] = []
        for req in active:
            ctx = req.ctx
            hits: list[OffloadKey] = []
            pending: list[OffloadKey] = []
            for k in req.keys:
                if k in watch:
                    settle(k)
                answer = m.lookup(k, ctx)
                if answer is MISS:
                    break
                if answer is PENDING:
                    pending.append(k)
                    watch.setdefault(k, step)
                elif not pending:
                    hits.append(k)
            if pending:  # the engine waits for the promotions before scheduling it
                report.pending_answers += len(pending)
                req.waits += 1
                still_waiting.append(req)
                continue
            report.max_request_wait = max(report.max_request_wait, step - req.admitted)
            if hits:
                spec = m.prepare_load(hits, ctx)
                got = buffer.read_blocks(spec.block_ids)
                if not np.array_equal(got, expect(hits)):
                    np.testing.assert_array_equal(got, expect(hits), err_msg=ctx.req_id)
                m.complete_load(hits, ctx)
                report.verified_loads += 1
                report.verified_blocks += len(hits)
            m.touch(req.keys, ctx)
            rest = req.keys[len(hits) :]
            if rest:
                out = m.prepare_store(rest, ctx)
                if out is None:
                    report.rejected_stores += 1
                elif out.keys_to_store:
                    ok = rng.random() >= 0.03  # the engine's GPU -> CPU copy sometimes fails
                    if ok:
                        buffer.write_blocks(out.store_spec.block_ids, expect(out.keys_to_store))
                    else:
                        report.failed_engine_stores += 1
                    m.complete_store(out.keys_to_store, ctx, success=ok)
            m.on_request_finished(ctx)
            report.requests += 1
        active = still_waiting
        m.on_schedule_end()
        # Every promotion in flight resolves within PENDING_BOUND steps.
        for k, since in list(watch.items()):
            if not settle(k):
                assert step - since <= PENDING_BOUND, f"{k!r} PENDING for {step - since} steps"
        step += 1
        assert step < num_requests * 10, "the run does not make progress"
    report.steps = step
    m.drain()
    assert not watch, f"{len(watch)} keys still PENDING after the run"
    return m, tiers, report, all_keys


def check_no_leaks(m: TieringOffloadingManager) -> None:
    stats = m.get_stats()
    cpu = stats.cpu
    assert cpu.pinned_blocks == 0
    assert cpu.pending_blocks == 0
    assert stats.jobs_in_flight == 0
    assert stats.promotions_queued == 0
    assert cpu.free_blocks + cpu.resident_blocks == cpu.capacity
    assert cpu.evictable_blocks == cpu.resident_blocks
    assert not m.has_pending_work()


def check_all_bytes(m: TieringOffloadingManager, tiers: list[FaultyTier], keys: set[OffloadKey]):
    """Every block resident in the CPU tier, and every block each tier holds, is intact."""
    expect = Bytes()
    ctx = ReqContext("audit")
    resident = [k for k in keys if m.primary.ref_count(k) == 0]
    assert len(resident) == m.get_stats().cpu.resident_blocks
    if resident:
        spec = m.prepare_load(resident, ctx)
        np.testing.assert_array_equal(m.kv_buffer.read_blocks(spec.block_ids), expect(resident))
        m.complete_load(resident, ctx)
    for tier in tiers:
        blocks = held_blocks(tier)
        held = list(blocks)
        assert held, f"tier {tier.tier_type} holds nothing"
        rows = np.stack([blocks[k] for k in held])
        np.testing.assert_array_equal(rows, expect(held), err_msg=f"bytes in tier {tier.tier_type}")


@pytest.mark.parametrize(
    ("seed", "policy"),
    [(1, "lru"), (2, "lru"), (3, "arc")],
    ids=["lru-1", "lru-2", "arc-3"],
)
def test_thousands_of_requests_with_faulty_tiers(seed: int, policy: str) -> None:
    m, tiers, report, keys = run(seed, policy=policy)
    check_no_leaks(m)
    check_all_bytes(m, tiers, keys)
    stats = m.get_stats()
    # The run exercised what it claims to: constant eviction and promotion, and every fault.
    assert report.requests == 1200
    assert stats.cpu.evictions > 2000
    assert report.verified_blocks > 1000
    assert sum(t.promoted_blocks for t in stats.tiers) > 1000
    assert report.resolved_hit > 1000 and report.resolved_miss > 100
    assert report.max_pending_age <= PENDING_BOUND
    # Requests wait for promotions, which a small, busy CPU tier keeps taking back (a
    # request's own hits are protected, not other requests'); a livelock guard only.
    assert report.max_request_wait <= 150
    for tier, tier_stats in zip(tiers, stats.tiers):
        c = tier.counters
        assert c.failed > 0 and c.torn_loads > 0, tier.tier_type
        assert tier_stats.failed_promotions > 0 and tier_stats.failed_cascades > 0, tier.tier_type
        assert tier_stats.promoted_blocks > 0 and tier_stats.cascaded_blocks > 0, tier.tier_type
        if tier.plan.delay_polls:
            assert c.delayed > 0, tier.tier_type
        if tier.plan.raise_rate:
            assert c.raised > 0, tier.tier_type
        # Every accepted job reported exactly once, and the manager counted each block the
        # tier moved; a raise failed its job right away (counted by the manager, not moved).
        assert c.released == c.submitted, tier.tier_type
        assert c.stored_blocks == tier_stats.cascaded_blocks, tier.tier_type
        assert c.loaded_blocks == tier_stats.promoted_blocks, tier.tier_type
        assert tier.in_flight == 0 and not tier._storing
    assert sum(t.counters.raised for t in tiers) > 100
    m.shutdown()
    assert all(t.counters.shutdowns == 1 for t in tiers)


@pytest.mark.parametrize("write_back", [("flaky",), ("flaky", "slow", "crashy")])
def test_write_back_tiers_under_faults_lose_and_corrupt_nothing(
    write_back: tuple[str, ...],
) -> None:
    """Write-back tiers (a block written when the CPU tier evicts it, from a staging row)
    under the same faults: every byte served and every byte a tier holds is the key's, no pin,
    slot or staging row leaks, and the tiers were really written back."""
    m, tiers, report, keys = run(5, write_back=write_back)
    check_no_leaks(m)
    check_all_bytes(m, tiers, keys)
    stats = m.get_stats()
    assert report.requests == 1200 and report.verified_blocks > 500
    assert report.max_pending_age <= PENDING_BOUND
    for tier, tier_stats in zip(tiers, stats.tiers):
        c = tier.counters
        assert c.released == c.submitted, tier.tier_type
        assert c.stored_blocks == tier_stats.cascaded_blocks, tier.tier_type
        assert tier_stats.cascaded_blocks > 100, tier.tier_type
        if tier.tier_type in write_back:
            assert tier_stats.write_policy == "write-back"
            # Fewer writes than stores: only evicted, engine-stored blocks are written.
            assert tier_stats.cascaded_blocks + tier_stats.failed_cascades < stats.cpu.stored_blocks
    back = [s for s in stats.tiers if s.write_policy == "write-back"]
    assert back[0].write_back_rescued > 0  # a lookup found a block still being written
    m.shutdown()


def test_runs_are_deterministic() -> None:
    first = run(7, num_requests=300)
    second = run(7, num_requests=300)
    a, b = first[0].get_stats(), second[0].get_stats()
    assert a == b
    assert first[2].ages == second[2].ages


# -- one fault at a time --------------------------------------------------------------------------


def _single_tier(capacity: int, **faults: Any) -> tuple[TieringOffloadingManager, FaultyTier]:
    primary = CPUOffloadingManager(capacity, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = faulty_tier(OffloadingConfig(capacity, BLOCK), primary.kv_buffer.view, "t", **faults)
    return TieringOffloadingManager(primary, [tier], drain_timeout=5.0), tier


def _plant(tier: FaultyTier, k: OffloadKey) -> None:
    """Give the wrapped tier a block directly, past the faults."""
    held_blocks(tier)[k] = np.frombuffer(block_bytes(k, BLOCK), np.uint8).copy()


def _store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, Bytes()(out.keys_to_store))
    m.complete_store(out.keys_to_store, ctx)


@pytest.mark.parametrize("delay", [0, 1, 3, 6])
def test_late_results_resolve_after_exactly_k_polls(delay: int) -> None:
    m, _ = _single_tier(2, min_delay_polls=delay, delay_polls=delay)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)
    for _ in range(delay + 1):
        m.on_schedule_end()
    _store(m, [3, 4], ctx)
    for _ in range(delay + 1):
        m.on_schedule_end()
    assert m.lookup(key(1), ctx) is PENDING
    answers = []
    for _ in range(delay + 1):
        m.on_schedule_end()
        answers.append(m.lookup(key(1), ctx))
    assert answers == [PENDING] * delay + [HIT]
    spec = m.prepare_load([key(1)], ctx)
    assert m.kv_buffer.read_blocks(spec.block_ids).tobytes() == block_bytes(key(1), BLOCK)
    m.complete_load([key(1)], ctx)
    m.drain()
    check_no_leaks(m)


def test_every_job_failing() -> None:
    m, tier = _single_tier(2, fail_rate=1.0)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)
    m.on_schedule_end()
    assert m.get_stats().tiers[0].failed_cascades == 2
    assert tier.lookup(key(1), ctx) is False  # nothing reached the tier
    _plant(tier, key(1))  # ...so give it a block directly
    _store(m, [3, 4], ctx)
    m.on_schedule_end()
    assert m.lookup(key(1), ctx) is PENDING
    m.on_schedule_end()
    assert m.primary.ref_count(key(1)) is None  # failed (and torn): the slot is freed
    assert tier.counters.torn_loads == 1
    check_no_leaks(m)
    assert m.get_stats().cpu.free_blocks == 1


def test_every_submit_raising() -> None:
    m, tier = _single_tier(2, raise_rate=1.0)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)  # the cascade raises: failed at once, nothing pinned
    assert m.get_stats().cpu.pinned_blocks == 0
    assert m.get_stats().tiers[0].failed_cascades == 2
    _plant(tier, key(1))
    _store(m, [3, 4], ctx)
    assert m.lookup(key(1), ctx) is PENDING  # a slot is reserved; the submit comes at step end
    m.on_schedule_end()  # submit_load raises: the promotion fails, the slot is freed
    assert m.primary.ref_count(key(1)) is None
    assert m.get_stats().tiers[0].failed_promotions == 1
    check_no_leaks(m)
