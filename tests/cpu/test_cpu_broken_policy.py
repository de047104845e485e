"""Issue 37: a policy whose ``get()`` raises, or whose ``insert()`` drops blocks, is named with
the contract it broke (a :class:`~kv_offload.PluginError`), not reported as a bare
``RuntimeError`` or as the caller's mistake ("it was never prepared for storing").

The policies are the real LRU plugin with one method broken, loaded as plugins are.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _dists import ModuleFactory
from kv_offload import CPUOffloadingManager, LookupResult, PluginError, ReqContext
from kv_offload import make_offload_key as key

CTX = ReqContext(req_id="broken-policy")

BROKEN_LRU = """
from kv_offload_lru import LRUCachePolicy


class GetRaises(LRUCachePolicy):
    def fast_get(self):
        return self.get

    def get(self, key):
        raise RuntimeError("index corrupted")


class DropsInserts(LRUCachePolicy):
    def insert_many(self, keys, blocks):  # loses every second block
        super().insert_many(keys[::2], blocks[::2])
"""


@pytest.fixture
def broken(
    make_module: ModuleFactory, register_policy: Callable[..., None]
) -> Callable[[str], CPUOffloadingManager]:
    module = make_module(BROKEN_LRU)

    def build(name: str) -> CPUOffloadingManager:
        register_policy(name.lower(), module, name)
        return CPUOffloadingManager(4, cache_policy=name.lower())

    return build


def test_a_policy_whose_get_raises_is_named(
    broken: Callable[[str], CPUOffloadingManager],
) -> None:
    """It was a bare ``RuntimeError: index corrupted`` out of ``lookup``."""
    m = broken("GetRaises")
    for call in (
        lambda: m.lookup(key(1), CTX),
        lambda: m.prepare_store([key(1)], CTX),
        lambda: m.prepare_load([key(1)], CTX),
    ):
        with pytest.raises(PluginError, match="broke the get\\(\\) contract") as info:
            call()
        assert info.value.plugin == "getraises" and info.value.kind == "policy"
        assert "RuntimeError: index corrupted" in str(info.value)
        assert isinstance(info.value.__cause__, RuntimeError)
    assert m.get_stats().lookups == 0 and m.num_free_blocks == 4


def test_a_policy_whose_insert_drops_blocks_is_named_and_no_slot_stays_pending(
    broken: Callable[[str], CPUOffloadingManager],
) -> None:
    """It was "key ... is not in the CPU tier; it was never prepared for storing" (it was),
    and the lost blocks' slots stayed pending forever."""
    m = broken("DropsInserts")
    out = m.prepare_store([key(i) for i in range(4)], CTX)
    assert out is not None and out.keys_to_store == [key(i) for i in range(4)]
    with pytest.raises(PluginError, match="broke the insert\\(\\) contract") as info:
        m.complete_store(out.keys_to_store, CTX)
    assert info.value.plugin == "dropsinserts"
    assert "never prepared" not in str(info.value)
    assert repr(key(1)) in str(info.value) and repr(key(3)) in str(info.value)
    stats = m.get_stats()
    assert (stats.pending_blocks, stats.free_blocks) == (2, 2)  # the lost slots are free
    m.complete_store([key(0), key(2)], CTX)  # the blocks the policy kept complete
    assert [m.lookup(key(i), CTX) for i in range(4)] == [LookupResult.HIT, LookupResult.MISS] * 2
    assert m.get_stats().resident_blocks == 2
