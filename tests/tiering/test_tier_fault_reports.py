"""Issue 10 #9, #13: a tier whose ``lookup`` or ``submit_*`` raises is contained, counted in
``tier_stats()`` and reported rate-limited (first traceback, then summaries)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kv_offload import LookupResult, ReqContext, TieringOffloadingManager, build_manager
from kv_offload import make_offload_key as k
from kv_offload.tiering.faults import TierFaults

BLOCK = 256
CTX = ReqContext(req_id="faults")


def stack(**faults: Any) -> TieringOffloadingManager:
    manager = build_manager(
        {
            "num_blocks": 8,
            "block_size_bytes": BLOCK,
            "tiers": [
                {"type": "faulty", "name": "bad", "inner": {"type": "example"}, **faults},
                {"type": "example", "name": "good"},
            ],
        }
    )
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def store(manager: TieringOffloadingManager, keys: list[bytes]) -> None:
    out = manager.prepare_store(keys, CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.on_schedule_end()


def test_a_raising_lookup_is_a_miss_for_that_tier(caplog: pytest.LogCaptureFixture) -> None:
    manager = stack(lookup_raise_rate=1.0)
    store(manager, [k(1), k(2)])
    manager.reset_cache()  # CPU empty: lookups go to the tiers
    with caplog.at_level(logging.WARNING, "kv_offload.tiering"):
        # The raising tier is skipped; the next tier still serves the key.
        assert manager.lookup(k(1), CTX) is LookupResult.PENDING
        assert manager.lookup(k(9), CTX) is LookupResult.MISS
        manager.on_schedule_end()
        manager.drain()
    assert manager.lookup(k(1), CTX) is LookupResult.HIT
    bad, good = manager.tier_stats()
    assert bad.lookup_errors == 2 and bad.lookup_hits == 0
    assert good.lookup_hits == 1 and good.promoted_blocks == 1
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, caplog.text  # the first failure only
    assert "'bad' raised from lookup()" in tracebacks[0].getMessage()
    manager.shutdown()


def test_raising_submits_log_once_then_count(caplog: pytest.LogCaptureFixture) -> None:
    manager = stack(raise_rate=1.0)
    with caplog.at_level(logging.WARNING, "kv_offload.tiering"):
        for i in range(5):
            store(manager, [k(10 + i)])
    bad, good = manager.tier_stats()
    assert bad.submit_errors == 5 and bad.failed_cascades == 5
    assert good.cascaded_blocks == 5
    assert manager.primary.ref_count(k(10)) == 0  # the failed cascades released their pins
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, caplog.text
    assert "submit_store()" in tracebacks[0].getMessage()
    manager.shutdown()


def test_summaries_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    reporter = TierFaults("t")
    reporter.interval = 0.0  # every later failure due for a summary
    with caplog.at_level(logging.WARNING, "kv_offload.tiering"):
        reporter.report("lookup", ValueError("first"), "a miss")
        reporter.report("lookup", ValueError("second"), "a miss")
        reporter.report("submit_load", OSError("other kind"), "failed")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "1 more time(s)" in messages[1] and "ValueError: second" in messages[1]
    assert caplog.records[2].exc_info  # a new kind gets its own traceback
    slow = TierFaults("t")  # the default interval: later failures only counted
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kv_offload.tiering"):
        for _ in range(100):
            slow.report("lookup", ValueError("x"), "a miss")
    assert len(caplog.records) == 1
