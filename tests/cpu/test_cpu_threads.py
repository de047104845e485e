"""Threads and the CPU manager: concurrent entry is detected, ``synchronized`` serialises.

The manager is single-threaded (docs: README "Threads"): a second thread entering while a
call runs gets :class:`ConcurrentUseError` before anything changed, never a raw ``KeyError``
from the policy; so does a hook plugin calling a request-flow method back (re-entry), while
``get_stats()`` and the other snapshot reads stay open to hooks and other threads. These
tests use real threads; a tiny switch interval makes the interpreter switch threads inside
manager calls all the time.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from _cpu_helpers import CTX, HIT, UNIVERSE, k, state_of, store
from _threads import retry
from _threads import run_threads as threading_run
from kv_offload import (
    ConcurrentUseError,
    CPUOffloadingManager,
    KVOffloadError,
    OffloadingManager,
    ReqContext,
    SynchronizedManager,
    synchronized,
)
from kv_offload.errors import HookError, KeyStateError
from kv_offload.plugins import create_plugin_manager, hookimpl


@dataclass
class Tally:
    """What one driver thread saw succeed (plus the refusals it retried)."""

    lookups: Counter[str] = field(default_factory=Counter)
    loaded: int = 0
    stored: int = 0
    rejected: int = 0
    refused: int = 0
    load_races: int = 0
    unexpected: list[BaseException] = field(default_factory=list)


def drive(
    manager: OffloadingManager, name: str, requests: int, tally: Tally, base: int = 0
) -> None:
    """The engine's request flow, ``requests`` times, on keys ``base`` to ``base + 31``
    (shared with the other threads unless they use another ``base``)."""
    try:
        for i in range(requests):
            ctx = ReqContext(f"{name}-{i}")
            keys = [k(base + j % 32) for j in range(i % 7, i % 7 + 4)]
            retry(tally, manager.on_new_request, ctx)
            hits = 0
            for key in keys:
                result = retry(tally, manager.lookup, key, ctx)
                tally.lookups[result.name] += 1
                if result is not HIT:
                    break
                hits += 1
            if hits:
                try:
                    retry(tally, manager.prepare_load, keys[:hits], ctx)
                except KeyStateError:  # another thread evicted a HIT since: legitimate
                    tally.load_races += 1
                else:
                    retry(tally, manager.complete_load, keys[:hits], ctx)
                    tally.loaded += hits
                    retry(tally, manager.touch, keys[:hits], ctx)
            if hits < len(keys):
                out = retry(tally, manager.prepare_store, keys[hits:], ctx)
                if out is None:
                    tally.rejected += 1
                elif out.keys_to_store:
                    retry(tally, manager.complete_store, out.keys_to_store, ctx)
                    tally.stored += len(out.keys_to_store)
            retry(tally, manager.on_request_finished, ctx)
    except BaseException as exc:
        tally.unexpected.append(exc)


def run_threads(
    manager: OffloadingManager, threads: int, requests: int, disjoint: bool = False
) -> list[Tally]:
    tallies = [Tally() for _ in range(threads)]
    return threading_run(drive, manager, tallies, requests, disjoint, timeout=60)


def assert_consistent(manager: CPUOffloadingManager, tallies: list[Tally]) -> None:
    """The counters are the sum of what the threads saw succeed; no pin or pending store is
    left over; every slot is either free or holds a resident block."""
    for tally in tallies:
        assert not tally.unexpected, tally.unexpected
    stats = manager.get_stats()
    lookups = sum((t.lookups for t in tallies), Counter())
    assert stats.hits == lookups["HIT"]
    assert stats.misses == lookups["MISS"]
    assert stats.pending == lookups["PENDING"]  # another thread's store in flight
    assert stats.loaded_blocks == sum(t.loaded for t in tallies)
    assert stats.stored_blocks == sum(t.stored for t in tallies)
    assert stats.rejected_stores == sum(t.rejected for t in tallies)
    assert stats.pinned_blocks == stats.pending_blocks == 0
    assert stats.resident_blocks + stats.free_blocks == stats.capacity
    assert stats.stored_blocks - stats.evictions == stats.resident_blocks
    for key in [*UNIVERSE, *(k(100 * n + i) for n in range(1, 4) for i in range(32))]:
        assert manager.ref_count(key) in (None, 0)


def test_two_threads_are_refused_not_corrupted(policy: str, fast_switching: None) -> None:
    manager = CPUOffloadingManager(8, cache_policy=policy)
    tallies = run_threads(manager, threads=2, requests=3000)
    assert_consistent(manager, tallies)
    assert sum(t.refused for t in tallies) > 0  # the threads did collide, and were told


def test_synchronized_threads_equal_the_sequential_model(policy: str) -> None:
    """Big enough that nothing is evicted: each request's outcome does not depend on the
    order, so N threads through the wrapper must end where one thread running the same
    requests ends."""
    shared = synchronized(CPUOffloadingManager(128, cache_policy=policy))
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        tallies = run_threads(shared, threads=4, requests=500, disjoint=True)
    finally:
        sys.setswitchinterval(before)
    assert sum(t.refused for t in tallies) == 0
    sequential = CPUOffloadingManager(128, cache_policy=policy)
    for n in range(4):
        alone = Tally()
        drive(sequential, f"t{n}", 500, alone, 100 * n)
        assert not alone.unexpected
    assert isinstance(shared.wrapped, CPUOffloadingManager)
    assert shared.get_stats() == sequential.get_stats()
    assert_consistent(shared.wrapped, tallies)


def test_synchronized_threads_stay_consistent_under_eviction(
    policy: str, fast_switching: None
) -> None:
    shared = synchronized(CPUOffloadingManager(6, cache_policy=policy))
    tallies = run_threads(shared, threads=4, requests=800)
    assert sum(t.refused for t in tallies) == 0
    assert isinstance(shared.wrapped, CPUOffloadingManager)
    assert_consistent(shared.wrapped, tallies)
    assert shared.get_stats().evictions > 0


class Blocker:
    """A hook plugin that parks the thread firing ``blocks_stored`` until released, so the
    manager call is held open at a known point."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    @hookimpl
    def kv_offload_blocks_stored(self) -> None:
        self.inside.set()
        assert self.release.wait(10)


