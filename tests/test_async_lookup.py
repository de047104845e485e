"""AsyncLookup: scenarios of vLLM's async-lookup tests on our API, our edge cases, and a tier
using it behind the real tiered manager (``None`` -> ``PENDING`` -> ``HIT``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

import numpy as np
import pytest
from _tiers import block_bytes, expected_rows, key
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.tiering import AsyncLookup, OffloadingConfig
from kv_offload_example_tier import ExampleSecondaryTierManager

BLOCK = 64


class SetResolver:
    """Answers from a set; records every batch it was asked, on the helper's thread."""

    def __init__(self, present: Collection[OffloadKey] = ()) -> None:
        self.present = set(present)
        self.batches: list[list[OffloadKey]] = []
        self.threads: set[str] = set()

    def __call__(self, keys: list[OffloadKey]) -> list[bool]:
        self.batches.append(list(keys))
        self.threads.add(threading.current_thread().name)
        return [k in self.present for k in keys]


def ctx(req_id: str = "r1") -> ReqContext:
    return ReqContext(req_id=req_id)


@pytest.fixture
def make_helper():
    made: list[AsyncLookup] = []

    def make(resolver, **kwargs) -> AsyncLookup:
        helper = AsyncLookup(resolver, name="test", **kwargs)
        made.append(helper)
        return helper

    yield make
    for helper in made:
        helper.shutdown()


def settle(helper: AsyncLookup) -> None:
    helper.flush()
    assert helper.wait(5.0)


def test_new_key_asks_again_until_flushed(make_helper) -> None:
    resolver = SetResolver({key(1)})
    helper = make_helper(resolver)
    assert helper.lookup(key(1), ctx()) is None
    assert helper.lookup(key(1), ctx()) is None  # still not flushed
    assert resolver.batches == []
    settle(helper)
    assert helper.lookup(key(1), ctx()) is True


def test_absent_key_answers_false(make_helper) -> None:
    helper = make_helper(SetResolver())
    assert helper.lookup(key(1), ctx()) is None
    settle(helper)
    assert helper.lookup(key(1), ctx()) is False


def test_one_batch_per_step_without_duplicates_on_the_helper_thread(make_helper) -> None:
    resolver = SetResolver({key(1), key(3)})
    helper = make_helper(resolver)
    for i in (1, 2, 3, 4, 1, 2):
        assert helper.lookup(key(i), ctx()) is None
    settle(helper)
    assert resolver.batches == [[key(1), key(2), key(3), key(4)]]
    assert resolver.threads == {"kv-offload-lookup-test"}
    assert [helper.lookup(key(i), ctx()) for i in (1, 2, 3, 4)] == [True, False, True, False]
    assert helper.stats.batches == 1 and helper.stats.resolved_keys == 4


def test_key_in_flight_is_not_asked_twice(make_helper) -> None:
    gate = threading.Event()

    def slow(keys: list[OffloadKey]) -> list[bool]:
        gate.wait(5.0)
        return [True] * len(keys)

    helper = make_helper(slow)
    helper.lookup(key(1), ctx())
    helper.flush()
    assert helper.lookup(key(1), ctx()) is None  # in flight: not registered again
    helper.flush()  # nothing new: no second batch
    gate.set()
    assert helper.wait(5.0)
    assert helper.stats.batches == 1
    assert helper.lookup(key(1), ctx()) is True


def test_flush_with_nothing_registered_sends_nothing(make_helper) -> None:
    resolver = SetResolver()
    helper = make_helper(resolver)
    helper.flush()
    assert helper.wait(1.0)
    assert resolver.batches == [] and helper.stats.batches == 0


def test_results_across_several_steps(make_helper) -> None:
    resolver = SetResolver({key(1), key(2), key(3)})
    helper = make_helper(resolver)
    helper.lookup(key(1), ctx())
    settle(helper)
    helper.lookup(key(2), ctx())
    helper.lookup(key(3), ctx())
    settle(helper)
    assert resolver.batches == [[key(1)], [key(2), key(3)]]
    assert all(helper.lookup(key(i), ctx()) is True for i in (1, 2, 3))


def test_release_drops_results_only_when_no_running_request_asked(make_helper) -> None:
    resolver = SetResolver({key(1)})
    helper = make_helper(resolver)
    helper.lookup(key(1), ctx("a"))
    helper.lookup(key(1), ctx("b"))
    settle(helper)
    helper.release("a")
    assert helper.lookup(key(1), ctx("b")) is True  # b still running: kept
    helper.release("nobody")  # unknown request: nothing changes
    assert len(helper) == 1
    helper.release("b")
    assert len(helper) == 0
    # The next request asks the store again: a block stored meanwhile by another engine
    # (or evicted by the server) is seen.
    resolver.present.clear()
    assert helper.lookup(key(1), ctx("c")) is None
    settle(helper)
    assert helper.lookup(key(1), ctx("c")) is False


def test_result_cache_is_bounded(make_helper) -> None:
    helper = make_helper(SetResolver({key(i) for i in range(10)}), max_results=4)
    for i in range(10):
        helper.lookup(key(i), ctx())
    settle(helper)
    assert len(helper) == 4 and helper.stats.dropped == 6
    assert [helper.lookup(key(i), ctx()) for i in range(6, 10)] == [True] * 4
    assert helper.lookup(key(0), ctx()) is None  # dropped: asked again


