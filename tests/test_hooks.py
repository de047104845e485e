"""Lifecycle hooks: what fires when, with which arguments, and what a failing plugin does.

Every test builds its own plugin manager (``create_plugin_manager(autoload=False)``) and hands
it to the CPU manager with ``plugin_manager=``; a tiered manager shares its primary's. The
scripted scenario drives a :class:`TieringOffloadingManager` over the example tier through a
store, a cascade, evictions, a failed cascade, a promotion, a load, a failed promotion, a
failed store, a cache reset and a shutdown, with a :class:`RecordingPlugin` that logs which
hook fired during which manager call. Each hook has a ``test_hook_<name>`` test below (a
meta-test checks that), and ``test_every_hook_fires_once_per_manager_call`` checks the batch
rule: one call per manager call (per tier job in ``on_schedule_end``), never one per block.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from _dists import ModuleFactory
from _hook_plugins import EVENT_HOOKS, NoOpObserver, RecordingPlugin, SeenTwiceAdmission
from kv_offload import (
    CachePolicyFactory,
    CPUOffloadingManager,
    HookError,
    JobMetadata,
    JobResult,
    KVOffloadPluginManager,
    LookupResult,
    ManagerError,
    OffloadingConfig,
    OffloadKey,
    PluginError,
    PluginImportError,
    PluginValidationError,
    ReqContext,
    TieringOffloadingManager,
    create_plugin_manager,
    get_offload_block_hash,
    get_plugin_manager,
    hookimpl,
    hookspecs,
    make_offload_key,
)
from kv_offload.plugins import loading as hooks_module
from kv_offload.replay import replay
from kv_offload_example_tier import ExampleSecondaryTierManager

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 16
TIER = "example"

#: Every hookspec, without the ``kv_offload_`` prefix.
SPECS = sorted(
    name.removeprefix("kv_offload_") for name in dir(hookspecs) if name.startswith("kv_offload_")
)


def k(i: int) -> OffloadKey:
    return make_offload_key(i)


def ks(*nums: int) -> list[OffloadKey]:
    return [k(i) for i in nums]


def num(key: OffloadKey) -> int:
    return int.from_bytes(get_offload_block_hash(key), "big")


class ScriptedTier(ExampleSecondaryTierManager):
    """The example tier; ``fail_next_store`` / ``fail_next_load`` fail the next such job."""

    fail_next_store = False
    fail_next_load = False

    def submit_store(self, job: JobMetadata) -> None:
        if self.fail_next_store:
            self.fail_next_store = False
            self._finished.append(JobResult(job.job_id, success=False))
            return
        super().submit_store(job)

    def submit_load(self, job: JobMetadata) -> None:
        if self.fail_next_load:
            self.fail_next_load = False
            self._finished.append(JobResult(job.job_id, success=False))
            return
        super().submit_load(job)


@pytest.fixture
def pm() -> KVOffloadPluginManager:
    return create_plugin_manager(autoload=False)


def make_tiered(
    pm: KVOffloadPluginManager,
    num_blocks: int = 4,
    tier_cls: type[ExampleSecondaryTierManager] = ScriptedTier,
    names: tuple[str, ...] = (TIER,),
    **tier_kwargs: Any,
) -> TieringOffloadingManager:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK, plugin_manager=pm)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(num_blocks, BLOCK)
    tiers = [tier_cls(config, primary.kv_buffer.view, name, **tier_kwargs) for name in names]
    return TieringOffloadingManager(primary, tiers, drain_timeout=5.0)


def store(manager: Any, ctx: ReqContext, *nums: int) -> list[OffloadKey]:
    out = manager.prepare_store(ks(*nums), ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    return list(out.keys_to_store)


# -- the scripted scenario --------------------------------------------------------------------


@dataclass
class Scripted:
    """The scenario's normalised log: ``(step, hook, arguments)`` with managers as
    ``"tiered"``/``"primary"``, keys as ints and contexts as their ``req_id``."""

    log: list[tuple[str, str, dict[str, Any]]]
    steps: list[str]
    raw: list[tuple[str, Any]]

    def calls(self, hook: str) -> list[tuple[str, dict[str, Any]]]:
        return [(step, args) for step, name, args in self.log if name == hook]


def run_script(pm: KVOffloadPluginManager) -> Scripted:
    recorder = RecordingPlugin()
    pm.register(recorder, name="recorder")
    m = make_tiered(pm)
    tier = m.tiers[0]
    assert isinstance(tier, ScriptedTier)
    a, b = ReqContext("a"), ReqContext("b")
    steps: list[str] = []

    def step(label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        steps.append(label)
        recorder.step(label)
        return fn(*args, **kwargs)

    step("on_new_request(a)", m.on_new_request, a)
    out = step("prepare_store(a, 0 1 2)", m.prepare_store, ks(0, 1, 2), a)
    step("complete_store(a, 0 1 2)", m.complete_store, out.keys_to_store, a)
    step("on_schedule_end#1", m.on_schedule_end)  # the cascade lands in the tier
    step("on_request_finished(a)", m.on_request_finished, a)
    step("on_new_request(b)", m.on_new_request, b)
    out = step("prepare_store(b, 3 4 5)", m.prepare_store, ks(3, 4, 5), b)  # evicts 0, 1
    tier.fail_next_store = True
    step("complete_store(b, 3 4 5)", m.complete_store, out.keys_to_store, b)
    step("on_schedule_end#2", m.on_schedule_end)  # that cascade fails
    assert step("lookup(b, 0)", m.lookup, k(0), b) is PENDING  # promotion; evicts 2
    step("on_schedule_end#3", m.on_schedule_end)  # the promotion lands
    assert step("lookup(b, 0) again", m.lookup, k(0), b) is HIT
    step("prepare_load(b, 0)", m.prepare_load, ks(0), b)
    step("complete_load(b, 0)", m.complete_load, ks(0), b)
    tier.fail_next_load = True
    assert step("lookup(b, 1)", m.lookup, k(1), b) is PENDING  # promotion; evicts 3
    step("on_schedule_end#4", m.on_schedule_end)  # that promotion fails
    assert step("lookup(b, 1) again", m.lookup, k(1), b) is PENDING  # retried...
    tier.fail_next_load = True
    step("on_schedule_end#5", m.on_schedule_end)  # ...and fails again
    out = step("prepare_store(b, 6)", m.prepare_store, ks(6), b)
    step("complete_store(b, 6, success=False)", m.complete_store, out.keys_to_store, b, False)
    step("on_request_finished(b)", m.on_request_finished, b)
    step("reset_cache", m.reset_cache)
    step("shutdown", m.shutdown)

    who = {id(m): "tiered", id(m.primary): "primary"}
    log = []
    current = "<before the first step>"
    for hook, args in recorder.log:
        if hook == "step":
            current = args
            continue
        norm = dict(args)
        norm["manager"] = who[id(norm["manager"])]
        if "keys" in norm:
            norm["keys"] = [num(key) for key in norm["keys"]]
        if "req_context" in norm:
            assert norm["req_context"] in (a, b)
            norm["req_context"] = norm["req_context"].req_id
        log.append((current, hook, norm))
    return Scripted(log, steps, recorder.log)


@pytest.fixture
def scripted(pm: KVOffloadPluginManager) -> Scripted:
    return run_script(pm)


def ev(manager: str, keys: list[int], medium: str, req: str) -> dict[str, Any]:
    return {"manager": manager, "keys": keys, "medium": medium, "req_context": req}


def test_hook_request_started(scripted: Scripted) -> None:
    # The tiered manager delegates to its CPU tier, which fires the hook.
    assert scripted.calls("request_started") == [
        ("on_new_request(a)", {"manager": "primary", "req_context": "a"}),
        ("on_new_request(b)", {"manager": "primary", "req_context": "b"}),
    ]


def test_hook_request_finished(scripted: Scripted) -> None:
    assert scripted.calls("request_finished") == [
        ("on_request_finished(a)", {"manager": "primary", "req_context": "a"}),
        ("on_request_finished(b)", {"manager": "primary", "req_context": "b"}),
    ]


def test_hook_blocks_stored(scripted: Scripted) -> None:
    assert scripted.calls("blocks_stored") == [
        ("complete_store(a, 0 1 2)", ev("primary", [0, 1, 2], "CPU", "a")),
        # the cascade to the tier, reported by the tiered manager when the job finishes
        ("on_schedule_end#1", ev("tiered", [0, 1, 2], TIER, "a")),
        ("complete_store(b, 3 4 5)", ev("primary", [3, 4, 5], "CPU", "b")),
        # a promotion is a store into the CPU tier
        ("on_schedule_end#3", ev("primary", [0], "CPU", "b")),
    ]


def test_hook_blocks_loaded(scripted: Scripted) -> None:
    assert scripted.calls("blocks_loaded") == [
        ("on_schedule_end#3", ev("tiered", [0], TIER, "b")),  # tier -> CPU
        ("complete_load(b, 0)", ev("primary", [0], "CPU", "b")),  # CPU -> GPU
    ]


def test_hook_blocks_evicted(scripted: Scripted) -> None:
    assert scripted.calls("blocks_evicted") == [
        ("prepare_store(b, 3 4 5)", ev("primary", [0, 1], "CPU", "b")),
        ("lookup(b, 0)", ev("primary", [2], "CPU", "b")),  # room for the promotion
        ("lookup(b, 1)", ev("primary", [3], "CPU", "b")),
    ]


def test_hook_store_failed(scripted: Scripted) -> None:
    assert scripted.calls("store_failed") == [
        ("on_schedule_end#2", ev("tiered", [3, 4, 5], TIER, "b")),  # failed cascade
        ("on_schedule_end#4", ev("primary", [1], "CPU", "b")),  # failed promotion's slot
        ("on_schedule_end#5", ev("primary", [1], "CPU", "b")),
        ("complete_store(b, 6, success=False)", ev("primary", [6], "CPU", "b")),
    ]


def test_hook_tier_job_finished(scripted: Scripted) -> None:
    def job(direction: str, keys: list[int], success: bool, req: str) -> dict[str, Any]:
        nbytes = len(keys) * BLOCK if success else 0
        return {
            "manager": "tiered",
            "tier": TIER,
            "direction": direction,
            "keys": keys,
            "success": success,
            "nbytes": nbytes,
            "req_context": req,
        }

    assert scripted.calls("tier_job_finished") == [
        ("on_schedule_end#1", job("store", [0, 1, 2], True, "a")),
        ("on_schedule_end#2", job("store", [3, 4, 5], False, "b")),
        ("on_schedule_end#3", job("load", [0], True, "b")),
        ("on_schedule_end#4", job("load", [1], False, "b")),
        ("on_schedule_end#5", job("load", [1], False, "b")),
    ]


def test_hook_cache_reset(scripted: Scripted) -> None:
    assert scripted.calls("cache_reset") == [
        ("reset_cache", {"manager": "primary"}),
        ("shutdown", {"manager": "primary"}),  # shutdown empties the CPU tier first
    ]


def test_hook_shutdown(scripted: Scripted) -> None:
    assert scripted.calls("shutdown") == [("shutdown", {"manager": "primary"})]


def test_hook_store_admission(scripted: Scripted) -> None:
    # Only keys that would take a slot are offered: promotions too, not keys already stored.
    assert scripted.calls("store_admission") == [
        ("prepare_store(a, 0 1 2)", {"manager": "primary", "keys": [0, 1, 2], "req_context": "a"}),
        ("prepare_store(b, 3 4 5)", {"manager": "primary", "keys": [3, 4, 5], "req_context": "b"}),
        ("lookup(b, 0)", {"manager": "primary", "keys": [0], "req_context": "b"}),
        ("lookup(b, 1)", {"manager": "primary", "keys": [1], "req_context": "b"}),
        ("lookup(b, 1) again", {"manager": "primary", "keys": [1], "req_context": "b"}),
        ("prepare_store(b, 6)", {"manager": "primary", "keys": [6], "req_context": "b"}),
    ]


def test_hooks_fire_in_order_within_each_call(scripted: Scripted) -> None:
    """Across hooks: decisions before effects; a tier job's own events after the CPU tier's."""
    per_step: dict[str, list[str]] = {}
    for step, hook, _ in scripted.log:
        per_step.setdefault(step, []).append(hook)
    assert per_step == {
        "on_new_request(a)": ["request_started"],
        "prepare_store(a, 0 1 2)": ["store_admission"],
        "complete_store(a, 0 1 2)": ["blocks_stored"],
        "on_schedule_end#1": ["tier_job_finished", "blocks_stored"],
        "on_request_finished(a)": ["request_finished"],
        "on_new_request(b)": ["request_started"],
        "prepare_store(b, 3 4 5)": ["store_admission", "blocks_evicted"],
        "complete_store(b, 3 4 5)": ["blocks_stored"],
        "on_schedule_end#2": ["tier_job_finished", "store_failed"],
        "lookup(b, 0)": ["store_admission", "blocks_evicted"],
        "on_schedule_end#3": ["blocks_stored", "tier_job_finished", "blocks_loaded"],
        "complete_load(b, 0)": ["blocks_loaded"],
        "lookup(b, 1)": ["store_admission", "blocks_evicted"],
        "on_schedule_end#4": ["store_failed", "tier_job_finished"],
        "lookup(b, 1) again": ["store_admission"],
        "on_schedule_end#5": ["store_failed", "tier_job_finished"],
        "prepare_store(b, 6)": ["store_admission"],
        "complete_store(b, 6, success=False)": ["store_failed"],
        "on_request_finished(b)": ["request_finished"],
        "reset_cache": ["cache_reset"],
        "shutdown": ["cache_reset", "shutdown"],
    }
    # Calls that fire nothing: lookups that hit, prepare_load.
    silent = set(scripted.steps) - set(per_step)
    assert silent == {"lookup(b, 0) again", "prepare_load(b, 0)"}


def test_every_hook_fires_once_per_manager_call(scripted: Scripted) -> None:
    # In this script every on_schedule_end finishes exactly one tier job, so "at most one call
    # per manager call" holds for every step, and the batches arrive whole.
    for step in scripted.steps:
        counts = Counter(hook for s, hook, _ in scripted.log if s == step)
        assert max(counts.values(), default=0) <= 1, (step, counts)


def test_batches_are_one_call_not_one_per_block(pm: KVOffloadPluginManager) -> None:
    recorder = RecordingPlugin()
    pm.register(recorder)
    m = make_tiered(pm, num_blocks=64, names=("t1", "t2"))
    ctx = ReqContext("big")
    store(m, ctx, *range(64))
    m.on_schedule_end()  # two cascades: one job per tier
    m.prepare_load(ks(*range(64)), ctx)
    m.complete_load(ks(*range(64)), ctx)
    out = m.prepare_store(ks(*range(100, 140)), ctx)  # evicts 40 in one go
    assert out is not None
    m.complete_store(out.keys_to_store, ctx, success=False)
    hooks = Counter(hook for hook, _ in recorder.log)
    assert hooks == {
        "store_admission": 2,
        "blocks_stored": 3,  # CPU, t1, t2
        "tier_job_finished": 2,
        "blocks_loaded": 1,
        "blocks_evicted": 1,
        "store_failed": 1,
    }
    sizes = {(hook, args.get("medium")): len(args["keys"]) for hook, args in recorder.log}
    assert sizes == {
        ("store_admission", None): 40,  # the last one
        ("blocks_stored", "CPU"): 64,
        ("blocks_stored", "t1"): 64,
        ("blocks_stored", "t2"): 64,
        ("tier_job_finished", None): 64,
        ("blocks_loaded", "CPU"): 64,
        ("blocks_evicted", "CPU"): 40,
        ("store_failed", "CPU"): 40,
    }


def test_every_hookspec_is_documented_and_has_a_test() -> None:
    """Each hookspec has a docstring and a ``test_hook_<name>`` here, and the scripted
    scenario makes each of them fire."""
    assert SPECS, "no hookspecs found"
    for name in SPECS:
        doc = inspect.getdoc(getattr(hookspecs, "kv_offload_" + name))
        assert doc and len(doc) > 20, f"kv_offload_{name} has no docstring"
    tree = ast.parse(Path(__file__).read_text())
    tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {f"test_hook_{name}" for name in SPECS} <= tests
    assert sorted(set(EVENT_HOOKS) | {"store_admission"}) == SPECS
    fired = {hook for _, hook, _ in run_script(create_plugin_manager(autoload=False)).log}
    assert fired == set(SPECS)
    # The module documents the package-level names a plugin author uses.
    assert hookspecs.__doc__ and "hookimpl" in hookspecs.__doc__


def test_hook_arguments_are_a_copy_of_the_batch(pm: KVOffloadPluginManager) -> None:
    class Vandal:
        @hookimpl
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> None:
            keys.clear()

        @hookimpl
        def kv_offload_blocks_stored(self, keys: list[OffloadKey]) -> None:
            keys.clear()

    pm.register(Vandal())
    m = CPUOffloadingManager(8, plugin_manager=pm)
    ctx = ReqContext("r")
    batch = ks(1, 2, 3)
    assert store(m, ctx, 1, 2, 3) == batch
    assert [m.lookup(key, ctx) for key in batch] == [HIT] * 3


# -- no plugin, no cost -----------------------------------------------------------------------


def test_unimplemented_hooks_are_none_on_the_hot_path(pm: KVOffloadPluginManager) -> None:
    m = CPUOffloadingManager(4, plugin_manager=pm)
    assert all(getattr(m.hooks, name) is None for name in SPECS)
    observer = NoOpObserver()
    pm.register(observer)
    assert {name for name in SPECS if getattr(m.hooks, name) is not None} == set(EVENT_HOOKS)
    pm.unregister(observer)
    assert all(getattr(m.hooks, name) is None for name in SPECS)


# -- store admission --------------------------------------------------------------------------


def test_seen_twice_admission_stores_a_block_the_second_time_it_is_offered(
    pm: KVOffloadPluginManager,
) -> None:
    pm.register(SeenTwiceAdmission(), name="seen-twice")
    m = CPUOffloadingManager(8, plugin_manager=pm)
    ctx = ReqContext("r")
    first = m.prepare_store(ks(1, 2), ctx)
    assert first is not None and first.keys_to_store == []
    assert m.num_free_blocks == 8 and [m.lookup(key, ctx) for key in ks(1, 2)] == [MISS] * 2
    second = m.prepare_store(ks(0, 1, 2, 3), ctx)
    assert second is not None and second.keys_to_store == ks(1, 2)  # caller's order
    m.complete_store(second.keys_to_store, ctx)
    assert store(m, ctx, 0, 1, 2, 3) == ks(0, 3)  # 1, 2 are stored: not offered again
    assert m.get_stats().stored_blocks == 4


def test_seen_twice_admission_in_a_replay(pm: KVOffloadPluginManager) -> None:
    plugin = SeenTwiceAdmission()
    pm.register(plugin)
    offered: Counter[OffloadKey] = Counter()

    class Spy:
        @hookimpl(tryfirst=True)
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> None:
            offered.update(keys)

    pm.register(Spy())
    stored: list[OffloadKey] = []

    class StoredLog:
        @hookimpl
        def kv_offload_blocks_stored(self, keys: list[OffloadKey]) -> None:
            stored.extend(keys)

    pm.register(StoredLog())
    # Three requests share a prefix; each repeats one earlier suffix block.
    requests = [
        (ReqContext("r1"), ks(0, 1, 2)),
        (ReqContext("r2"), ks(0, 1, 3)),
        (ReqContext("r3"), ks(0, 1, 2, 3)),
    ]
    result = replay(CPUOffloadingManager(16, plugin_manager=pm), requests)
    # r1 offers 0 1 2 (first time each); r2 misses 0 (never stored), offers 0 1 3 and gets
    # 0 1 in; r3 hits 0 1 and offers 2 3, each for the second time.
    assert [num(key) for key in stored] == [0, 1, 2, 3]
    assert all(offered[key] == 2 for key in stored)
    assert result.hit_blocks == 2
    assert result.stored_blocks == 4


def test_admission_keeps_the_callers_order_and_ignores_foreign_keys(
    pm: KVOffloadPluginManager,
) -> None:
    class Picky:
        @hookimpl
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey]:
            return [k(99), *reversed(keys[1:])]

    pm.register(Picky())
    m = CPUOffloadingManager(8, plugin_manager=pm)
    out = m.prepare_store(ks(1, 2, 3), ReqContext("r"))
    assert out is not None and out.keys_to_store == ks(2, 3)
    assert m.ref_count(k(99)) is None


def test_admission_first_answer_wins_latest_registered_first(
    pm: KVOffloadPluginManager,
) -> None:
    class Answer:
        def __init__(self, answer: list[int] | None) -> None:
            self.answer = answer
            self.asked = 0

        @hookimpl
        def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey] | None:
            self.asked += 1
            return None if self.answer is None else [key for key in keys if num(key) in self.answer]

    first, second, abstain = Answer([1]), Answer([2]), Answer(None)
    for plugin in (first, second, abstain):
        pm.register(plugin)
    m = CPUOffloadingManager(8, plugin_manager=pm)
    out = m.prepare_store(ks(1, 2, 3), ReqContext("r"))
    assert out is not None and out.keys_to_store == ks(2)
    assert (abstain.asked, second.asked, first.asked) == (1, 1, 0)


def test_admission_can_refuse_a_promotion(pm: KVOffloadPluginManager) -> None:
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)  # 1 and 2 now live only in the tier
    m.on_schedule_end()
    pm.register(SeenTwiceAdmission())
    assert m.lookup(k(1), ctx) is MISS  # offered once: refused, nothing evicted
    assert m.get_stats().tiers[0].refused_promotions == 1
    assert m.lookup(k(3), ctx) is HIT
    assert m.lookup(k(1), ctx) is PENDING  # offered twice
    m.on_schedule_end()
    assert m.lookup(k(1), ctx) is HIT


def test_admission_returning_garbage_is_a_hook_error_without_effect(
    pm: KVOffloadPluginManager,
) -> None:
    class Garbage:
        @hookimpl
        def kv_offload_store_admission(self) -> int:
            return 3

    pm.register(Garbage(), name="garbage")
    m = CPUOffloadingManager(8, plugin_manager=pm)
    before = m.get_stats()
    with pytest.raises(HookError, match="kv_offload_store_admission returned 3"):
        m.prepare_store(ks(1), ReqContext("r"))
    assert m.get_stats() == before


# -- a raising plugin -------------------------------------------------------------------------


class Boom:
    """Raises from the hooks named in ``hooks``."""

    def __init__(self, *hooks: str) -> None:
        self.hooks = set(hooks)

    def _maybe(self, hook: str) -> None:
        if hook in self.hooks:
            raise RuntimeError(f"boom in {hook}")

    @hookimpl
    def kv_offload_request_finished(self) -> None:
        self._maybe("request_finished")

    @hookimpl
    def kv_offload_blocks_stored(self, medium: str) -> None:
        self._maybe("blocks_stored")
        self._maybe(f"blocks_stored:{medium}")

    @hookimpl
    def kv_offload_blocks_evicted(self) -> None:
        self._maybe("blocks_evicted")

    @hookimpl
    def kv_offload_store_failed(self) -> None:
        self._maybe("store_failed")

    @hookimpl
    def kv_offload_tier_job_finished(self) -> None:
        self._maybe("tier_job_finished")

    @hookimpl
    def kv_offload_cache_reset(self) -> None:
        self._maybe("cache_reset")

    @hookimpl
    def kv_offload_store_admission(self) -> None:
        self._maybe("store_admission")


def check_hook_error(exc: pytest.ExceptionInfo[HookError], hook: str) -> None:
    error = exc.value
    assert isinstance(error, PluginError)
    assert (error.kind, error.plugin) == ("hook", "boom")
    assert f"hook plugin 'boom' raised in kv_offload_{hook}" in str(error)
    assert isinstance(error.__cause__, RuntimeError)


def test_raising_blocks_stored_leaves_the_store_done(pm: KVOffloadPluginManager) -> None:
    pm.register(Boom("blocks_stored"), name="boom")
    m = CPUOffloadingManager(4, plugin_manager=pm)
    ctx = ReqContext("r")
    out = m.prepare_store(ks(1, 2), ctx)
    assert out is not None
    with pytest.raises(HookError) as exc:
        m.complete_store(out.keys_to_store, ctx)
    check_hook_error(exc, "blocks_stored")
    assert [m.lookup(key, ctx) for key in ks(1, 2)] == [HIT, HIT]
    stats = m.get_stats()
    assert (stats.stored_blocks, stats.pending_blocks, stats.evictable_blocks) == (2, 0, 2)
    m.prepare_load(ks(1, 2), ctx)
    m.complete_load(ks(1, 2), ctx)  # the manager works on


def test_raising_store_failed_leaves_the_slots_free(pm: KVOffloadPluginManager) -> None:
    pm.register(Boom("store_failed"), name="boom")
    m = CPUOffloadingManager(2, plugin_manager=pm)
    ctx = ReqContext("r")
    out = m.prepare_store(ks(1, 2), ctx)
    assert out is not None
    with pytest.raises(HookError) as exc:
        m.complete_store(out.keys_to_store, ctx, success=False)
    check_hook_error(exc, "store_failed")
    assert m.num_free_blocks == 2 and m.get_stats().failed_stores == 2
    assert m.lookup(k(1), ctx) is MISS


def test_raising_request_finished_after_the_policy_was_told(pm: KVOffloadPluginManager) -> None:
    told = []

    class Policy:
        @hookimpl(tryfirst=True)
        def kv_offload_request_finished(self, req_context: ReqContext) -> None:
            told.append(req_context.req_id)

    pm.register(Policy())
    pm.register(Boom("request_finished"), name="boom")
    m = CPUOffloadingManager(2, plugin_manager=pm)
    with pytest.raises(HookError) as exc:
        m.on_request_finished(ReqContext("r"))
    check_hook_error(exc, "request_finished")
    assert told == ["r"]  # tryfirst ran before the raising plugin


def test_raising_admission_leaves_prepare_store_without_effect(
    pm: KVOffloadPluginManager,
) -> None:
    boom = Boom("store_admission")
    pm.register(boom, name="boom")
    m = CPUOffloadingManager(2, enable_events=True, plugin_manager=pm)
    ctx = ReqContext("r")
    pm.unregister(boom)
    store(m, ctx, 1, 2)  # full; the next store needs evictions
    m.take_events()
    pm.register(boom, name="boom")
    before = m.get_stats()
    with pytest.raises(HookError) as exc:
        m.prepare_store(ks(3, 4), ctx)
    check_hook_error(exc, "store_admission")
    assert m.get_stats() == before
    assert [m.lookup(key, ctx) for key in ks(1, 2, 3, 4)] == [HIT, HIT, MISS, MISS]
    assert m.take_events() == []
    pm.unregister(boom)
    assert store(m, ctx, 3, 4) == ks(3, 4)


def test_raising_blocks_evicted_leaves_the_eviction_done(pm: KVOffloadPluginManager) -> None:
    """The eviction and the allocation stand. The caller gets no ``PrepareStoreOutput``, but
    the new keys are pending and can be given back with ``complete_store(success=False)``."""
    pm.register(Boom("blocks_evicted"), name="boom")
    m = CPUOffloadingManager(2, plugin_manager=pm)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    with pytest.raises(HookError) as exc:
        m.prepare_store(ks(3), ctx)
    check_hook_error(exc, "blocks_evicted")
    assert m.lookup(k(1), ctx) is MISS and m.lookup(k(3), ctx) is PENDING
    stats = m.get_stats()
    assert (stats.evictions, stats.pending_blocks, stats.free_blocks) == (1, 1, 0)
    m.complete_store(ks(3), ctx, success=False)
    assert m.num_free_blocks == 1


def test_raising_cache_reset_still_shuts_down(pm: KVOffloadPluginManager) -> None:
    pm.register(Boom("cache_reset"), name="boom")
    m = CPUOffloadingManager(4, plugin_manager=pm)
    with pytest.raises(HookError):
        m.shutdown()
    with pytest.raises(ManagerError):
        m.prepare_store(ks(1), ReqContext("r"))


def test_hook_error_names_the_instance_that_raised(pm: KVOffloadPluginManager) -> None:
    quiet, loud = Boom(), Boom("blocks_stored")
    pm.register(quiet, name="quiet")
    pm.register(loud, name="loud")  # called first (latest registered)
    m = CPUOffloadingManager(4, plugin_manager=pm)
    with pytest.raises(HookError) as exc:
        store(m, ReqContext("r"), 1)
    assert exc.value.plugin == "loud"


def test_tiered_raising_tier_hook_does_not_drop_other_finished_jobs(
    pm: KVOffloadPluginManager,
) -> None:
    recorder = RecordingPlugin()
    pm.register(recorder)
    pm.register(Boom(f"blocks_stored:{TIER}", "tier_job_finished"), name="boom")
    m = make_tiered(pm, num_blocks=8, names=(TIER, "second"))
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    store(m, ctx, 3)
    assert m.get_stats().jobs_in_flight == 4
    with pytest.raises(HookError) as exc:
        m.on_schedule_end()
    check_hook_error(exc, "tier_job_finished")  # the first error of that step
    stats = m.get_stats()
    assert stats.jobs_in_flight == 0 and stats.cpu.pinned_blocks == 0
    assert [t.cascaded_blocks for t in stats.tiers] == [3, 3]
    assert [len(tier) for tier in m.tiers if isinstance(tier, ScriptedTier)] == [3, 3]
    m.on_schedule_end()  # the errors were reported once
    m.prepare_load(ks(1, 2, 3), ctx)
    m.complete_load(ks(1, 2, 3), ctx)
    assert m.get_stats().cpu.pinned_blocks == 0


def test_tiered_raising_cpu_hook_in_a_promotion_leaves_it_landed(
    pm: KVOffloadPluginManager,
) -> None:
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)  # evicts 1, 2 from the CPU tier; the tier keeps them
    m.on_schedule_end()
    pm.register(Boom("blocks_stored:CPU"), name="boom")
    assert m.lookup(k(1), ctx) is PENDING
    with pytest.raises(HookError) as exc:
        m.on_schedule_end()
    check_hook_error(exc, "blocks_stored")
    assert m.lookup(k(1), ctx) is HIT
    assert m.get_stats().tiers[0].promoted_blocks == 1
    assert not m.has_pending_work()


def test_tiered_raising_cpu_blocks_stored_still_cascades(pm: KVOffloadPluginManager) -> None:
    pm.register(Boom("blocks_stored:CPU"), name="boom")
    m = make_tiered(pm, num_blocks=4)
    ctx = ReqContext("r")
    out = m.prepare_store(ks(1, 2), ctx)
    assert out is not None
    with pytest.raises(HookError) as exc:
        m.complete_store(out.keys_to_store, ctx)
    check_hook_error(exc, "blocks_stored")
    assert m.get_stats().jobs_in_flight == 1
    m.on_schedule_end()
    assert m.get_stats().tiers[0].cascaded_blocks == 2
    assert m.get_stats().cpu.pinned_blocks == 0


def test_tiered_raising_eviction_hook_in_a_promotion_still_promotes(
    pm: KVOffloadPluginManager,
) -> None:
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)
    m.on_schedule_end()
    pm.register(Boom("blocks_evicted"), name="boom")
    with pytest.raises(HookError) as exc:
        m.lookup(k(1), ctx)  # reserves a slot by evicting 3
    check_hook_error(exc, "blocks_evicted")
    assert m.get_stats().promotions_queued == 1
    assert m.lookup(k(1), ctx) is PENDING
    m.on_schedule_end()
    assert m.lookup(k(1), ctx) is HIT


def test_tiered_raising_admission_in_a_promotion_reserves_nothing(
    pm: KVOffloadPluginManager,
) -> None:
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)
    m.on_schedule_end()
    boom = Boom("store_admission")
    pm.register(boom, name="boom")
    before = m.get_stats().cpu
    with pytest.raises(HookError) as exc:
        m.lookup(k(1), ctx)
    check_hook_error(exc, "store_admission")
    after = m.get_stats()
    assert after.promotions_queued == 0
    assert (after.cpu.free_blocks, after.cpu.pending_blocks, after.cpu.evictions) == (
        before.free_blocks,
        before.pending_blocks,
        before.evictions,
    )
    assert m.primary.lookup(k(1), ctx) is MISS
    pm.unregister(boom)
    assert m.lookup(k(1), ctx) is PENDING


def test_tiered_raising_cache_reset_still_resets(pm: KVOffloadPluginManager) -> None:
    m = make_tiered(pm, num_blocks=4)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    pm.register(Boom("cache_reset"), name="boom")
    with pytest.raises(HookError) as exc:
        m.reset_cache()
    check_hook_error(exc, "cache_reset")
    stats = m.get_stats()
    assert stats.cpu.resident_blocks == 0 and stats.tiers[0].cascaded_blocks == 0


# -- registration -----------------------------------------------------------------------------


def test_unknown_hook_name_is_rejected_at_registration(pm: KVOffloadPluginManager) -> None:
    m = CPUOffloadingManager(4, plugin_manager=pm)

    class Typo:
        @hookimpl
        def kv_offload_blocks_stored(self) -> None:
            raise AssertionError("never called")

        @hookimpl
        def kv_offload_blocks_stord(self) -> None:
            raise AssertionError("never called")

    with pytest.raises(PluginValidationError) as exc:
        pm.register(Typo(), name="typo")
    message = str(exc.value)
    assert "hook plugin 'typo' is invalid" in message
    assert "unknown hook 'kv_offload_blocks_stord'" in message
    assert "kv_offload_blocks_stored" in message.split("hook names are")[1]  # the valid ones
    assert (exc.value.kind, exc.value.plugin) == ("hook", "typo")
    assert pm.get_plugin("typo") is None
    assert m.hooks.blocks_stored is None  # nothing of it stays behind
    store(m, ReqContext("r"), 1)


def test_unprefixed_hook_name_is_rejected(pm: KVOffloadPluginManager) -> None:
    class Unprefixed:
        @hookimpl
        def blocks_stored(self) -> None:
            pass

    with pytest.raises(PluginValidationError, match="unknown hook 'blocks_stored'"):
        pm.register(Unprefixed())


def test_wrong_argument_name_is_rejected_at_registration(pm: KVOffloadPluginManager) -> None:
    class WrongArgs:
        @hookimpl
        def kv_offload_blocks_evicted(self, manager: Any, blocks: list[OffloadKey]) -> None:
            pass

    with pytest.raises(PluginValidationError) as exc:
        pm.register(WrongArgs(), name="wrong-args")
    message = str(exc.value)
    assert "hook plugin 'wrong-args' is invalid" in message
    assert "kv_offload_blocks_evicted" in message and "'blocks'" in message
    assert pm.get_plugin("wrong-args") is None
    assert not pm.hook.kv_offload_blocks_evicted.get_hookimpls()


def test_module_plugin_and_subset_of_arguments(
    pm: KVOffloadPluginManager, make_module: ModuleFactory
) -> None:
    name = make_module(
        """
        from kv_offload import hookimpl

        seen = []

        @hookimpl
        def kv_offload_blocks_stored(keys, medium):
            seen.append((len(keys), medium))
        """
    )
    module = __import__(name)
    pm.register(module)
    store(CPUOffloadingManager(4, plugin_manager=pm), ReqContext("r"), 1, 2)
    assert module.seen == [(2, "CPU")]


# -- policies and tiers that implement hooks --------------------------------------------------

HOOKED_POLICY = """
from kv_offload import hookimpl
from kv_offload_lru import LRUCachePolicy


