"""The tier-job hook's ``seconds``: from a job's submission to the manager collecting its
result, measured against a tier whose device takes a known time per job; hookimpls written
before the argument existed keep working."""

from __future__ import annotations

from typing import Any

from kv_offload import ReqContext, build_manager, make_offload_key
from kv_offload.plugins import create_plugin_manager, hookimpl

DELAY = 0.02  # seconds per job on the faulty tier's serial device


class Timed:
    def __init__(self) -> None:
        self.seconds: list[tuple[str, float]] = []

    @hookimpl
    def kv_offload_tier_job_finished(self, direction: str, seconds: float) -> None:
        self.seconds.append((direction, seconds))


class Legacy:
    """Takes the arguments the hook had before ``seconds``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def kv_offload_tier_job_finished(
        self, manager: Any, tier: str, direction: str, keys: list[Any], success: bool, nbytes: int
    ) -> None:
        self.calls.append(dict(tier=tier, direction=direction, n=len(keys), ok=success))


def test_seconds_spans_submission_to_result() -> None:
    timed, legacy = Timed(), Legacy()
    manager = build_manager(
        {
            "num_blocks": 8,
            "block_size_bytes": 64,
            "tiers": [{"type": "faulty", "delay_s": DELAY, "inner": {"type": "example"}}],
        },
        plugin_manager=create_plugin_manager(autoload=False, plugins=[timed, legacy]),
    )
    ctx = ReqContext("r")
    keys = [make_offload_key(i) for i in range(3)]
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)  # one cascade job
    manager.drain()
    manager.shutdown()
    assert [d for d, _ in timed.seconds] == ["store"]
    ((_, seconds),) = timed.seconds
    assert DELAY <= seconds < DELAY + 5  # at least the device time; drain polls with backoff
    assert legacy.calls == [dict(tier="faulty", direction="store", n=3, ok=True)]
