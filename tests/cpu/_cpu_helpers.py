"""Keys, constants and state snapshots shared by the CPU manager tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from kv_offload import (
    CPUOffloadingManager,
    KVOffloadError,
    LookupResult,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from kv_offload.policies import CachePolicyFactory

POLICIES = ("lru", "arc")

HIT = LookupResult.HIT
MISS = LookupResult.MISS
PENDING = LookupResult.PENDING

CTX = ReqContext(req_id="req-0")


def installed_policies() -> set[str]:
    return {info.name for info in CachePolicyFactory.available_policies()}


def k(i: int) -> bytes:
    """The i-th test key."""
    return make_offload_key(i)


# Keys used by the tests; snapshots look at all of them.
UNIVERSE = [k(i) for i in range(32)]

ManagerFactory = Callable[..., CPUOffloadingManager]


def store(manager: CPUOffloadingManager, keys: Iterable[bytes]) -> PrepareStoreOutput:
    """prepare_store + complete_store(success=True); the keys become HIT."""
    out = manager.prepare_store(list(keys), CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    return out


def state_of(manager: CPUOffloadingManager, keys: Iterable[bytes] = UNIVERSE) -> dict[str, Any]:
    """Everything observable without changing state (no lookups: they count)."""
    return {
        "stats": manager.get_stats(),
        "free": manager.num_free_blocks,
        "resident": manager.num_resident_blocks,
        "refs": {key: manager.ref_count(key) for key in keys},
        "slots": {key: manager.block_id(key) for key in keys},
    }


def lookups(manager: CPUOffloadingManager, keys: Iterable[bytes]) -> list[LookupResult]:
    return [manager.lookup(key, CTX) for key in keys]


def check_occupancy(manager: CPUOffloadingManager) -> None:
    stats = manager.get_stats()
    assert manager.num_free_blocks + manager.num_resident_blocks == manager.num_blocks
    assert stats.free_blocks == manager.num_free_blocks
    assert stats.resident_blocks == manager.num_resident_blocks
    assert stats.capacity == manager.num_blocks
    assert stats.hits + stats.misses + stats.pending == stats.lookups
    assert (
        stats.pending_blocks + stats.pinned_blocks + stats.evictable_blocks == stats.resident_blocks
    )


def assert_raises_intact(
    manager: CPUOffloadingManager,
    exc_type: type[BaseException],
    call: Callable[[], object],
    *fragments: str,
) -> pytest.ExceptionInfo[BaseException]:
    """``call`` raises ``exc_type`` naming every fragment, and leaves the manager unchanged."""
    before = state_of(manager)
    with pytest.raises(exc_type) as info:
        call()
    assert isinstance(info.value, KVOffloadError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert state_of(manager) == before
    check_occupancy(manager)
    return info