class HookedLRU(LRUCachePolicy):
    '''LRU that counts the requests it saw start and the blocks stored by its manager.'''

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.events = []

    @hookimpl
    def kv_offload_request_started(self, req_context):
        self.events.append(("started", req_context.req_id))

    @hookimpl
    def kv_offload_blocks_stored(self, keys, medium):
        self.events.append(("stored", medium, len(keys)))

    @hookimpl
    def kv_offload_shutdown(self, manager):
        self.events.append(("shutdown",))
"""


@pytest.fixture
def hooked_policy(make_module: ModuleFactory) -> Iterator[str]:
    name = make_module(HOOKED_POLICY)
    CachePolicyFactory.register_cache_policy("hooked-lru-test", name, "HookedLRU")
    yield "hooked-lru-test"
    CachePolicyFactory.unregister_cache_policy("hooked-lru-test")


def test_policy_with_hookimpls_is_registered_and_unregistered_at_shutdown(
    pm: KVOffloadPluginManager, hooked_policy: str
) -> None:
    m = CPUOffloadingManager(4, cache_policy=hooked_policy, plugin_manager=pm)
    policy: Any = m.policy
    assert policy in pm.get_plugins()
    ctx = ReqContext("r")
    m.on_new_request(ctx)
    store(m, ctx, 1, 2)
    m.shutdown()
    assert policy not in pm.get_plugins()
    assert policy.events == [("started", "r"), ("stored", "CPU", 2), ("shutdown",)]


def test_policy_without_hookimpls_is_not_registered(pm: KVOffloadPluginManager) -> None:
    CPUOffloadingManager(4, cache_policy="lru", plugin_manager=pm)
    CPUOffloadingManager(4, cache_policy="arc", plugin_manager=pm)
    assert pm.get_plugins() == set()


def test_policy_with_invalid_hookimpl_fails_the_manager(
    pm: KVOffloadPluginManager, make_module: ModuleFactory
) -> None:
    name = make_module(
        """
        from kv_offload import hookimpl
        from kv_offload_lru import LRUCachePolicy

        class BadHookLRU(LRUCachePolicy):
            @hookimpl
            def kv_offload_blocks_evicted(self, victims):
                pass
        """
    )
    CachePolicyFactory.register_cache_policy("bad-hook-lru-test", name, "BadHookLRU")
    try:
        with pytest.raises(PluginValidationError, match=r"(?s)BadHookLRU@.*'victims'"):
            CPUOffloadingManager(4, cache_policy="bad-hook-lru-test", plugin_manager=pm)
    finally:
        CachePolicyFactory.unregister_cache_policy("bad-hook-lru-test")
    assert pm.get_plugins() == set()


class VictimCacheTier(ExampleSecondaryTierManager):
    """A tier that reacts to CPU evictions: the blocks the CPU tier just dropped become the
    most recently used here, so this tier's own LRU keeps them longest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evictions: list[list[OffloadKey]] = []

    @hookimpl
    def kv_offload_blocks_evicted(self, keys: list[OffloadKey], medium: str) -> None:
        if medium == "CPU":
            self.evictions.append(list(keys))
            self.touch(keys, ReqContext("victim-cache"))


