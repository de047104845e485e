"""kv-offload tiers behind a real engine's CPU tier (``HostTieringOffloadingSpec``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _configs import tiering_spec
from _engines import Baseline, EngineRun, Engines, expected, kill, read_until
from _workloads import (
    AGAIN,
    FIRST,
    FS_FIRST,
    FS_MORE,
    FS_WRITE,
    KILLED_FIRST,
    KILLED_MORE,
    REDIS_AUTH_FIRST,
    REDIS_AUTH_MORE,
    REDIS_AUTH_SERVE,
    REDIS_FIRST,
    REDIS_MORE,
    REDIS_SERVE,
    Phase,
)
from redis_tier._redis_servers import RedisServer

#: Offloaded chunks of two 32-token blocks: a chunk and a GPU block differ in size, so a
#: load may start half way into its first chunk.
CHUNK = {"block_size": 64}


def fs_tier(root: Path) -> dict[str, Any]:
    return {"type": "kvo_fs", "root_dir": str(root), "capacity_blocks": 4096}


def block_files(root: Path) -> int:
    """Blocks the fs tier has written to ``root`` (one file each under blocks/)."""
    return sum(1 for path in (root / "blocks").rglob("*") if path.is_file())


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def check(run: EngineRun, baseline: Baseline, *phases: Phase) -> None:
    for phase in phases:
        assert run.outputs(phase.name) == expected(baseline, phase), phase.name


def test_fs_tier_serves_a_restarted_engine(
    engines: Engines, baseline: Baseline, root_dir: Path
) -> None:
    """An engine writes its prompts' blocks to root_dir, shuts down and its process ends; the
    next engine on that root_dir (another process, empty CPU tier) gets them from disk:
    vLLM's tiering chunk hits for the tier, and the same tokens. The Prometheus hook plugin,
    autoloaded in the engine, counts the tier's jobs as vLLM does."""
    config = tiering_spec(fs_tier(root_dir), **CHUNK)
    first = engines.run([FS_WRITE, FS_MORE], config, fresh=True)
    check(first, baseline, FS_WRITE, FS_MORE)
    assert first.metric(FS_MORE.name, "kv_offload_tiering_write_bytes") > 0
    assert block_files(root_dir) > 0, "the first engine wrote no block to root_dir"
    second = engines.run([FS_FIRST, FS_MORE], config, hooks=True)
    check(second, baseline, FS_FIRST, FS_MORE)
    hooks = second.phases[FS_MORE.name]["hooks"]
    assert hooks.get("kv_offload_tier_jobs_total", 0) > 0, hooks
    assert second.metric(FS_FIRST.name, "kv_offload_tiering_chunk_hits{kvo_fs}") > 0
    assert second.metric(FS_FIRST.name, "external_prefix_cache_hits") > 0


def test_fs_tier_after_sigkill(engines: Engines, baseline: Baseline, root_dir: Path) -> None:
    """The engine is killed with SIGKILL while it serves (its fs tier mid-write); the next
    engine opens the same root_dir (nothing left locked), serves every prompt with the same
    tokens, part of them from what the killed engine left on disk."""
    config = tiering_spec(fs_tier(root_dir), **CHUNK)
    victim = engines.start([KILLED_FIRST, KILLED_MORE, KILLED_MORE], config)
    lines = read_until(victim, KILLED_FIRST.name, timeout=240)
    written = wait_for(lambda: block_files(root_dir) > 0, timeout=60)
    kill(victim)
    (record,) = (json.loads(line) for line in lines if '"phase"' in line)
    assert record["outputs"] == expected(baseline, KILLED_FIRST)
    assert written, "the killed engine wrote no block to root_dir in a minute"
    after = engines.run([KILLED_FIRST, KILLED_MORE], config)
    check(after, baseline, KILLED_FIRST, KILLED_MORE)
    assert after.metric(KILLED_FIRST.name, "kv_offload_tiering_chunk_hits{kvo_fs}") > 0


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


#: The secret the Redis tier signs blocks with in the authenticated run (>= 16 bytes).
BLOCK_KEY_ENV = "KVO_ENGINE_BLOCK_KEY"


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "auth_key_env"])
def test_redis_tier_shared_by_two_engines_at_once(
    signed: bool, engines: Engines, baseline: Baseline, redis_server: RedisServer
) -> None:
    """Two engine processes alive at once on one real redis-server. The first serves its
    prompts; the second engine's first request, for one of them, is a hit from Redis; then
    both serve the same prompts at the same time (both loading, and storing, the same blocks
    in Redis). Every token is the one recompute gives. With ``auth_key_env`` every value is
    signed and checked on the way back."""
    serve, more, first = (
        (REDIS_AUTH_SERVE, REDIS_AUTH_MORE, REDIS_AUTH_FIRST)
        if signed
        else (REDIS_SERVE, REDIS_MORE, REDIS_FIRST)
    )
    tier: dict[str, Any] = {"type": "kvo_redis", "url": redis_server.url()}
    env: dict[str, str] = {}
    if signed:
        tier.update(auth_key_env=BLOCK_KEY_ENV, namespace="kvo-engine-signed")
        env[BLOCK_KEY_ENV] = "a-test-secret-of-more-than-16-bytes"
    config = tiering_spec(tier, **CHUNK)
    with (
        engines.open(config, env=env) as one,
        engines.open(config, env=env, server="peer") as two,
    ):
        one.phase(serve)
        one.phase(more)
        check(one.run, baseline, serve, more)
        assert one.run.metric(more.name, "kv_offload_tiering_write_bytes{kvo_redis}") > 0
        assert redis_server.client().dbsize() > 0
        two.phase(first)
        check(two.run, baseline, first)
        assert two.run.metric(first.name, "kv_offload_tiering_chunk_hits{kvo_redis}") > 0
        assert two.run.metric(first.name, "external_prefix_cache_hits") > 0
        # Both at once; each engine's records of `more` are kept apart under its own run.
        one.send(more)
        two.send(more)
        one.receive()
        two.receive()
    check(one.run, baseline, more)
    check(two.run, baseline, more)
    hits = "kv_offload_tiering_chunk_hits{kvo_redis}"
    assert two.run.gained(more.name, hits, first.name) > 0


def test_faulty_tier_failed_loads_and_delays(engines: Engines, baseline: Baseline) -> None:
    """kvo_faulty over the in-memory example tier, half its jobs failed and every result held
    for up to 3 scheduler steps, behind a CPU tier of 16 blocks (most reuse must come back
    from the tier): the same tokens (a failed load is recomputed), no hang (each engine run
    is bounded), and vLLM counts the failed promotions."""
    tier = {
        "type": "kvo_faulty",
        "fail_rate": 0.5,
        "delay_polls": 3,
        "seed": 3,
        "inner": {"type": "example", "capacity_blocks": 4096},
    }
    config = tiering_spec(tier, cpu_bytes=16 * 65536, **CHUNK)
    run = engines.run([FIRST, AGAIN], config, timeout=240)
    check(run, baseline, FIRST, AGAIN)
    assert run.metric(AGAIN.name, "kv_offload_tiering_promotion_job_failures") > 0
    assert run.metric(AGAIN.name, "kv_offload_tiering_chunk_hits") > 0