def test_second_thread_is_refused_with_state_intact(policy: str) -> None:
    blocker = Blocker()
    pm = create_plugin_manager(autoload=False, plugins=[blocker])
    manager = CPUOffloadingManager(4, cache_policy=policy, plugin_manager=pm)
    out = manager.prepare_store([k(1), k(2)], CTX)
    assert out is not None
    worker = threading.Thread(target=manager.complete_store, args=(out.keys_to_store, CTX))
    worker.start()
    assert blocker.inside.wait(10)
    try:
        before = state_of(manager)
        calls: list[tuple[str, Callable[[], object]]] = [
            ("lookup", lambda: manager.lookup(k(1), CTX)),
            ("prepare_store", lambda: manager.prepare_store([k(3)], CTX)),
            ("prepare_load", lambda: manager.prepare_load([k(1)], CTX)),
            ("touch", lambda: manager.touch([k(1)], CTX)),
            ("on_new_request", lambda: manager.on_new_request(CTX)),
            ("reset_cache", manager.reset_cache),
            ("take_events", manager.take_events),
        ]
        for method, call in calls:
            with pytest.raises(ConcurrentUseError) as info:
                call()
            error = info.value
            assert (error.method, error.manager, error.reentrant) == (
                method,
                "CPUOffloadingManager",
                False,
            )
            message = str(error)
            assert f"CPUOffloadingManager.{method}()" in message
            assert "another thread" in message
            assert "drive one manager from one thread" in message
            assert "kv_offload.synchronized(manager)" in message
            assert state_of(manager) == before
        # Snapshot reads stay open to other threads (a metrics scrape).
        assert manager.get_stats().stored_blocks == 2
        assert manager.ref_count(k(1)) == 0
    finally:
        blocker.release.set()
        worker.join(10)
    assert manager.lookup(k(1), CTX) is HIT  # the guard was given back


class CallsBack:
    """A hook plugin that calls its manager back from ``blocks_stored``."""

    def __init__(self, call: Callable[[CPUOffloadingManager], object]) -> None:
        self.call = call
        self.seen: list[object] = []

    @hookimpl
    def kv_offload_blocks_stored(self, manager: CPUOffloadingManager) -> None:
        self.seen.append(self.call(manager))


def test_hook_reading_stats_is_allowed(policy: str) -> None:
    plugin = CallsBack(lambda m: (m.get_stats().stored_blocks, m.ref_count(k(1))))
    pm = create_plugin_manager(autoload=False, plugins=[plugin])
    manager = CPUOffloadingManager(4, cache_policy=policy, plugin_manager=pm)
    store(manager, [k(1), k(2)])
    assert plugin.seen == [(2, 0)]


