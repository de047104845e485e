"""The reuse filter (``store_threshold``, ``max_tracker_size``): vLLM 0.33's scenarios
(``test_filter_reused_manager`` and its stats test, with 0.33's rule that a ``prepare_store``
call is the offer), our edge cases, and the filter in a tiered stack.

With tiers the filter is allowed (vLLM refuses the combination): a skipped block is not in
the CPU tier, so nothing cascades it; a block the filter admitted cascades as usual; a
promotion from a secondary tier is not an offer and is never filtered (the block was
admitted when first stored), so a block evicted from the CPU tier and found in a tier comes
back even after the tracker forgot it.
"""

from __future__ import annotations

import pytest
from _cpu_helpers import CTX, HIT, MISS, PENDING, assert_raises_intact, k
from kv_offload import ConfigError, CPUOffloadingManager, TieringOffloadingManager, build_manager
from kv_offload.admission import StoreThreshold
from kv_offload.errors import InvalidArgumentError
from kv_offload.plugins import hookimpl


def ks(*ids: int) -> list[bytes]:
    return [k(i) for i in ids]


def offer(m: CPUOffloadingManager, *ids: int) -> list[bytes]:
    out = m.prepare_store(ks(*ids), CTX)
    assert out is not None
    return out.keys_to_store


def tracked(m: CPUOffloadingManager) -> dict[bytes, int]:
    assert m.admission is not None
    return dict(m.admission.counts)


# -- vLLM's scenarios -------------------------------------------------------------------------


def test_filter_reused_manager() -> None:
    """vLLM's test_filter_reused_manager: threshold 2, a tracker of 3 keys."""
    m = CPUOffloadingManager(4, enable_events=True, store_threshold=2, max_tracker_size=3)
    assert offer(m, 1, 2) == []  # first offer of each: filtered
    assert offer(m, 1) == ks(1)  # second offer of 1: stored
    assert m.lookup(k(1), CTX) is PENDING and m.lookup(k(2), CTX) is MISS
    assert offer(m, 3, 4) == []  # the tracker is full: 2, the least recently offered, goes
    assert set(tracked(m)) == set(ks(1, 3, 4))
    assert offer(m, 2) == []  # back with a count of 1: filtered again
    assert tracked(m)[k(2)] == 1
    m.complete_store(ks(1), CTX)
    assert m.get_stats().stores_skipped == 5
    assert [e.keys for e in m.take_events()] == [ks(1)]


def test_filter_reports_stores_skipped_counter() -> None:
    """vLLM's stats test. vLLM's counter is a per-``get_stats`` delta; ours is cumulative
    like every other counter (Prometheus takes rates of it)."""
    m = CPUOffloadingManager(4, store_threshold=2)
    assert offer(m, 1, 2, 3) == []
    assert m.get_stats().stores_skipped == 3
    assert m.get_stats().stores_skipped == 3
    assert m.get_stats().stored_blocks == 0 and m.num_free_blocks == 4


# -- our cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [0, 1])
def test_below_two_the_filter_is_off(threshold: int) -> None:
    m = CPUOffloadingManager(4, store_threshold=threshold)
    assert m.admission is None
    assert offer(m, 1, 2) == ks(1, 2)
    assert m.get_stats().stores_skipped == 0


def test_threshold_three_stores_on_the_third_offer() -> None:
    m = CPUOffloadingManager(4, store_threshold=3)
    assert offer(m, 1) == [] and offer(m, 1) == [] and offer(m, 1) == ks(1)
    assert m.get_stats().stores_skipped == 2


def test_offers_of_resident_keys_count_and_keep_them_tracked() -> None:
    """An offer of a stored or pending key counts and refreshes its place in the tracker."""
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=2)
    offer(m, 1)
    assert offer(m, 1) == ks(1)  # pending now
    assert offer(m, 1, 2) == []  # 1 is pending (not a candidate); 2 filtered
    assert tracked(m) == {k(1): 3, k(2): 1}
    m.complete_store(ks(1), CTX)
    assert offer(m, 1) == []  # stored: nothing to do, but counted and now most recent
    assert offer(m, 3) == []  # the tracker drops 2, not 1
    assert tracked(m) == {k(1): 4, k(3): 1}
    assert m.get_stats().stores_skipped == 3  # 1 (first offer), 2, 3


