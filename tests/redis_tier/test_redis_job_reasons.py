"""Every failed Redis job says why: the reason the tier puts in its ``JobResult`` reaches the
``kv_offload_tier_job_finished`` hook (and the logs an operator reads), for each way a job
fails: a server that is down, too many jobs in flight, a value that fails its check."""

from __future__ import annotations

import uuid
from typing import Any

from _redis_servers import RedisServer
from _redis_stack import redis_stack, resolve, store
from _tiers import key
from kv_offload import LookupResult, ReqContext, TieringOffloadingManager
from kv_offload.plugins import hookimpl


class Reasons:
    """Records (direction, success, reason) of every tier job the manager collects."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, bool, str | None]] = []

    @hookimpl
    def kv_offload_tier_job_finished(self, direction: str, success: bool, reason: Any) -> None:
        self.jobs.append((direction, success, reason))

    def failed(self, direction: str) -> list[str | None]:
        return [r for d, ok, r in self.jobs if d == direction and not ok]


def stack(
    server: RedisServer, password_env: str, **tier: Any
) -> tuple[TieringOffloadingManager, Reasons]:
    manager = redis_stack(
        server.url(), password_env=password_env, namespace=f"why-{uuid.uuid4().hex[:8]}", **tier
    )
    reasons = Reasons()
    manager.plugin_manager.register(reasons)
    return manager, reasons


def test_a_dead_server_fails_cascades_naming_it(own_server: RedisServer, password_env: str) -> None:
    manager, reasons = stack(
        own_server, password_env, timeout_s=0.5, connect_timeout_s=0.5, retry_after_s=5.0
    )
    own_server.kill()
    for i in range(4):
        store(manager, [key(i)], ReqContext(req_id=f"r{i}"))
        manager.drain(10.0)
    failed = reasons.failed("store")
    assert len(failed) == 4, reasons.jobs
    assert all(r for r in failed), failed
    # The first finds the server unreachable; later ones fail at once on its open breaker.
    assert "unreachable" in failed[0] and "ConnectionError" in failed[0], failed[0]
    assert any("is down; retrying later" in r for r in failed[1:] if r), failed
    assert all(own_server.url().split("@")[-1].split("/")[0] in r for r in failed if r), failed
    manager.plugin_manager.unregister(reasons)
    manager.shutdown()


def test_jobs_refused_over_max_in_flight_say_so(
    redis_server: RedisServer, password_env: str
) -> None:
    manager, reasons = stack(redis_server, password_env, max_in_flight=1)
    for i in range(3):  # three cascades submitted before the manager polls any result
        store(manager, [key(i)], ReqContext(req_id=f"r{i}"))
    manager.drain()
    failed = reasons.failed("store")
    assert failed == ["1 jobs in flight already (max_in_flight)"] * 2, reasons.jobs
    manager.plugin_manager.unregister(reasons)
    manager.shutdown()


def test_a_corrupt_value_fails_its_promotion_saying_why(
    redis_server: RedisServer, password_env: str
) -> None:
    manager, reasons = stack(redis_server, password_env)
    k = key(7)
    store(manager, [k], ReqContext(req_id="w"))
    manager.drain()
    manager.reset_cache()
    raw = redis_server.client()
    (name,) = [n for n in raw.scan_iter(match=b"why-*") if n.endswith(k.hex().encode())]
    raw.set(name, b"not a kv-offload block at all, " * 10)
    assert resolve(manager, [k], ReqContext(req_id="read")) == [LookupResult.MISS]
    failed = reasons.failed("load")
    assert len(failed) == 1 and failed[0] is not None, reasons.jobs
    assert failed[0].startswith("corrupt value:"), failed[0]
    raw.close()
    manager.plugin_manager.unregister(reasons)
    manager.shutdown()
