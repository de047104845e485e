"""The CPU manager knows nothing of tiers, and is handed over to its one owner.

A manager built over a CPU manager (the tiered manager) drives it through
``CPUOffloadingManager.hand_over``: from then on the CPU manager's request flow refuses every
other caller by construction (its entry guard is taken for good), and the owner's calls run
the method bodies without a second guard."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kv_offload import (
    ConcurrentUseError,
    CPUOffloadingManager,
    LookupResult,
    ReqContext,
    TierFilter,
)
from kv_offload.errors import InvalidArgumentError

CPU_PACKAGE = Path(__file__).resolve().parents[2] / "core" / "kv_offload" / "cpu"
CTX = ReqContext("r")


def k(i: int) -> bytes:
    return i.to_bytes(8, "big")


def test_the_cpu_package_names_no_tier_cascade_or_promotion() -> None:
    """The CPU cache has one API, the engine's, and an owner's view of the same flow
    (``handover``); what a tiered stack adds lives in ``kv_offload.tiering``."""
    word = re.compile(r"tier|cascad|promot", re.IGNORECASE)
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(CPU_PACKAGE.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if word.search(line)
    ]
    assert len(list(CPU_PACKAGE.glob("*.py"))) > 5
    assert found == []


class Owner:
    """A manager built over a CPU manager (the tiered manager is the real one)."""


def stored(m: CPUOffloadingManager, *ids: int) -> None:
    out = m.prepare_store([k(i) for i in ids], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)


def test_after_the_hand_over_only_the_owner_drives_the_manager() -> None:
    m = CPUOffloadingManager(4)
    stored(m, 1)
    owner = Owner()
    calls = m.hand_over(owner)
    assert m.owner is owner
    for method, call in [
        ("lookup", lambda: m.lookup(k(1), CTX)),
        ("prepare_store", lambda: m.prepare_store([k(2)], CTX)),
        ("on_new_request", lambda: m.on_new_request(CTX)),
        ("reset_cache", m.reset_cache),
    ]:
        with pytest.raises(ConcurrentUseError) as info:
            call()
        error = info.value
        assert (error.method, error.manager, error.owner, error.reentrant) == (
            method,
            "CPUOffloadingManager",
            "Owner",
            False,
        )
    assert m.get_stats().lookups == 0 and m.ref_count(k(1)) == 0  # snapshot reads stay open
    assert calls.lookup(k(1), CTX) is LookupResult.HIT  # the owner's calls run the bodies
    assert calls.pin([k(1)], CTX, "copy") == [m.block_id(k(1))]
    assert m.ref_count(k(1)) == 1
    assert calls.unpin([k(1)], CTX, "copy") == 1


def test_a_manager_has_one_owner() -> None:
    m = CPUOffloadingManager(4)
    m.hand_over(Owner())
    with pytest.raises(InvalidArgumentError, match="already handed over to a Owner"):
        m.hand_over(Owner())


def test_the_owner_hears_of_evictions_before_the_slots_are_reused() -> None:
    m = CPUOffloadingManager(2, block_size_bytes=8)
    seen: list[tuple[list[bytes], list[int]]] = []
    calls = m.hand_over(Owner(), on_evict=lambda keys, slots: seen.append((keys, list(slots))))
    for i in (1, 2):
        out = calls.prepare_store([k(i)], CTX)
        assert out is not None
        calls.complete_store(out.keys_to_store, CTX, True)
    slot = m.block_id(k(1))
    out = calls.prepare_store([k(3)], CTX)
    assert out is not None and out.evicted_keys == [k(1)]
    assert seen == [([k(1)], [slot])]


def test_the_owner_resolves_the_load_filter_itself() -> None:
    ctx = ReqContext("f", load_tier_filter=TierFilter(tiers={"fs"}))
    alone = CPUOffloadingManager(4)
    with pytest.raises(InvalidArgumentError, match="'fs' that this stack does not have"):
        alone.on_new_request(ctx)
    CPUOffloadingManager(4).hand_over(Owner()).start_request(ctx)  # the owner checks it
