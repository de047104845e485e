"""Random request flows against CPUOffloadingManager, checked against a reference model.

A hypothesis state machine drives lookup / prepare_store / complete_store / prepare_load /
complete_load / touch / reset_cache over a small key universe and capacity, on every policy,
and checks the manager against a model of which keys are pending, ready and pinned. A few
rules make deliberately invalid calls and check that they raise and change nothing.
Only the manager's public API is used.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from kv_offload import (
    CPUOffloadingManager,
    KVOffloadError,
    LookupResult,
    ReqContext,
    make_offload_key,
)
from kv_offload.errors import InvalidArgumentError, InvalidKeyError, KeyStateError
from kv_offload.policies import CachePolicyFactory

NUM_KEYS = 12
UNIVERSE = [make_offload_key(i) for i in range(NUM_KEYS)]
CONTEXTS = [ReqContext(req_id=f"req-{i}") for i in range(3)]

keys_strategy = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=7, unique=True)
store_keys_strategy = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=4, unique=True)
ctx_strategy = st.sampled_from(CONTEXTS)

COUNTERS = (
    "lookups", "hits", "misses", "pending", "stored_blocks", "loaded_blocks", "failed_stores",
    "rejected_stores", "evictions",
)  # fmt: skip

MACHINE_SETTINGS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    database=None,
)


class ManagerMachine(RuleBasedStateMachine):
    """The reference model: ``pending`` and ``ready`` map keys to their slot ids, ``pins``
    counts the loads in flight of each ready key. For LRU, ``order`` is the recency order
    (oldest first) and victims are checked exactly."""

    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.manager: CPUOffloadingManager | None = None

    # -- model helpers ---------------------------------------------------------------------

    @property
    def m(self) -> CPUOffloadingManager:
        assert self.manager is not None
        return self.manager

    def resident(self) -> dict[bytes, int]:
        return {**self.ready, **self.pending}

    def idle(self) -> list[bytes]:
        return [key for key in self.ready if self.pins[key] == 0]

    def pinned(self) -> list[bytes]:
        return [key for key in self.ready if self.pins[key] > 0]

    def snapshot(self) -> tuple[Any, ...]:
        m = self.m
        return (
            m.get_stats(),
            m.num_free_blocks,
            m.num_resident_blocks,
            tuple(m.ref_count(key) for key in UNIVERSE),
            tuple(m.block_id(key) for key in UNIVERSE),
        )

    def expect_events(
        self, expected: list[tuple[list[bytes], bool]], metadata_only: bool = False
    ) -> None:
        events = self.m.take_events()
        assert [(list(e.keys), e.removed) for e in events] == expected
        for event in events:
            assert event.medium == "CPU"
            assert event.metadata_only is metadata_only

    def expect_invalid(self, exc_type: type[BaseException], call: Any, *fragments: str) -> None:
        before = self.snapshot()
        try:
            call()
        except exc_type as exc:
            assert isinstance(exc, KVOffloadError)
            for fragment in fragments:
                assert fragment in str(exc)
        else:
            raise AssertionError(f"expected {exc_type.__name__}")
        assert self.snapshot() == before
        self.expect_events([])

    # -- rules -----------------------------------------------------------------------------

    @initialize(capacity=st.integers(min_value=4, max_value=6))
    def create(self, capacity: int) -> None:
        self.capacity = capacity
        self.manager = CPUOffloadingManager(capacity, cache_policy=self.policy, enable_events=True)
        self.pending: dict[bytes, int] = {}
        self.ready: dict[bytes, int] = {}
        self.pins: dict[bytes, int] = {}
        self.order: list[bytes] = []
        self.counters = dict.fromkeys(COUNTERS, 0)

    def _lookup(self, key: bytes, ctx: ReqContext) -> None:
        result = self.m.lookup(key, ctx)
        self.counters["lookups"] += 1
        if key in self.pending:
            expected, counter = LookupResult.PENDING, "pending"
        elif key in self.ready:
            expected, counter = LookupResult.HIT, "hits"
        else:
            expected, counter = LookupResult.MISS, "misses"
        self.counters[counter] += 1
        assert result is expected, (key, result, expected)

    @rule(key=st.sampled_from(UNIVERSE), ctx=ctx_strategy)
    def lookup(self, key: bytes, ctx: ReqContext) -> None:
        self._lookup(key, ctx)
        self.expect_events([])

    @rule(
        keys=store_keys_strategy,
        ctx=ctx_strategy,
        then_complete=st.sampled_from([None, True, False]),
    )
    def prepare_store(self, keys: list[bytes], ctx: ReqContext, then_complete: bool | None) -> None:
        """prepare_store; with ``then_complete`` set, complete the store right away with
        that ``success`` (the common flow, so that the cache fills with ready blocks)."""
        resident = self.resident()
        to_store = [key for key in keys if key not in resident]
        shortfall = len(to_store) - (self.capacity - len(resident))
        candidates = [key for key in self.idle() if key not in keys]
        idle_before = set(self.idle())
        pinned_or_pending = {key: resident[key] for key in resident if key not in idle_before}

        out = self.m.prepare_store(keys, ctx)

        if to_store and shortfall > len(candidates):
            assert out is None
            self.counters["rejected_stores"] += 1
            self.expect_events([])
            return
        assert out is not None
        assert out.keys_to_store == to_store
        evicted = list(out.evicted_keys)
        assert len(evicted) == max(shortfall, 0) if to_store else evicted == []
        assert len(set(evicted)) == len(evicted)
        assert set(evicted) <= set(candidates)  # idle, not named in the call
        if self.policy == "lru" and evicted:
            lru_victims = [key for key in self.order if key in candidates][: len(evicted)]
            assert set(evicted) == set(lru_victims)
        slots = out.store_spec.block_ids.tolist()
        assert len(slots) == len(to_store)
        assert out.store_spec.block_ids.dtype.name == "int64"

        for key in evicted:
            del self.ready[key]
            del self.pins[key]
            self.order.remove(key)
            assert self.m.ref_count(key) is None
        for key, slot in zip(to_store, slots):
            self.pending[key] = slot
            self.order.append(key)
        self.counters["evictions"] += len(evicted)
        # Pinned and pending blocks kept their slots.
        for key, slot in pinned_or_pending.items():
            assert self.m.block_id(key) == slot
        self.expect_events([(evicted, True)] if evicted else [])
        for key in evicted:
            assert key in idle_before
        if then_complete is not None and to_store:
            self._complete_store(to_store, ctx, then_complete)

    @precondition(lambda self: self.manager is not None and bool(self.pending))
    @rule(data=st.data(), success=st.booleans(), ctx=ctx_strategy)
    def complete_store(self, data: st.DataObject, success: bool, ctx: ReqContext) -> None:
        keys = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, unique=True))
        self._complete_store(keys, ctx, success)

    def _complete_store(self, keys: list[bytes], ctx: ReqContext, success: bool) -> None:
        self.m.complete_store(keys, ctx, success=success)
        for key in keys:
            slot = self.pending.pop(key)
            if success:
                self.ready[key] = slot
                self.pins[key] = 0
            else:
                self.order.remove(key)
        if success:
            self.counters["stored_blocks"] += len(keys)
            self.expect_events([(keys, False)])
            for key in keys:
                assert self.m.ref_count(key) == 0
        else:
            self.counters["failed_stores"] += len(keys)
            self.expect_events([(keys, True)], metadata_only=True)  # a failed store
            for key in keys:
                assert self.m.ref_count(key) is None

    @precondition(lambda self: self.manager is not None and bool(self.ready))
    @rule(data=st.data(), ctx=ctx_strategy)
    def prepare_load(self, data: st.DataObject, ctx: ReqContext) -> None:
        keys = data.draw(st.lists(st.sampled_from(sorted(self.ready)), min_size=1, unique=True))
        spec = self.m.prepare_load(keys, ctx)
        assert spec.block_ids.dtype.name == "int64"
        assert spec.block_ids.tolist() == [self.ready[key] for key in keys]
        for key in keys:
            self.pins[key] += 1
        self.expect_events([])

    @precondition(lambda self: self.manager is not None and any(self.pins.values()))
    @rule(data=st.data(), ctx=ctx_strategy)
    def complete_load(self, data: st.DataObject, ctx: ReqContext) -> None:
        keys = data.draw(st.lists(st.sampled_from(sorted(self.pinned())), min_size=1, unique=True))
        self.m.complete_load(keys, ctx)
        for key in keys:
            self.pins[key] -= 1
        self.counters["loaded_blocks"] += len(keys)
        self.expect_events([])

    @rule(keys=keys_strategy, ctx=ctx_strategy)
    def touch(self, keys: list[bytes], ctx: ReqContext) -> None:
        self.m.touch(keys, ctx)
        for key in reversed(keys):  # the first key ends up most recent
            if key in self.order:
                self.order.remove(key)
                self.order.append(key)
        self.expect_events([])

    @rule(roll=st.integers(min_value=0, max_value=15))
    def reset_cache(self, roll: int) -> None:
        if roll != 7:  # rarely, so that the cache fills up between resets
            return
        resident = set(self.resident())
        self.m.reset_cache()
        for event in self.m.take_events():
            assert event.removed and set(event.keys) <= resident
        self.pending.clear()
        self.ready.clear()
        self.pins.clear()
        self.order.clear()
        self.counters = dict.fromkeys(COUNTERS, 0)

    # -- invalid calls: must raise and change nothing ------------------------------------

    @rule(
        data=st.data(),
        kind=st.sampled_from(["key_state", "batch", "context"]),
        ctx=ctx_strategy,
    )
    def invalid_call(self, data: st.DataObject, kind: str, ctx: ReqContext) -> None:
        if kind == "key_state":
            self._invalid_key_state(data, ctx)
        elif kind == "batch":
            self._invalid_batch(data, ctx)
        else:
            self._invalid_context(data)

    def _invalid_key_state(self, data: st.DataObject, ctx: ReqContext) -> None:
        """Valid keys, then one key whose state does not fit the operation."""
        m = self.m
        operation = data.draw(st.sampled_from(["prepare_load", "complete_load", "complete_store"]))
        if operation == "prepare_load":
            good_pool, bad_pool = sorted(self.ready), [k for k in UNIVERSE if k not in self.ready]
        elif operation == "complete_load":
            good_pool = sorted(self.pinned())
            bad_pool = [k for k in UNIVERSE if self.pins.get(k, 0) == 0]
        else:
            good_pool = sorted(self.pending)
            bad_pool = [k for k in UNIVERSE if k not in self.pending]
        good = data.draw(st.lists(st.sampled_from(good_pool), unique=True)) if good_pool else []
        bad = data.draw(st.sampled_from(bad_pool))
        keys = [*good, bad]  # the bad key last: nothing before it may be applied
        if operation == "complete_store":
            success = data.draw(st.booleans())
            call: Any = lambda: m.complete_store(keys, ctx, success=success)  # noqa: E731
        else:
            call = lambda: getattr(m, operation)(keys, ctx)  # noqa: E731
        self.expect_invalid(KeyStateError, call, operation, repr(bad))

    def _invalid_batch(self, data: st.DataObject, ctx: ReqContext) -> None:
        """Keys valid for the operation, then one repeated or unhashable key."""
        operation = data.draw(
            st.sampled_from(
                ["prepare_load", "complete_load", "prepare_store", "complete_store", "touch"]
            )
        )
        pool = {
            "prepare_load": sorted(self.ready),
            "complete_load": sorted(self.pinned()),
            "complete_store": sorted(self.pending),
        }.get(operation, UNIVERSE)
        if not pool:
            return
        keys = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=7, unique=True))
        if data.draw(st.booleans()):
            bad: Any = data.draw(st.sampled_from(keys))
            exc_type: type[BaseException] = InvalidArgumentError
        else:
            bad = [data.draw(st.sampled_from(keys))]  # unhashable
            exc_type = InvalidKeyError
        self.expect_invalid(
            exc_type, lambda: getattr(self.m, operation)([*keys, bad], ctx), operation, repr(bad)
        )

    def _invalid_context(self, data: st.DataObject) -> None:
        """A context without a req_id."""
        key = data.draw(st.sampled_from(UNIVERSE))
        operation = data.draw(st.sampled_from(["lookup", "prepare_store", "touch"]))
        cleared = ReqContext(req_id="cleared")
        cleared.req_id = None  # type: ignore[assignment]  # ReqContext() itself refuses None
        ctx: Any = data.draw(st.sampled_from([cleared, object()]))
        arg: Any = key if operation == "lookup" else [key]
        self.expect_invalid(
            InvalidArgumentError, lambda: getattr(self.m, operation)(arg, ctx), operation, "req_id"
        )

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def occupancy_matches_model(self) -> None:
        if self.manager is None:
            return
        m = self.m
        resident = self.resident()
        assert m.num_free_blocks + m.num_resident_blocks == self.capacity
        assert m.num_resident_blocks == len(resident)
        stats = m.get_stats()
        assert stats.capacity == self.capacity
        assert stats.resident_blocks == len(resident)
        assert stats.free_blocks == self.capacity - len(resident)
        assert stats.pending_blocks == len(self.pending)
        assert stats.pinned_blocks == len(self.pinned())
        assert stats.evictable_blocks == len(self.idle())
        assert stats.usage == (len(self.pending) + len(self.pinned())) / self.capacity
        assert stats.occupancy == len(resident) / self.capacity

    @invariant()
    def blocks_match_model(self) -> None:
        if self.manager is None:
            return
        m = self.m
        resident = self.resident()
        for key in UNIVERSE:
            ref = m.ref_count(key)
            slot = m.block_id(key)
            if key in self.pending:
                assert ref == -1
            elif key in self.ready:
                assert ref == self.pins[key] >= 0
            else:
                assert ref is None and slot is None
                continue
            assert slot == resident[key]  # pinned and pending blocks never moved or left
        slots = list(resident.values())
        assert len(set(slots)) == len(slots)
        assert all(0 <= slot < self.capacity for slot in slots)

    @invariant()
    def lookups_match_model(self) -> None:
        if self.manager is None:
            return
        for key in UNIVERSE:
            self._lookup(key, CONTEXTS[0])
        stats = self.m.get_stats()
        assert {name: getattr(stats, name) for name in COUNTERS} == self.counters
        self.expect_events([])


def _skip_unless_installed(name: str) -> pytest.MarkDecorator:
    installed = {info.name for info in CachePolicyFactory.available_policies()}
    return pytest.mark.skipif(
        name not in installed, reason=f"policy plugin {name!r} is not installed"
    )


class LRUManagerMachine(ManagerMachine):
    policy = "lru"


class ARCManagerMachine(ManagerMachine):
    policy = "arc"


class ReuseManagerMachine(ManagerMachine):
    policy = "reuse"


class SAEManagerMachine(ManagerMachine):
    policy = "sae"


LRUManagerMachine.TestCase.settings = MACHINE_SETTINGS
ARCManagerMachine.TestCase.settings = MACHINE_SETTINGS
ReuseManagerMachine.TestCase.settings = MACHINE_SETTINGS
SAEManagerMachine.TestCase.settings = MACHINE_SETTINGS

TestLRUManagerStateful = _skip_unless_installed("lru")(LRUManagerMachine.TestCase)
TestARCManagerStateful = _skip_unless_installed("arc")(ARCManagerMachine.TestCase)
TestReuseManagerStateful = _skip_unless_installed("reuse")(ReuseManagerMachine.TestCase)
TestSAEManagerStateful = _skip_unless_installed("sae")(SAEManagerMachine.TestCase)
