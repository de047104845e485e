"""Issue 37: a policy whose ``get()`` raises, or whose ``insert()`` drops blocks, is named with
the contract it broke (a :class:`~kv_offload.PluginError`), not reported as a bare
``RuntimeError`` or as the caller's mistake.

The policies are the real LRU plugin with one method broken, loaded as plugins are.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _dists import ModuleFactory
from kv_offload import CPUOffloadingManager, PluginError, ReqContext
from kv_offload import make_offload_key as key

CTX = ReqContext(req_id="broken-policy")

BROKEN_LRU = """
from kv_offload_lru import LRUCachePolicy


class GetRaises(LRUCachePolicy):
    def fast_get(self):
        return self.get

    def get(self, key):
        raise RuntimeError("index corrupted")


class InsertDrops(LRUCachePolicy):
    # keeps only the first block of each batch it is given

    def insert_many(self, keys, blocks):
        super().insert_many(keys[:1], blocks[:1])
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


def test_a_policy_whose_insert_drops_blocks_is_named(
    broken: Callable[[str], CPUOffloadingManager],
) -> None:
    """It was ``KeyStateError: ... it was never prepared for storing``: the caller's mistake,
    for keys prepare_store had just prepared. Now the policy and what it broke: its insert()
    did not keep the block prepare_store gave it."""
    m = broken("InsertDrops")
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None and out.keys_to_store == [key(1), key(2)]
    with pytest.raises(PluginError, match="'insertdrops' broke the insert\\(\\) contract") as info:
        m.complete_store(out.keys_to_store, CTX)
    assert info.value.plugin == "insertdrops" and info.value.kind == "policy"
    assert "did not keep the block" in str(info.value) and "never prepared" not in str(info.value)
    assert m.get_stats().pending_blocks == 2  # nothing changed by the refused call
    m.reset_cache()
    assert m.get_stats().pending_blocks == 0 and m.num_free_blocks == 4
