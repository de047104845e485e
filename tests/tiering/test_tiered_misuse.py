"""Misuse of the tiered manager's API gets the CPU manager's clear errors, with nothing
changed: keys that are not bytes, a second complete_load of a block a cascade also pins, a
tier filter on a CPU-only manager, and any call after shutdown. The tiers are real (the
example tier, the faulty wrapper holding cascade results, the fs tier on real files)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tiers import block_bytes, faulty_tier, key
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
)
from kv_offload.errors import InvalidArgumentError, InvalidKeyError, KeyStateError, ManagerError
from kv_offload.tier_types import TierFilter
from kv_offload.tiering import OffloadingConfig

HIT = LookupResult.HIT
BLOCK = 256


def _slow_stack() -> TieringOffloadingManager:
    """A cascade stays in flight (pinning its blocks) for three polls."""
    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = faulty_tier(
        OffloadingConfig(4, BLOCK),
        primary.kv_buffer.view,
        "slow",
        capacity_blocks=8,
        delay_polls=3,
        min_delay_polls=3,
    )
    return TieringOffloadingManager(primary, [tier], drain_timeout=5.0)


def _store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    rows = b"".join(block_bytes(k, BLOCK) for k in out.keys_to_store)
    m.kv_buffer.write_blocks(
        out.store_spec.block_ids, np.frombuffer(rows, np.uint8).reshape(-1, BLOCK)
    )
    m.complete_store(out.keys_to_store, ctx)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (42, "key 42 is a int"),
        ("str-key", "key 'str-key' is a str"),
        (None, "key None is a NoneType"),
        ((1, 2), "key (1, 2) is a tuple"),
    ],
    ids=["int", "str", "None", "tuple"],
)
def test_a_key_that_is_not_bytes_is_refused_before_anything_changes(
    tmp_path: Path, bad: Any, named: str
) -> None:
    """With an fs tier, ``prepare_store([key, 42])`` was accepted and the whole cascade job
    then failed on 42, taking the valid key with it. The CPU manager's rule of what a key is
    refuses the call whole, up front; lookup and touch refuse such a value too."""
    config = {
        "num_blocks": 4,
        "block_size_bytes": BLOCK,
        "hooks": {"autoload": False},
        "tiers": [{"type": "fs", "root_dir": str(tmp_path), "capacity_blocks": 16}],
    }
    m = build_manager(config)
    ctx = ReqContext("r")
    before = m.get_stats()
    with pytest.raises(InvalidKeyError, match=re.escape(named) + "; offload keys are bytes"):
        m.prepare_store([key(1), bad], ctx)
    with pytest.raises(InvalidKeyError, match=re.escape(named)):
        m.lookup(bad, ctx)
    with pytest.raises(InvalidKeyError, match=re.escape(named)):
        m.touch([key(1), bad], ctx)
    assert m.get_stats() == before
    _store(m, [1], ctx)  # the good key alone stores and cascades
    m.drain()
    assert m.get_stats().tiers[0].cascaded_blocks == 1
    assert m.get_stats().tiers[0].failed_cascades == 0
    m.shutdown()


def test_a_second_complete_load_does_not_take_a_cascades_pin() -> None:
    m = _slow_stack()
    ctx = ReqContext("r")
    _store(m, [1], ctx)  # the cascade pins key 1 for three polls
    assert m.lookup(key(1), ctx) is HIT
    m.prepare_load([key(1)], ctx)
    m.complete_load([key(1)], ctx)
    with pytest.raises(KeyStateError, match="not pinned by a prepare_load"):
        m.complete_load([key(1)], ctx)
    assert m.primary.ref_count(key(1)) == 1  # still the cascade's pin
    m.drain()  # the cascade unpins its own pin: no error
    assert m.primary.ref_count(key(1)) == 0
    m.shutdown()


def test_a_tier_filter_on_a_cpu_only_manager_names_the_missing_tier() -> None:
    m = CPUOffloadingManager(4)
    with pytest.raises(InvalidArgumentError, match=r"'fs' that this stack does not have"):
        m.on_new_request(ReqContext("r", load_tier_filter=TierFilter(tiers=frozenset({"fs"}))))
    with pytest.raises(InvalidArgumentError, match=r"must be a kv_offload\.TierFilter"):
        m.on_new_request(ReqContext("r", load_tier_filter="fs"))  # type: ignore[arg-type]
    m.on_new_request(ReqContext("r", load_tier_filter=TierFilter()))  # names no tier: fine


CALLS: list[tuple[str, Any]] = [
    ("prepare_load", lambda m, ctx: m.prepare_load([key(1)], ctx)),
    ("complete_load", lambda m, ctx: m.complete_load([key(1)], ctx)),
    ("complete_store", lambda m, ctx: m.complete_store([key(1)], ctx)),
    ("prepare_store", lambda m, ctx: m.prepare_store([key(1)], ctx)),
    ("lookup", lambda m, ctx: m.lookup(key(1), ctx)),
    ("touch", lambda m, ctx: m.touch([key(1)], ctx)),
    ("on_schedule_end", lambda m, ctx: m.on_schedule_end()),
    ("on_request_finished", lambda m, ctx: m.on_request_finished(ctx)),
]


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[name for name, _ in CALLS])
def test_every_call_after_shutdown_says_the_manager_was_shut_down(name: str, call: Any) -> None:
    """``prepare_load``/``complete_load``/``complete_store`` said "key is not in the CPU
    tier" after shutdown, as if the caller had the wrong key."""
    m = _slow_stack()
    ctx = ReqContext("r")
    _store(m, [1], ctx)
    m.lookup(key(1), ctx)
    m.prepare_load([key(1)], ctx)
    m.shutdown()
    with pytest.raises(ManagerError, match=f"{name}: the manager was shut down"):
        call(m, ctx)


def test_a_store_that_waits_for_finished_cascades_is_counted_once() -> None:
    """Every CPU block pinned by a cascade whose result is ready but not yet collected: the
    tiered ``prepare_store`` collects the results and stores, counting one allocation and no
    rejected store (it asked the CPU tier twice and counted both, where vLLM counts once)."""
    primary = CPUOffloadingManager(2, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = faulty_tier(OffloadingConfig(2, BLOCK), primary.kv_buffer.view, "t", capacity_blocks=8)
    m = TieringOffloadingManager(primary, [tier], drain_timeout=5.0)
    ctx = ReqContext("r")
    _store(m, [1, 2], ctx)  # both pinned by the cascade until the next poll
    before = m.get_stats().cpu
    out = m.prepare_store([key(3), key(4)], ctx)
    assert out is not None and out.keys_to_store == [key(3), key(4)]
    after = m.get_stats().cpu
    assert after.rejected_stores == before.rejected_stores == 0
    assert after.allocation_sizes.count == before.allocation_sizes.count + 1
    m.complete_store(out.keys_to_store, ctx, False)
    m.shutdown()
