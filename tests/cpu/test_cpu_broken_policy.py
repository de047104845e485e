"""Issue 37: a policy whose ``get()`` raises is named with the contract it broke (a
:class:`~kv_offload.PluginError`), not reported as a bare ``RuntimeError``.

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
