"""Threads and the tiered manager: the same single-thread rule as the CPU manager.

Two threads driving one ``TieringOffloadingManager`` get :class:`ConcurrentUseError` (never a
raw error from the CPU tier, the job table or a tier), and the stack is consistent afterwards;
through :func:`kv_offload.synchronized` any number of threads may drive it; a hook that
calls the tiered manager's flow back from a tier event is refused, one reading its stats is
not. Tiers never call the manager: their threads see only the CPU buffer (the job table on
the scheduler's thread collects their results), so none of this involves a tier's threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import pytest
from _threads import retry
from _threads import run_threads as threading_run
from _tiers import key
from kv_offload import (
    ConcurrentUseError,
    CPUOffloadingManager,
    LookupResult,
    OffloadingManager,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    synchronized,
)
from kv_offload.errors import HookError, InvalidArgumentError, KeyStateError
from kv_offload.plugins import create_plugin_manager, hookimpl
from kv_offload.replay import replay
from kv_offload.tiering import OffloadingConfig
from kv_offload_example_tier import ExampleSecondaryTierManager

HIT, PENDING = LookupResult.HIT, LookupResult.PENDING
BLOCK = 64


def stack(num_blocks: int, plugins: tuple[object, ...] = ()) -> TieringOffloadingManager:
    pm = create_plugin_manager(autoload=False, plugins=plugins)
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK, plugin_manager=pm)
    assert primary.kv_buffer is not None
    tier = ExampleSecondaryTierManager(
        OffloadingConfig(num_blocks, BLOCK), primary.kv_buffer.view, "example", 10_000
    )
    return TieringOffloadingManager(primary, [tier], drain_timeout=10.0)


@dataclass
class Tally:
    lookups: Counter[str] = field(default_factory=Counter)
    stored: int = 0
    refused: int = 0
    unexpected: list[BaseException] = field(default_factory=list)


def drive(manager: OffloadingManager, name: str, requests: int, tally: Tally, base: int) -> None:
    """The engine's flow, one request per step; PENDING (a promotion) is waited for."""
    try:
        for i in range(requests):
            ctx = ReqContext(f"{name}-{i}")
            keys = [key(base + j % 24) for j in range(i % 5, i % 5 + 4)]
            retry(tally, manager.on_new_request, ctx)
            hits = 0
            for k in keys:
                result = retry(tally, manager.lookup, k, ctx)
                tally.lookups[result.name] += 1
                for _ in range(20):
                    if result is not PENDING:
                        break
                    retry(tally, manager.on_schedule_end)
                    result = retry(tally, manager.lookup, k, ctx)
                    tally.lookups[result.name] += 1
                if result is not HIT:
                    break
                hits += 1
            if hits:
                try:
                    retry(tally, manager.prepare_load, keys[:hits], ctx)
                except KeyStateError:  # evicted by the other thread since its lookup
                    pass
                else:
                    retry(tally, manager.complete_load, keys[:hits], ctx)
                    retry(tally, manager.touch, keys[:hits], ctx)
            if hits < len(keys):
                out = retry(tally, manager.prepare_store, keys[hits:], ctx)
                if out is not None and out.keys_to_store:
                    retry(tally, manager.complete_store, out.keys_to_store, ctx)
                    tally.stored += len(out.keys_to_store)
            retry(tally, manager.on_request_finished, ctx)
            retry(tally, manager.on_schedule_end)
    except BaseException as exc:
        tally.unexpected.append(exc)


def run_threads(
    manager: OffloadingManager, threads: int, requests: int, disjoint: bool
) -> list[Tally]:
    tallies = [Tally() for _ in range(threads)]
    return threading_run(drive, manager, tallies, requests, disjoint, timeout=120)


def assert_consistent(manager: TieringOffloadingManager, tallies: list[Tally]) -> None:
    for tally in tallies:
        assert not tally.unexpected, tally.unexpected
    manager.drain()
    stats = manager.get_stats()
    cpu, (tier,) = stats.cpu, stats.tiers
    lookups = sum((t.lookups for t in tallies), Counter())
    assert cpu.lookups == sum(lookups.values())
    assert cpu.pinned_blocks == cpu.pending_blocks == 0
    assert stats.jobs_in_flight == stats.promotions_queued == 0
    engine_stored = sum(t.stored for t in tallies)
    assert tier.cascaded_blocks == engine_stored and tier.failed_cascades == 0
    assert cpu.stored_blocks == engine_stored + tier.promoted_blocks
    assert cpu.resident_blocks + cpu.free_blocks == cpu.capacity
    for n in range(4):
        for i in range(24):
            assert manager.primary.ref_count(key(100 * n + i)) in (None, 0)


def test_two_threads_are_refused_not_corrupted(fast_switching: None) -> None:
    manager = stack(8)
    tallies = run_threads(manager, threads=2, requests=1500, disjoint=False)
    assert_consistent(manager, tallies)
    assert sum(t.refused for t in tallies) > 0