def test_record_overtakes_a_check_in_flight(make_helper) -> None:
    gate = threading.Event()

    def stale(keys: list[OffloadKey]) -> list[bool]:
        gate.wait(5.0)
        return [False] * len(keys)  # answered before the store landed

    helper = make_helper(stale)
    helper.lookup(key(1), ctx())
    helper.flush()
    helper.record(key(1), True)  # the tier's own store completed meanwhile
    gate.set()
    assert helper.wait(5.0)
    assert helper.lookup(key(1), ctx()) is True
    helper.forget(key(1))
    assert helper.lookup(key(1), ctx()) is None


@pytest.mark.parametrize(
    "resolver",
    [
        pytest.param(lambda keys: (_ for _ in ()).throw(ConnectionError("down")), id="raises"),
        pytest.param(lambda keys: [True], id="too-few-answers"),
    ],
)
def test_resolver_errors_are_reported_not_raised(make_helper, resolver, caplog) -> None:
    seen: list[tuple[str, int]] = []
    helper = make_helper(
        resolver, on_error=lambda exc, keys: seen.append((type(exc).__name__, len(keys)))
    )
    with caplog.at_level(logging.WARNING, logger="kv_offload.async_lookup"):
        helper.lookup(key(1), ctx())
        helper.lookup(key(2), ctx())
        settle(helper)
    # The keys answer "miss" (the engine recomputes instead of waiting forever).
    assert helper.lookup(key(1), ctx()) is False and helper.lookup(key(2), ctx()) is False
    assert helper.stats.errors == 1 and helper.last_error is not None
    assert seen and seen[0][1] == 2
    assert "existence check of 2 key(s) failed" in caplog.text


def test_shutdown_stops_the_thread_and_later_lookups_miss() -> None:
    helper = AsyncLookup(SetResolver({key(1)}), name="stopped-by-shutdown")
    running = {t.name for t in threading.enumerate()}
    assert "kv-offload-lookup-stopped-by-shutdown" in running
    helper.shutdown()
    assert "kv-offload-lookup-stopped-by-shutdown" not in {t.name for t in threading.enumerate()}
    assert helper.lookup(key(1), ctx()) is False
    helper.shutdown()  # idempotent


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_max_results(bad) -> None:
    with pytest.raises(ConfigError, match="max_results"):
        AsyncLookup(SetResolver(), max_results=bad)


# -- behind the tiered manager -------------------------------------------------------------


class AskingTier(ExampleSecondaryTierManager):
    """The example tier, but answering lookups only through an AsyncLookup."""

    def __init__(self, config: OffloadingConfig, view: memoryview, tier_type: str) -> None:
        super().__init__(config, view, tier_type)
        self.present: set[OffloadKey] = set()
        self.helper = AsyncLookup(lambda keys: [k in self.present for k in keys], name=tier_type)
        self.events: list[str] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return self.helper.lookup(key, req_context)

    def on_schedule_end(self) -> None:
        self.events.append("schedule_end")
        self.helper.flush()

    def submit_load(self, job) -> None:  # type: ignore[no-untyped-def]
        self.events.append("submit_load")
        super().submit_load(job)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.helper.release(req_context.req_id)

    def shutdown(self) -> None:
        self.helper.shutdown()
        super().shutdown()


def test_ask_again_is_pending_then_promoted_with_identical_bytes() -> None:
    primary = CPUOffloadingManager(8, block_size_bytes=BLOCK)
    tier = AskingTier(OffloadingConfig(8, BLOCK), primary.kv_buffer.view, "asking")
    manager = TieringOffloadingManager(primary, [tier])
    keys = [key(i) for i in range(3)]
    # The blocks exist in the tier (stored by "another engine").
    for k in keys:
        tier._rows[k] = np.frombuffer(block_bytes(k, BLOCK), np.uint8).copy()
        tier.present.add(k)
    c = ctx("r")
    assert [manager.lookup(k, c) for k in keys] == [LookupResult.PENDING] * 3
    manager.on_schedule_end()  # flushes the checks (nothing to promote yet)
    assert tier.helper.wait(5.0)
    assert [manager.lookup(k, c) for k in keys] == [LookupResult.PENDING] * 3  # promotions
    manager.on_schedule_end()
    assert tier.events == ["schedule_end", "schedule_end", "submit_load"]
    assert [manager.lookup(k, c) for k in keys] == [LookupResult.HIT] * 3
    spec = manager.prepare_load(keys, c)
    assert np.array_equal(manager.kv_buffer.read_blocks(spec.block_ids), expected_rows(keys, BLOCK))
    manager.complete_load(keys, c)
    manager.on_request_finished(c)
    assert len(tier.helper) == 0
    # A key nobody holds: PENDING while asked, then MISS.
    other = ctx("s")
    assert manager.lookup(key(99), other) is LookupResult.PENDING
    manager.on_schedule_end()
    assert tier.helper.wait(5.0)
    assert manager.lookup(key(99), other) is LookupResult.MISS
    manager.shutdown()


def test_a_raising_resolver_behind_the_manager_ends_in_miss_not_an_exception() -> None:
    primary = CPUOffloadingManager(8, block_size_bytes=BLOCK)
    tier = AskingTier(OffloadingConfig(8, BLOCK), primary.kv_buffer.view, "asking")

    def broken(keys: list[OffloadKey]) -> list[bool]:
        raise OSError("store unreachable")

    tier.helper.shutdown()
    tier.helper = AsyncLookup(broken, name="asking")
    manager = TieringOffloadingManager(primary, [tier])
    c = ctx("r")
    assert manager.lookup(key(1), c) is LookupResult.PENDING
    manager.on_schedule_end()
    assert tier.helper.wait(5.0)
    assert manager.lookup(key(1), c) is LookupResult.MISS
    assert tier.helper.stats.errors == 1
    manager.shutdown()