def test_tier_reacting_to_cpu_evictions(pm: KVOffloadPluginManager) -> None:
    m = make_tiered(pm, num_blocks=2, tier_cls=VictimCacheTier, capacity_blocks=3)
    tier = m.tiers[0]
    assert isinstance(tier, VictimCacheTier)
    assert tier in pm.get_plugins()
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3)  # the CPU tier evicts 1; the tier now ranks 1 above 2
    m.on_schedule_end()
    assert [[num(key) for key in batch] for batch in tier.evictions] == [[1]]
    store(m, ctx, 4)  # CPU evicts 2, which the tier now ranks above 3 (still in the CPU)
    m.on_schedule_end()  # the cascade of 4 fills the tier: it drops its LRU block, 1
    assert [[num(key) for key in batch] for batch in tier.evictions] == [[1], [2]]
    # A plain LRU tier would hold 2 3 4 in cascade order; this one ranks 2 above 3.
    assert [num(key) for key in tier._rows] == [3, 2, 4]
    m.shutdown()
    assert tier not in pm.get_plugins()
    assert pm.get_plugins() == set()


# -- plugin discovery switches (fake entry points; real distributions: test_hook_discovery) --

PLUGIN_MODULE = """
from kv_offload import hookimpl

stored = []

@hookimpl
def kv_offload_blocks_stored(keys):
    stored.append(len(keys))
"""