def test_synchronized_threads_equal_the_sequential_model(fast_switching: None) -> None:
    """No eviction and disjoint keys: the order of the requests cannot change the outcome."""
    shared = synchronized(stack(128))
    tallies = run_threads(shared, threads=4, requests=300, disjoint=True)
    assert sum(t.refused for t in tallies) == 0
    assert isinstance(shared.wrapped, TieringOffloadingManager)
    assert_consistent(shared.wrapped, tallies)
    sequential = stack(128)
    for n in range(4):
        alone = Tally()
        drive(sequential, f"t{n}", 300, alone, 100 * n)
        assert not alone.unexpected
    sequential.drain()
    assert shared.get_stats() == sequential.get_stats()


def test_synchronized_threads_with_evictions_and_promotions(fast_switching: None) -> None:
    shared = synchronized(stack(6))
    tallies = run_threads(shared, threads=3, requests=400, disjoint=False)
    assert sum(t.refused for t in tallies) == 0
    assert isinstance(shared.wrapped, TieringOffloadingManager)
    assert_consistent(shared.wrapped, tallies)
    stats = shared.get_stats()
    assert stats.cpu.evictions > 0 and stats.tiers[0].promoted_blocks > 0
    shared.drain()  # forwarded under the lock
    shared.shutdown()


class CallsBackOnJob:
    """Calls its (tiered) manager back when a tier job is reported."""

    def __init__(self, call: Callable[[TieringOffloadingManager], object]) -> None:
        self.call = call
        self.seen: list[object] = []

    @hookimpl
    def kv_offload_tier_job_finished(self, manager: object) -> None:
        if isinstance(manager, TieringOffloadingManager):
            self.seen.append(self.call(manager))