def test_keys_of_the_current_call_are_never_dropped() -> None:
    """A call larger than the tracker counts what fits and never drops its own keys."""
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=2)
    assert offer(m, 1, 2, 3) == []
    assert tracked(m) == {k(1): 1, k(2): 1}  # 3 found no room
    assert offer(m, 1, 2, 3) == ks(1, 2)  # 3 still uncounted: never stored by such calls
    assert tracked(m) == {k(1): 2, k(2): 2}
    assert offer(m, 4) == []  # a smaller call can drop the oldest
    assert set(tracked(m)) == {k(2), k(4)}


def test_an_offer_counts_even_when_there_is_no_room() -> None:
    m = CPUOffloadingManager(2, store_threshold=2)
    offer(m, 1, 2)
    m.complete_store(offer(m, 1, 2), CTX)
    m.prepare_load(ks(1, 2), CTX)  # nothing evictable
    assert offer(m, 3) == []  # first offer: filtered (no allocation asked for)
    assert m.prepare_store(ks(3), CTX) is None  # second: admitted, but no room
    assert m.get_stats().rejected_stores == 1
    m.complete_load(ks(1, 2), CTX)
    assert offer(m, 3) == ks(3)


def test_reset_cache_keeps_the_offer_counts_and_restarts_stores_skipped() -> None:
    m = CPUOffloadingManager(4, store_threshold=2)
    assert offer(m, 1) == []
    m.reset_cache()
    assert m.get_stats().stores_skipped == 0
    assert offer(m, 1) == ks(1)  # the offer before the reset still counts (as in vLLM)


def test_a_store_the_engine_did_not_offer_is_stored_at_once_and_counts_nothing() -> None:
    """An owner's ``reserve`` (a tiered manager's promotion: the block was admitted when the
    engine first stored it) does not ask the reuse filter."""
    m = CPUOffloadingManager(4, store_threshold=2)
    out = m.hand_over(object()).reserve(ks(1), CTX)
    assert out is not None and out.keys_to_store == ks(1)
    assert tracked(m) == {} and m.get_stats().stores_skipped == 0


def test_admission_hook_sees_only_the_keys_the_filter_passed() -> None:
    seen: list[list[bytes]] = []

    class Recorder:
        @hookimpl
        def kv_offload_store_admission(self, keys: list[bytes]) -> None:
            seen.append(list(keys))

    m = CPUOffloadingManager(4, store_threshold=2)
    recorder = Recorder()
    m.plugin_manager.register(recorder)  # the process-wide plugin manager: undone below
    try:
        offer(m, 1, 2)
        assert offer(m, 1, 3) == ks(1)
        assert seen == [ks(1)]  # the all-filtered first call never reached the hook
    finally:
        m.plugin_manager.unregister(recorder)
        m.shutdown()


def test_tracker_alone_matches_a_reference_lru_model() -> None:
    """The tracker against a plain-dict model over a pseudo-random offer stream."""
    import random

    rng = random.Random(5)
    size = 7
    tracker = StoreThreshold(threshold=2, max_tracker_size=size)
    model: dict[int, int] = {}  # insertion order = recency
    for _ in range(2000):
        call = rng.sample(range(20), rng.randint(1, 9))
        keys = ks(*call)
        admitted = [key for key, yes in zip(keys, tracker.admit(keys, CTX)) if yes]
        mine = [i for i in call if i in model]
        for i in mine:
            model[i] = model.pop(i) + 1
        for i in call:
            if i in model:
                continue
            if len(model) >= size:
                old = next((j for j in model if j not in call), None)
                if old is None:
                    continue
                del model[old]
            model[i] = 1
        assert {bytes(key): n for key, n in tracker.counts.items()} == {
            k(i): n for i, n in model.items()
        }
        assert list(tracker.counts) == ks(*model)
        assert admitted == [key for key, i in zip(keys, call) if model.get(i, 0) >= 2]
        assert len(tracker) <= size