@pytest.fixture
def fake_entry_points(
    make_module: ModuleFactory, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Entry points ``alpha``, ``beta`` (working) and ``broken`` in ``kv_offload.hooks``;
    returns their module names. The switches' environment variables start unset."""
    modules = {
        "alpha": make_module(PLUGIN_MODULE, prefix="kvo_hook_alpha"),
        "beta": make_module(PLUGIN_MODULE, prefix="kvo_hook_beta"),
        "broken": make_module("raise ImportError('no native lib')\n", prefix="kvo_hook_broken"),
    }
    eps = [
        metadata.EntryPoint(name, module, hooks_module.HOOK_ENTRY_POINT_GROUP)
        for name, module in modules.items()
    ]

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(hooks_module, "metadata", types.SimpleNamespace(entry_points=entry_points))
    for var in (hooks_module.AUTOLOAD_DISABLE_ENV, hooks_module.ALLOW_ENV, hooks_module.BLOCK_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(hooks_module.BLOCK_ENV, "broken")
    return modules


def loaded(pm: KVOffloadPluginManager, modules: dict[str, str]) -> dict[str, tuple[bool, bool]]:
    return {
        name: (pm.get_plugin(name) is not None, module in sys.modules)
        for name, module in modules.items()
        if name != "broken"
    }


def test_env_autoload_loads_entry_points(fake_entry_points: dict[str, str]) -> None:
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}
    store(CPUOffloadingManager(4, plugin_manager=pm), ReqContext("r"), 1, 2, 3)
    assert sys.modules[fake_entry_points["alpha"]].stored == [3]


def test_env_disable_autoload(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}
    assert pm.get_plugins() == set()


def test_env_allow_list(fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "beta")
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}