def store_and_step(manager: TieringOffloadingManager) -> None:
    ctx = ReqContext("r")
    out = manager.prepare_store([key(1)], ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_schedule_end()  # collects the cascade: the hook fires here


def test_tier_event_hook_reading_stats_is_allowed() -> None:
    plugin = CallsBackOnJob(lambda m: m.get_stats().tiers[0].cascaded_blocks)
    manager = stack(4, (plugin,))
    store_and_step(manager)
    assert plugin.seen == [1]


@pytest.mark.parametrize(
    "method, call",
    [
        ("lookup", lambda m: m.lookup(key(9), ReqContext("x"))),
        ("prepare_store", lambda m: m.prepare_store([key(9)], ReqContext("x"))),
        ("drain", lambda m: m.drain()),
    ],
)
def test_tier_event_hook_calling_the_flow_back_is_refused(
    method: str, call: Callable[[TieringOffloadingManager], object]
) -> None:
    manager = stack(4, (CallsBackOnJob(call),))
    with pytest.raises(HookError) as info:
        store_and_step(manager)
    cause = info.value.__cause__
    assert isinstance(cause, ConcurrentUseError) and cause.reentrant
    assert cause.method == method and cause.manager == "TieringOffloadingManager"
    assert f"{method}() was called from hook kv_offload_tier_job_finished" in str(cause)
    assert "is running on the same thread" in str(cause)
    stats = manager.get_stats()
    assert stats.tiers[0].cascaded_blocks == 1 and stats.jobs_in_flight == 0
    assert stats.cpu.lookups == 0 and manager.primary.ref_count(key(9)) is None
    assert manager.primary.ref_count(key(1)) == 0  # the cascade's pin was released


@pytest.mark.parametrize(
    "method, call",
    [
        ("lookup", lambda m: m.primary.lookup(key(9), ReqContext("x"))),
        ("prepare_store", lambda m: m.primary.prepare_store([key(9)], ReqContext("x"))),
        ("pin", lambda m: m.primary.pin([key(1)], ReqContext("x"))),
    ],
)
def test_tier_event_hook_calling_the_cpu_tier_back_is_refused(
    method: str, call: Callable[[TieringOffloadingManager], object]
) -> None:
    """The CPU tier is handed over to the tiered manager, its only caller: a hook fired while
    the tiered manager acts may not change the CPU tier behind its back (a pin taken here
    would outlive the job table's bookkeeping), and the error names the owner."""
    manager = stack(4, (CallsBackOnJob(call),))
    assert manager.primary.owner is manager
    with pytest.raises(HookError) as info:
        store_and_step(manager)
    cause = info.value.__cause__
    assert isinstance(cause, ConcurrentUseError) and cause.reentrant
    assert cause.method == method and cause.manager == "CPUOffloadingManager"
    assert cause.owner == "TieringOffloadingManager"
    assert "handed over to a TieringOffloadingManager (from hook kv_offload_tier_job_finished" in (
        str(cause)
    )
    stats = manager.get_stats()
    assert stats.tiers[0].cascaded_blocks == 1 and stats.jobs_in_flight == 0
    assert stats.cpu.lookups == 0 and manager.primary.ref_count(key(9)) is None
    assert manager.primary.ref_count(key(1)) == 0  # only the cascade pinned it, and released
    assert manager.lookup(key(1), ReqContext("after")) is HIT  # the guard was given back


@pytest.mark.parametrize(
    "method, call",
    [
        ("lookup", lambda m: m.lookup(key(1), ReqContext("x"))),
        ("prepare_store", lambda m: m.prepare_store([key(9)], ReqContext("x"))),
        ("pin", lambda m: m.pin([key(1)], ReqContext("x"))),
        ("reset_cache", lambda m: m.reset_cache()),
        ("shutdown", lambda m: m.shutdown()),
    ],
)
def test_the_tiered_manager_is_the_cpu_tiers_only_caller(
    method: str, call: Callable[[CPUOffloadingManager], object]
) -> None:
    """By construction, not by convention: once a tiered manager is built over a CPU
    manager, the CPU manager's request flow refuses every other caller, between calls too,
    with nothing changed; its snapshot reads stay open."""
    manager = stack(4, ())
    store_and_step(manager)
    primary = manager.primary
    before = (primary.get_stats(), primary.ref_count(key(1)), primary.block_id(key(1)))
    with pytest.raises(ConcurrentUseError) as info:
        call(primary)
    error = info.value
    assert (error.method, error.owner, error.reentrant) == (
        method,
        "TieringOffloadingManager",
        False,
    )
    assert f"CPUOffloadingManager.{method}() was called on a CPUOffloadingManager " in str(error)
    assert "call the TieringOffloadingManager instead" in str(error)
    assert (primary.get_stats(), primary.ref_count(key(1)), primary.block_id(key(1))) == before
    assert manager.lookup(key(1), ReqContext("after")) is HIT


def test_a_cpu_tier_serves_one_tiered_manager() -> None:
    manager = stack(4, ())
    with pytest.raises(
        InvalidArgumentError, match="already handed over to a TieringOffloadingManager"
    ):
        TieringOffloadingManager(manager.primary, manager.tiers)
    assert manager.primary.owner is manager


def test_second_thread_on_the_tiered_manager_is_refused() -> None:
    inside, release = threading.Event(), threading.Event()

    class Blocker:
        @hookimpl
        def kv_offload_tier_job_finished(self) -> None:
            inside.set()
            assert release.wait(10)

    manager = stack(4, (Blocker(),))
    ctx = ReqContext("r")
    out = manager.prepare_store([key(1)], ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    worker = threading.Thread(target=manager.on_schedule_end)
    worker.start()
    assert inside.wait(10)
    try:
        for call in (lambda: manager.lookup(key(1), ctx), manager.reset_cache, manager.drain):
            with pytest.raises(ConcurrentUseError, match="another thread") as info:
                call()
            assert "kv_offload.synchronized(manager)" in str(info.value)
        assert manager.get_stats().cpu.lookups == 0  # the refused lookup counted nothing
        assert manager.has_pending_work() is False
    finally:
        release.set()
        worker.join(10)
    assert manager.lookup(key(1), ctx) is HIT


def test_tier_threads_never_call_the_manager(tmp_path: Path) -> None:
    """A replay through the fs tier (real I/O threads): every call into a manager method comes
    from the driving thread. ``threading.setprofile`` watches every thread started after it."""
    codes = set()
    for cls in (CPUOffloadingManager, TieringOffloadingManager):
        for value in vars(cls).values():
            function = getattr(value, "__wrapped__", value)
            if hasattr(function, "__code__"):
                codes.add(function.__code__)
    driver = threading.current_thread()
    foreign: list[str] = []
    seen_threads: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            seen_threads.add(threading.current_thread().name)
            if frame.f_code in codes and threading.current_thread() is not driver:
                foreign.append(f"{threading.current_thread().name}: {frame.f_code.co_name}")

    threading.setprofile(profile)
    try:
        manager = build_manager(
            {
                "num_blocks": 32,
                "block_size_bytes": 256,
                "tiers": [{"type": "fs", "root_dir": str(tmp_path), "capacity_blocks": 500}],
            }
        )
        # Two passes over 120 keys through 32 CPU slots: the second pass promotes.
        windows = [[key(j) for j in range(i, i + 6)] for i in range(0, 120, 6)] * 2
        requests = [(ReqContext(f"r{i}"), keys) for i, keys in enumerate(windows)]
        results = []
        for request in requests:  # each step's cascades land before the next: room to evict
            results.append(replay(manager, [request], data_plane=True))
            manager.drain()
        tier = manager.get_stats().tiers[0]
        manager.shutdown()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    assert sum(r.corrupted_blocks for r in results) == 0
    assert tier.cascaded_blocks > 0 and tier.promoted_blocks > 0  # both directions ran
    assert seen_threads - {driver.name}, "the fs tier's I/O threads did not run"
    assert foreign == []