# -- bad values and state intact --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"store_threshold": -1}, "store_threshold must be >= 0"),
        ({"store_threshold": "2"}, "'2'"),
        ({"store_threshold": 2.0}, "2.0"),
        ({"store_threshold": True}, "True"),
        ({"store_threshold": None}, "None"),
        ({"max_tracker_size": 0}, "max_tracker_size must be > 0"),
        ({"max_tracker_size": -5}, "-5"),
        ({"max_tracker_size": "64000"}, "'64000'"),
        ({"max_tracker_size": 1.5, "store_threshold": 2}, "1.5"),
    ],
)
def test_bad_filter_arguments_are_config_errors(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as raised:
        CPUOffloadingManager(4, **kwargs)  # type: ignore[arg-type]
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"store_threshold": -2}, "store_threshold"),
        ({"store_threshold": "often"}, "store_threshold"),
        ({"max_tracker_size": 0}, "max_tracker_size"),
        ({"max_tracker_size": False}, "max_tracker_size"),
    ],
)
def test_bad_filter_config_names_the_key(config: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_manager({"num_blocks": 4, **config})
    assert raised.value.key == key or key in str(raised.value)


def test_bad_calls_leave_the_offer_counts_intact() -> None:
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=4)
    offer(m, 1, 2)
    m.complete_store(offer(m, 1), CTX)
    before = tracked(m)
    bad_calls = [
        (lambda: m.prepare_store(ks(3, 3), CTX), "more than once"),
        (lambda: m.prepare_store([k(3), [1]], CTX), "[1]"),  # type: ignore[list-item]
        (lambda: m.prepare_store(ks(3), None), "None"),  # type: ignore[arg-type]
        (lambda: m.prepare_store(ks(3), CTX, protected=5), "5"),  # type: ignore[arg-type]
    ]
    for call, fragment in bad_calls:
        assert_raises_intact(m, InvalidArgumentError, call, fragment)
        assert tracked(m) == before


# -- the filter in a tiered stack -------------------------------------------------------------


def tiered(**extra: object) -> TieringOffloadingManager:
    manager = build_manager(
        {
            "num_blocks": 2,
            "block_size_bytes": 64,
            "tiers": [{"type": "example", "capacity_blocks": 64}],
            "hooks": {"autoload": False},
            **extra,
        }
    )
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def engine_store(m: TieringOffloadingManager, *ids: int) -> list[bytes]:
    """One step: offer, write the admitted blocks, complete, end the step."""
    out = m.prepare_store(ks(*ids), CTX)
    assert out is not None
    if out.keys_to_store:
        m.kv_buffer.write_blocks(out.store_spec.block_ids, bytes(64 * len(out.keys_to_store)))
        m.complete_store(out.keys_to_store, CTX)
    m.on_schedule_end()
    return out.keys_to_store


def test_skipped_blocks_do_not_cascade_admitted_ones_do() -> None:
    m = tiered(store_threshold=2, max_tracker_size=2)
    try:
        assert engine_store(m, 1) == []
        stats = m.get_stats()
        assert stats.cpu.stores_skipped == 1 and stats.tiers[0].cascaded_blocks == 0
        assert m.tiers[0].lookup(k(1), CTX) is False  # nothing reached the tier
        assert engine_store(m, 1) == ks(1)
        assert m.get_stats().tiers[0].cascaded_blocks == 1
        assert m.tiers[0].lookup(k(1), CTX) is True
    finally:
        m.shutdown()


def test_promotion_is_not_filtered_even_after_the_tracker_forgot_the_key() -> None:
    m = tiered(store_threshold=2, max_tracker_size=2)
    try:
        engine_store(m, 1)
        engine_store(m, 1)  # in the CPU tier and cascaded
        for i in (2, 3):  # two more blocks, each offered twice: key 1 is evicted from the
            engine_store(m, i)  # CPU tier and forgotten by the tracker
            engine_store(m, i)
        assert m.primary.ref_count(k(1)) is None  # not in the CPU tier
        assert k(1) not in tracked(m.primary)
        assert m.lookup(k(1), CTX) is PENDING  # found in the tier: promoted, not filtered
        m.on_schedule_end()
        assert m.lookup(k(1), CTX) is HIT
        assert k(1) not in tracked(m.primary)  # a promotion is not an offer
        assert m.get_stats().tiers[0].refused_promotions == 0
    finally:
        m.shutdown()