def test_allow_argument_adds_to_the_env_allow_list(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "beta")
    pm = create_plugin_manager(allow=["alpha"])
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}


def test_env_block_list_never_imports(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_BLOCK_PLUGINS", "alpha, broken")
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "alpha beta")  # blocking beats allowing
    pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}
    assert pm.is_blocked("alpha")
    assert pm.register(types.SimpleNamespace(), name="alpha") is None  # stays blocked


def test_autoload_false_ignores_entry_points(fake_entry_points: dict[str, str]) -> None:
    pm = create_plugin_manager(autoload=False, plugins=[NoOpObserver()])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}
    assert len(pm.get_plugins()) == 1


def test_broken_entry_point_is_a_plugin_import_error(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KV_OFFLOAD_BLOCK_PLUGINS")
    with pytest.raises(PluginImportError) as exc:
        create_plugin_manager()
    assert (exc.value.kind, exc.value.plugin) == ("hook", "broken")
    assert "hook plugin 'broken'" in str(exc.value)
    assert "KV_OFFLOAD_BLOCK_PLUGINS=broken" in str(exc.value)


def test_default_plugin_manager_is_shared_and_autoloaded(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks_module, "_default", None)
    pm = get_plugin_manager()
    assert pm is get_plugin_manager()
    assert pm.get_plugin("alpha") is not None
    m = CPUOffloadingManager(4)
    assert m.plugin_manager is pm
    other = create_plugin_manager(autoload=False)
    assert CPUOffloadingManager(4, plugin_manager=other).plugin_manager is other


def test_raising_eviction_hook_hands_back_the_store_output(pm: KVOffloadPluginManager) -> None:
    """prepare_store took effect (slots allocated, pending): the error carries its output so
    the caller can still write and complete the blocks; nothing leaks."""
    pm.register(Boom("blocks_evicted"), name="boom")
    m = CPUOffloadingManager(1, plugin_manager=pm)
    ctx = ReqContext("r")
    first = m.prepare_store(ks(1), ctx)
    assert first is not None
    m.complete_store(first.keys_to_store, ctx)
    with pytest.raises(HookError) as info:
        m.prepare_store(ks(2), ctx)
    output = info.value.result
    assert output is not None and output.keys_to_store == ks(2)
    assert output.evicted_keys == ks(1)
    assert m.lookup(k(2), ctx) is LookupResult.PENDING
    m.complete_store(output.keys_to_store, ctx)
    assert m.lookup(k(2), ctx) is LookupResult.HIT
    stats = m.get_stats()
    assert (stats.pending_blocks, stats.pinned_blocks, stats.free_blocks) == (0, 0, 0)


def test_shutdown_hook_fires_even_when_cache_reset_raises(pm: KVOffloadPluginManager) -> None:
    seen: list[str] = []

    class Recorder:
        @hookimpl
        def kv_offload_shutdown(self) -> None:
            seen.append("shutdown")

    pm.register(Recorder(), name="recorder")
    pm.register(Boom("cache_reset"), name="boom")
    m = CPUOffloadingManager(4, plugin_manager=pm)
    with pytest.raises(HookError, match="boom"):
        m.shutdown()
    assert seen == ["shutdown"]
