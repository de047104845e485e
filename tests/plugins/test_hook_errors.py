"""A hook plugin that raises: the manager call's effect stands, every other result of the call
is still processed, and the error names the plugin (see kv_offload.plugins.dispatch)."""

from __future__ import annotations

from typing import Any

import pytest
from _hook_helpers import (
    HIT,
    MISS,
    PENDING,
    TIER,
    ScriptedTier,
    k,
    ks,
    make_tiered,
    store,
)
from _hook_plugins import SPECS, RecordingPlugin
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    ManagerError,
    PluginError,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.errors import HookError
from kv_offload.plugins import KVOffloadPluginManager, hookimpl

from benchmarks.hook_observers import plugin_class

# -- a raising plugin -------------------------------------------------------------------------


class _Raiser:
    """Raises from the hooks named in ``hooks``; ``"blocks_stored:<medium>"`` names that hook
    for one medium only. Every other hook does nothing."""

    def __init__(self, *hooks: str) -> None:
        self.hooks = set(hooks)

    def _maybe(self, hook: str, **arguments: Any) -> None:
        if hook in self.hooks or f"{hook}:{arguments.get('medium')}" in self.hooks:
            raise RuntimeError(f"boom in {hook}")


#: :class:`_Raiser` implementing every hookspec, with the spec's arguments.
Boom = plugin_class("Boom", SPECS, _Raiser, body="return self._maybe({hook!r}, {kwargs})")


def check_hook_error(exc: pytest.ExceptionInfo[HookError], hook: str) -> None:
    error = exc.value
    assert isinstance(error, PluginError)
    assert (error.kind, error.plugin) == ("hook", "boom")
    assert f"hook plugin 'boom' raised in kv_offload_{hook}" in str(error)
    assert isinstance(error.__cause__, RuntimeError)


def evicted_to_the_tier(pm: KVOffloadPluginManager) -> tuple[TieringOffloadingManager, ReqContext]:
    """A 2-block tiered stack after storing 1, 2 then 3, 4: 1 and 2 are only in the tier."""
    m = make_tiered(pm, num_blocks=2)
    ctx = ReqContext("r")
    store(m, ctx, 1, 2)
    m.on_schedule_end()
    store(m, ctx, 3, 4)  # evicts 1, 2 from the CPU tier; the tier keeps them
    m.on_schedule_end()
    return m, ctx


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


def test_an_instance_registered_without_a_name_is_named_by_its_class(
    pm: KVOffloadPluginManager,
) -> None:
    """pluggy names such a plugin ``str(id(plugin))``: the error said ``'140195238491408'``."""
    assert pm.register(Boom()) == "Boom"
    assert pm.register(Boom("blocks_stored")) == "Boom#2"  # names stay unique
    m = CPUOffloadingManager(4, plugin_manager=pm)
    with pytest.raises(HookError, match="hook plugin 'Boom#2' raised") as exc:
        store(m, ReqContext("r"), 1)
    assert exc.value.plugin == "Boom#2"


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
    m, ctx = evicted_to_the_tier(pm)
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
    m, ctx = evicted_to_the_tier(pm)
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
    m, ctx = evicted_to_the_tier(pm)
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
    assert m.primary.ref_count(k(1)) is None
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
