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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _hook_helpers import (
    BLOCK,
    HIT,
    PENDING,
    TIER,
    ScriptedTier,
    k,
    ks,
    make_tiered,
    num,
    store,
)
from _hook_plugins import EVENT_HOOKS, SPECS, NoOpObserver, RecordingPlugin
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.plugins import KVOffloadPluginManager, create_plugin_manager, hookimpl, hookspecs

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
    tier.whole = ("b",)  # b is sent to the tier whole (prefix hits too)
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
    tier.pressure.on = True
    step("prepare_store(b, 0) under pressure", m.prepare_store, ks(0), b)  # cascade dropped
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
        if "seconds" in norm:  # a latency: only its type and sign are the script's
            seconds = norm.pop("seconds")
            assert isinstance(seconds, float) and seconds >= 0, (hook, seconds)
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
            "reason": None,  # the scripted tier gives no reason for its failures
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
        "prepare_store(b, 0) under pressure": ["cascade_dropped"],
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


def test_hook_cascade_dropped(scripted: Scripted) -> None:
    # b's block 0 is in the CPU tier; b is request-level, so prepare_store cascades it, and
    # the tier's gate sheds that cascade.
    assert scripted.calls("cascade_dropped") == [
        (
            "prepare_store(b, 0) under pressure",
            {"manager": "tiered", "tier": TIER, "keys": [0], "reason": "pressure",
             "req_context": "b"},
        ),
    ]  # fmt: skip


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


def test_generated_plugins_take_every_argument_of_their_specs(pm: KVOffloadPluginManager) -> None:
    """The benchmark's no-op observer costs what a full observer costs, and the recorder sees
    everything: pluggy passes each implementation exactly the spec's arguments."""
    pm.register(NoOpObserver(), name="noop")
    pm.register(RecordingPlugin(), name="recorder")
    for name in SPECS:
        spec = inspect.signature(getattr(hookspecs, "kv_offload_" + name)).parameters
        impls = {i.plugin_name: i for i in getattr(pm.hook, "kv_offload_" + name).get_hookimpls()}
        assert impls["recorder"].argnames == tuple(spec), name
        if name in EVENT_HOOKS:
            assert impls["noop"].argnames == tuple(spec), name
        else:
            assert "noop" not in impls, name
