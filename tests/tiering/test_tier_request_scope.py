"""Request-level offload, per-request tier filters and locality, ``reset_cache`` on a tiered
stack, and the lookup answers mapped onto vLLM's ``LookupResult``.

Scenarios ported from vLLM 0.33's ``tests/v1/kv_offload/tiering/test_tiering_offloading.py``
(``test_on_new_request_lifecycle``, ``test_prepare_store_cascades_existing_blocks_to_request_
level_tiers``, ``test_tier_filter_*``, ``test_reset_cache_*``) onto our API, plus our own
edge cases.
"""

from __future__ import annotations

from typing import Any

import pytest
from _tiers import RecordingTier
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TierFilter,
    TieringOffloadingManager,
    build_manager,
    make_offload_key,
)
from kv_offload.errors import InvalidArgumentError
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    Locality,
    Medium,
    OffloadingConfig,
    SecondaryTierManager,
    TierEntry,
    TierMatcher,
)

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 32
CTX = ReqContext("r")


def k(i: int) -> OffloadKey:
    return make_offload_key(i)


def ks(*nums: int) -> list[OffloadKey]:
    return [k(i) for i in nums]


class WholeTier(RecordingTier):
    """A recording tier that asks for every request named in ``whole``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.whole: set[str] = set()
        self.started: list[str] = []

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        self.started.append(req_context.req_id)
        if req_context.req_id in self.whole:
            return RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext()


def stack(
    num_blocks: int = 6,
    names: tuple[str, ...] = ("t1", "t2"),
    locality: Locality | None = None,
) -> tuple[TieringOffloadingManager, list[WholeTier]]:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(num_blocks, BLOCK)
    tiers = [WholeTier(config, primary.kv_buffer.view, "example") for _ in names]
    entries = [TierEntry(tier, name, locality) for tier, name in zip(tiers, names)]
    return TieringOffloadingManager(primary, entries, drain_timeout=2.0), tiers


def store(m: TieringOffloadingManager, ctx: ReqContext, *nums: int) -> None:
    out = m.prepare_store(ks(*nums), ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)


# -- request-level offload -------------------------------------------------------------------


def test_on_new_request_lifecycle() -> None:
    m, (t1, t2) = stack()
    ctx = ReqContext("chunk")
    assert m.on_new_request(ctx).policy is OffloadPolicy.CHUNK_LEVEL
    assert t1.started == t2.started == ["chunk"]
    assert m.whole_requests() == {}
    m.on_request_finished(ctx)
    t1.whole.add("whole")
    ctx = ReqContext("whole")
    assert m.on_new_request(ctx).policy is OffloadPolicy.REQUEST_LEVEL
    assert m.whole_requests() == {"whole": ([m.entries[0].name], [])}
    m.on_request_finished(ctx)
    assert m.whole_requests() == {}
    # The CPU manager alone has no tiers to ask.
    assert CPUOffloadingManager(4).on_new_request(ctx) is None


@pytest.mark.parametrize("new", [(), (3, 4)], ids=["fully_warm", "mixed"])
def test_prepare_store_cascades_present_blocks_to_request_level_tiers_only(
    new: tuple[int, ...],
) -> None:
    m, (t1, t2) = stack()
    m.on_new_request(CTX)
    store(m, CTX, 0, 1, 2)
    m.on_schedule_end()
    t1.whole.add("whole")
    ctx = ReqContext("whole")
    m.on_new_request(ctx)
    before1, before2 = len(t1.stores()), len(t2.stores())
    out = m.prepare_store(ks(0, 1, 2, *new), ctx)
    assert out is not None and set(out.keys_to_store) == set(ks(*new))
    # Only t1 gets the present blocks now; new ones go to every tier at complete_store.
    assert [j.keys for j in t1.stores()[before1:]] == [ks(0, 1, 2)]
    assert len(t2.stores()) == before2
    m.complete_store(out.keys_to_store, ctx)
    if new:
        assert t2.stores()[-1].keys == ks(*new) == t1.stores()[-1].keys
    m.on_schedule_end()
    assert all(t1.lookup(key, ctx) is True for key in ks(0, 1, 2, *new))
    assert m.primary.ref_count(k(0)) == 0  # the extra cascade released its pins


def test_chunk_level_is_the_default_and_costs_no_extra_cascade() -> None:
    m, (t1, _) = stack()
    m.on_new_request(CTX)
    store(m, CTX, 0, 1)
    m.on_schedule_end()
    other = ReqContext("other")
    m.on_new_request(other)
    assert m.prepare_store(ks(0, 1), other) is not None
    assert len(t1.stores()) == 1


def test_block_still_being_stored_is_cascaded_once_when_its_store_completes() -> None:
    m, (t1, _) = stack()
    writer = ReqContext("writer")
    m.on_new_request(writer)
    out = m.prepare_store(ks(5), writer)  # pending in the CPU tier
    assert out is not None
    t1.whole.add("whole")
    whole = ReqContext("whole")
    m.on_new_request(whole)
    assert m.prepare_store(ks(5), whole) is not None
    assert t1.stores() == []  # not readable yet: nothing to send
    m.complete_store(ks(5), writer)  # the usual cascade sends it to every tier
    m.on_schedule_end()
    m.on_schedule_end()
    assert [j.keys for j in t1.stores()] == [ks(5)]


def test_block_being_promoted_is_parked_then_cascaded_when_it_lands() -> None:
    m, (_, t2) = stack()
    m.on_new_request(CTX)
    store(m, CTX, 7)
    m.on_schedule_end()
    m.reset_cache()  # 7 is only in the tiers now
    t2.whole.add("whole")
    whole = ReqContext("whole")
    m.on_new_request(whole)
    assert m.lookup(k(7), whole) is PENDING  # promotion from t1 queued
    assert m.prepare_store(ks(7), whole) is not None
    assert m.whole_requests()["whole"][1] == ks(7)
    m.on_schedule_end()  # the promotion lands, then the parked key goes to t2
    assert m.whole_requests()["whole"][1] == []
    assert t2.stores()[-1].keys == ks(7)
    m.on_schedule_end()
    assert m.primary.ref_count(k(7)) == 0


# -- tier filters and locality ---------------------------------------------------------------


def two_holders(
    locality: Locality | None = None,
) -> tuple[TieringOffloadingManager, list[WholeTier]]:
    """Block 0 in the CPU tier, block 1 only in t1."""
    m, tiers = stack(locality=locality)
    m.on_new_request(CTX)
    store(m, CTX, 1)
    m.on_schedule_end()
    m.reset_cache()
    store(m, CTX, 0)
    m.on_schedule_end()
    return m, tiers


class CountingLookups:
    def __init__(self, tier: SecondaryTierManager) -> None:
        self.calls = 0
        inner = tier.lookup

        def lookup(key: OffloadKey, ctx: ReqContext) -> bool | None:
            self.calls += 1
            return inner(key, ctx)

        tier.lookup = lookup  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "tier_filter",
    [
        TierFilter(matchers=(TierMatcher(medium=Medium.STORAGE),)),
        TierFilter(matchers=()),
        TierFilter.only(),
        TierFilter(matchers=(TierMatcher(locality=Locality.REMOTE),), tiers=None),
    ],
    ids=["non_matching_medium", "empty_no_load", "no_names", "remote_only"],
)
def test_filter_skips_tiers_it_excludes(tier_filter: TierFilter) -> None:
    m, (t1, _) = two_holders(Locality.LOCAL)
    counted = CountingLookups(t1)
    ctx = ReqContext("f", load_tier_filter=tier_filter)
    assert m.lookup(k(0), ctx) is HIT
    assert m.lookup(k(1), ctx) is MISS
    assert counted.calls == 0


@pytest.mark.parametrize(
    "tier_filter",
    [
        TierFilter.ALL,
        TierFilter(matchers=(TierMatcher(medium=Medium.CPU),)),
        TierFilter(matchers=(TierMatcher(),)),
        TierFilter.only("t1"),
        TierFilter(tiers=["t2", "t1"]),
        None,
    ],
    ids=["all", "explicit_cpu", "unconstrained", "by_name", "names_list", "none"],
)
def test_filter_allows_matching_tiers(tier_filter: TierFilter | None) -> None:
    m, (t1, _) = two_holders()
    counted = CountingLookups(t1)
    ctx = ReqContext("f", load_tier_filter=tier_filter)
    assert m.lookup(k(1), ctx) is PENDING
    assert counted.calls == 1


def test_filter_by_name_skips_the_other_tier() -> None:
    m, (t1, _) = two_holders()  # both tiers hold block 1 (cascades go to every tier)
    ctx = ReqContext("f", load_tier_filter=TierFilter.only("t2"))
    counted = CountingLookups(t1)
    assert m.lookup(k(1), ctx) is PENDING
    assert counted.calls == 0
    assert m.queued_promotions() == {"t2": 1}  # promoted from t2, not t1


def test_remote_locality_from_config_and_filter() -> None:
    m = build_manager(
        {
            "num_blocks": 8,
            "block_size_bytes": BLOCK,
            "tiers": [
                {"type": "example", "name": "near"},
                {"type": "example", "name": "far", "locality": "remote"},
            ],
        }
    )
    assert isinstance(m, TieringOffloadingManager)
    near, far = m.entries
    assert near.locality is None and far.locality is Locality.REMOTE
    assert near.tier.medium is Medium.CPU
    local_only = TierFilter(matchers=(TierMatcher(locality=Locality.LOCAL),))
    assert m.tiers_allowed(local_only) == [near.name]  # None (unknown) matches, REMOTE not
    m.shutdown()


@pytest.mark.parametrize(
    ("tier_filter", "message"),
    [
        (TierFilter.only("t1", "nowhere"), r"'nowhere'.*its tiers are: 't1', 't2'"),
        ("t1", "must be a kv_offload.TierFilter or None"),
    ],
)
def test_bad_filter_is_a_clear_error_and_changes_nothing(tier_filter: Any, message: str) -> None:
    m, _ = two_holders()
    stats = m.get_stats()
    ctx = ReqContext("f", load_tier_filter=tier_filter)
    with pytest.raises(InvalidArgumentError, match=message):
        m.lookup(k(1), ctx)
    with pytest.raises(InvalidArgumentError, match=message):
        m.lookup(k(0), ctx)  # a CPU hit too: the filter is checked first
    assert m.get_stats() == stats
    assert m.primary.ref_count(k(1)) is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"tiers": "t1"}, "tiers must be a collection of tier names"),
        ({"matchers": [TierMatcher()]}, "matchers must be a tuple of TierMatcher"),
        ({"matchers": ("cpu",)}, "matchers must be a tuple of TierMatcher"),
    ],
)
def test_bad_filter_construction(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        TierFilter(**arguments)


# -- reset_cache -----------------------------------------------------------------------------


def test_reset_cache_drops_queued_promotions_and_drains_jobs() -> None:
    m, (t1, _) = stack()
    m.on_new_request(CTX)
    store(m, CTX, 0, 1, 2)
    m.on_schedule_end()
    m.reset_cache()
    store(m, CTX, 3)  # a cascade in flight (results not polled yet)
    assert m.lookup(k(0), CTX) is PENDING  # a promotion queued, not yet submitted
    assert m.get_stats().promotions_queued == 1
    loads_before = len(t1.loads())
    m.reset_cache()
    assert len(t1.loads()) == loads_before  # the queued promotion was never submitted
    stats = m.get_stats()
    assert stats.jobs_in_flight == 0 and stats.promotions_queued == 0
    for key in ks(0, 3):
        assert m.primary.ref_count(key) is None
    m.on_schedule_end()  # nothing lands in the reset cache
    assert m.primary.get_stats().resident_blocks == 0
    assert m.lookup(k(0), CTX) is PENDING  # still in the tier: promoted anew
    m.on_schedule_end()
    assert m.lookup(k(0), CTX) is HIT


def test_reset_cache_waits_for_promotions_in_flight() -> None:
    m, (t1, _) = stack()
    m.on_new_request(CTX)
    store(m, CTX, 0)
    m.on_schedule_end()
    m.reset_cache()
    assert m.lookup(k(0), CTX) is PENDING
    m.on_request_finished(CTX)  # its promotions go out now; their results are not in yet
    assert m.get_stats().jobs_in_flight >= 1
    m.reset_cache()
    assert m.get_stats().jobs_in_flight == 0
    assert m.primary.ref_count(k(0)) is None  # landed before the reset, then emptied
    assert t1.lookup(k(0), CTX) is True


def test_reset_cache_keeps_request_state() -> None:
    m, (t1, _) = stack()
    t1.whole.add("whole")
    ctx = ReqContext("whole")
    m.on_new_request(ctx)
    m.reset_cache()
    assert "whole" in m.whole_requests()
    m.on_request_finished(ctx)
    assert m.whole_requests() == {}


# -- lookup answers and vLLM's LookupResult -------------------------------------------------


class Answering(SecondaryTierManager):
    """A tier answering ``lookup`` with ``answer``; promotions succeed with zero bytes."""

    def __init__(self, *args: Any, answer: bool | None = False) -> None:
        super().__init__(*args)
        self.answer = answer
        self.finished: list[Any] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return self.answer

    def submit_store(self, job: JobMetadata) -> None:
        from kv_offload.tiering import JobResult

        self.finished.append(JobResult(job.job_id, True))

    def submit_load(self, job: JobMetadata) -> None:
        from kv_offload.tiering import JobResult

        self.finished.append(JobResult(job.job_id, True))

    def get_finished(self) -> list[Any]:
        out, self.finished = self.finished, []
        return out


@pytest.mark.parametrize(
    ("answers", "expected", "promoted_from"),
    [
        ((False, False), MISS, None),  # vLLM MISS
        ((None, False), PENDING, None),  # vLLM RETRY: a tier said "ask again"
        ((None, True), PENDING, 1),  # a later tier holds it: promotion (vLLM HIT_PENDING)
        ((True, None), PENDING, 0),  # the first holder wins
        ((False, True), PENDING, 1),
    ],
)
def test_lookup_answers_follow_vllm(
    answers: tuple[bool | None, ...], expected: LookupResult, promoted_from: int | None
) -> None:
    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(4, BLOCK)
    tiers = [Answering(config, primary.kv_buffer.view, f"a{i}", answer=a) for i, a in
             enumerate(answers)]  # fmt: skip
    m = TieringOffloadingManager(primary, tiers)
    assert m.lookup(k(0), CTX) is expected
    queued = m.queued_promotions()
    assert queued == ({} if promoted_from is None else {f"a{promoted_from}": 1})
    m.on_schedule_end()
    if promoted_from is not None:
        assert m.lookup(k(0), CTX) is HIT  # vLLM HIT once the promotion landed
    m.shutdown()


def test_cpu_pending_store_is_pending() -> None:
    m, _ = stack()
    m.on_new_request(CTX)
    assert m.prepare_store(ks(0), CTX) is not None
    assert m.lookup(k(0), CTX) is PENDING  # vLLM HIT_PENDING
    m.complete_store(ks(0), CTX)
    assert m.lookup(k(0), CTX) is HIT
    assert JobDirection.STORE in {j.direction for j in m.tiers[0].jobs}  # type: ignore[attr-defined]
