"""Issue 25: a fleet of engine processes sharing a real ``redis-server``: what a shared tier
buys N engines (each engine finds the blocks the others cascaded), bytes verified across
engines, against the same fleet with nothing shared."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from _redis_servers import PASSWORD_ENV, RedisServer
from test_cli import TRACE, kvo_many

CPU_ONLY = "num_blocks = 200\nblock_size_bytes = 1024\n"


def test_engines_sharing_redis_beat_isolated_engines(
    tmp_path: Path, redis_server: RedisServer, password_env: str
) -> None:
    shared = tmp_path / "shared.toml"
    shared.write_text(
        CPU_ONLY
        + '[[tiers]]\ntype = "redis"\n'
        + f'url = "{redis_server.url()}"\npassword_env = "{PASSWORD_ENV}"\n'
        + f'namespace = "fleet-{uuid.uuid4().hex[:8]}"\n'
    )
    isolated = tmp_path / "isolated.toml"
    isolated.write_text(CPU_ONLY)
    # 20x (8 s of trace), not 100x: at 100x a busy machine delays the cascades to Redis past
    # the peers' lookups, and the shared share fell to 0.03 (0.10 on a quiet one).
    run = ["--limit", "500", "--speed", "20", "--engines", "3", "--json", "--no-progress"]
    with_redis, without = kvo_many(
        ["replay", shared, TRACE, *run],
        ["replay", isolated, TRACE, *run],
        env={PASSWORD_ENV: redis_server.password or ""},
    )
    assert with_redis.returncode == 0, with_redis.stderr
    assert without.returncode == 0, without.stderr
    fleet = json.loads(with_redis.stdout)
    alone = json.loads(without.stdout)
    assert fleet["fleet"]["shared_tiers"] == ["redis"] and fleet["fleet"]["note"] is None
    assert [e["status"] for e in fleet["engines"]] == ["ok"] * 3
    assert fleet["corrupted_blocks"] == 0 and fleet["verified_blocks"] > 0
    assert fleet["shared_tier_share"] > 0.05
    assert fleet["hit_ratio"] > alone["hit_ratio"] + 0.05
    # Round-robin spreads a session's turns: every engine served blocks from Redis.
    assert all(e["hit_ratio_by_tier"]["redis"] > 0 for e in fleet["engines"])