@pytest.mark.parametrize(
    "method, call",
    [
        ("lookup", lambda m: m.lookup(k(9), CTX)),
        ("prepare_store", lambda m: m.prepare_store([k(9)], CTX)),
        ("complete_load", lambda m: m.complete_load([k(1)], CTX)),
        ("on_request_finished", lambda m: m.on_request_finished(CTX)),
        ("reset_cache", lambda m: m.reset_cache()),
    ],
)
def test_hook_calling_the_flow_back_is_refused(
    policy: str, method: str, call: Callable[[CPUOffloadingManager], object]
) -> None:
    plugin = CallsBack(call)
    pm = create_plugin_manager(autoload=False, plugins=[plugin])
    manager = CPUOffloadingManager(4, cache_policy=policy, plugin_manager=pm)
    out = manager.prepare_store([k(1), k(2)], CTX)
    assert out is not None
    with pytest.raises(HookError) as info:
        manager.complete_store(out.keys_to_store, CTX)
    cause = info.value.__cause__
    assert isinstance(cause, ConcurrentUseError)
    assert cause.reentrant and cause.method == method
    assert f"CPUOffloadingManager.{method}() was called from hook kv_offload_blocks_stored" in (
        str(cause)
    )
    assert "while the manager call that fired it is running on the same thread" in str(cause)
    # The outer call's effect stands (event-hook rule), the refused one had none.
    stats = manager.get_stats()
    assert (stats.stored_blocks, stats.lookups, stats.resident_blocks) == (2, 0, 2)
    assert manager.ref_count(k(1)) == 0 and manager.ref_count(k(9)) is None
    assert manager.lookup(k(1), CTX) is HIT  # the guard was given back


class AdmitsAfterCallingBack:
    @hookimpl
    def kv_offload_store_admission(self, manager: CPUOffloadingManager, keys: list[bytes]):
        manager.prepare_store([k(20)], CTX)
        return keys


def test_decision_hook_calling_back_changes_nothing(policy: str) -> None:
    pm = create_plugin_manager(autoload=False, plugins=[AdmitsAfterCallingBack()])
    manager = CPUOffloadingManager(4, cache_policy=policy, plugin_manager=pm)
    before = state_of(manager)
    with pytest.raises(HookError) as info:
        manager.prepare_store([k(1)], CTX)
    assert isinstance(info.value.__cause__, ConcurrentUseError)
    assert state_of(manager) == before


def test_synchronized_hook_calling_back_gets_an_error_not_a_deadlock(policy: str) -> None:
    holder: list[SynchronizedManager] = []
    plugin = CallsBack(lambda m: holder[0].lookup(k(9), CTX))
    pm = create_plugin_manager(autoload=False, plugins=[plugin])
    shared = synchronized(CPUOffloadingManager(4, cache_policy=policy, plugin_manager=pm))
    holder.append(shared)
    out = shared.prepare_store([k(1)], CTX)
    assert out is not None
    with pytest.raises(HookError) as info:
        shared.complete_store(out.keys_to_store, CTX)
    assert isinstance(info.value.__cause__, ConcurrentUseError)


def test_synchronized_forwards_the_whole_manager(policy: str) -> None:
    inner = CPUOffloadingManager(4, cache_policy=policy, block_size_bytes=16)
    shared = synchronized(inner)
    assert synchronized(shared) is shared  # one lock per manager
    again = SynchronizedManager(shared)
    assert again.wrapped is inner and again.lock is shared.lock
    assert shared.kv_buffer is inner.kv_buffer and shared.plugin_manager is inner.plugin_manager
    store(shared, [k(1)])  # type: ignore[arg-type]
    assert shared.ref_count(k(1)) == 0  # not in the interface: forwarded, under the lock
    assert shared.num_resident_blocks == 1
    assert shared.cpu_stats() == inner.get_stats() and shared.tier_stats() == []
    shared.shutdown()
    with pytest.raises(KVOffloadError):
        shared.lookup(k(1), CTX)
    with pytest.raises(KVOffloadError, match="OffloadingManager"):
        synchronized(object())  # type: ignore[arg-type]


def test_entry_guarded_keeps_the_signature() -> None:
    """The guard wrapper is compiled with the method's own parameters (positional defaults,
    keyword-only ones, ``*args``/``**kwargs``), so a new keyword passes through unchanged."""
    import inspect

    from kv_offload.concurrency import entry_guarded, new_entry_token

    class Thing:
        def __init__(self) -> None:
            self._entry = new_entry_token()

        @entry_guarded
        def call(self, a: int, b: int = 2, *rest: int, c: int = 3, **more: int) -> tuple:
            """Doc."""
            return a, b, rest, c, more

    thing = Thing()
    assert thing.call(1) == (1, 2, (), 3, {})
    assert thing.call(1, 5, 6, 7, c=8, d=9) == (1, 5, (6, 7), 8, {"d": 9})
    assert Thing.call.__doc__ == "Doc."
    assert str(inspect.signature(Thing.call)) == str(
        inspect.signature(Thing.call.__wrapped__)  # type: ignore[attr-defined]
    )
    thing._entry.pop()  # held, as by another thread
    with pytest.raises(ConcurrentUseError, match=r"Thing\.call\(\) was called while another"):
        thing.call(1)
