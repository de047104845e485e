"""pluggy's own tooling sees the manager's hook calls: ``add_hookcall_monitoring`` and
``enable_tracing`` work on a kv-offload plugin manager as on any pluggy one, and the fast
dispatch comes back when they are switched off."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy
import pytest
from kv_offload import CPUOffloadingManager, ReqContext, make_offload_key
from kv_offload.errors import HookError
from kv_offload.plugins import KVOffloadPluginManager, hookimpl

CTX = ReqContext("r")


class Observer:
    def __init__(self) -> None:
        self.stored: list[list[bytes]] = []

    @hookimpl
    def kv_offload_blocks_stored(self, keys: list[bytes]) -> None:
        self.stored.append(keys)


class Raising:
    @hookimpl
    def kv_offload_blocks_stored(self) -> None:
        raise RuntimeError("boom")


def store(m: CPUOffloadingManager, i: int) -> None:
    out = m.prepare_store([make_offload_key(i)], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)


def monitor(pm: KVOffloadPluginManager) -> tuple[list[str], list[str], Any]:
    before: list[str] = []
    after: list[str] = []

    def on_before(name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
        before.append(name)

    def on_after(
        outcome: pluggy.Result[Any],
        name: str,
        impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        after.append(name)

    return before, after, pm.add_hookcall_monitoring(on_before, on_after)


def test_monitoring_sees_the_manager_hook_calls(pm: KVOffloadPluginManager) -> None:
    observer = Observer()
    pm.register(observer)
    m = CPUOffloadingManager(4, plugin_manager=pm)
    before, after, undo = monitor(pm)
    store(m, 0)
    assert before == after == ["kv_offload_blocks_stored"]
    assert observer.stored == [[make_offload_key(0)]]
    undo()
    store(m, 1)  # direct dispatch again: monitors see nothing, plugins still run
    assert before == ["kv_offload_blocks_stored"]
    assert len(observer.stored) == 2


def test_monitoring_set_before_the_manager_exists(pm: KVOffloadPluginManager) -> None:
    pm.register(Observer())
    before, _, undo = monitor(pm)
    m = CPUOffloadingManager(4, plugin_manager=pm)
    store(m, 0)
    assert before == ["kv_offload_blocks_stored"]
    undo()
    undo()  # a second undo changes nothing
    assert not pm.monitored


def test_enable_tracing_writes_the_manager_hook_calls(pm: KVOffloadPluginManager) -> None:
    pm.register(Observer())
    m = CPUOffloadingManager(4, plugin_manager=pm)
    lines: list[str] = []
    pm.trace.root.setwriter(lines.append)
    undo = pm.enable_tracing()
    store(m, 0)
    undo()
    assert any("kv_offload_blocks_stored" in line for line in lines)


def test_a_raising_plugin_is_named_while_monitored(pm: KVOffloadPluginManager) -> None:
    pm.register(Raising(), name="raiser")
    m = CPUOffloadingManager(4, plugin_manager=pm)
    _, after, undo = monitor(pm)
    with pytest.raises(HookError, match="'raiser' raised in kv_offload_blocks_stored") as info:
        store(m, 0)
    assert info.value.plugin == "raiser"
    assert after == ["kv_offload_blocks_stored"]
    undo()
    assert m.ref_count(make_offload_key(0)) == 0  # the store took effect


def test_a_raising_plugin_is_named_on_the_fast_path(pm: KVOffloadPluginManager) -> None:
    pm.register(Observer(), name="quiet")
    pm.register(Raising(), name="raiser")
    m = CPUOffloadingManager(4, plugin_manager=pm)
    with pytest.raises(HookError) as info:
        store(m, 0)
    assert info.value.plugin == "raiser"
    assert isinstance(info.value.__cause__, RuntimeError)
