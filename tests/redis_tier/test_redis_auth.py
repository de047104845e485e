"""Shared Redis namespaces only trusted engines can fill: authenticated values
(``auth_key_env``) and tenants confined by the server's own ACLs, against real redis-server
processes.

Anyone with write access to a namespace (a raw client here) can plant a value in the public
format with a valid checksum, or copy a real value under another key with its key field
rewritten; with authentication none of it is served (a failed promotion: a MISS), it is counted
and reported once per kind. An ACL user confined to ``~<namespace>:*`` round-trips its blocks
and cannot build a stack on a namespace outside its pattern (a ConfigError at build).
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from pathlib import Path

import pytest
import xxhash
from _redis_servers import PASSWORD, RedisServer, start_cluster
from _redis_stack import BLOCK, assert_quiet, load_and_check, redis_stack, resolve, store
from _tiers import key
from kv_offload import ConfigError, LookupResult, ReqContext, TieringOffloadingManager
from kv_offload_redis_tier import RedisTier
from test_cli import TRACE, kvo_many

HIT, MISS = LookupResult.HIT, LookupResult.MISS
SECRET = "tenant-a-redis-secret-0123456789"
OTHER = "tenant-b-redis-secret-9876543210"
NEXT = "tenant-a-next-redis-secret-abcdef"


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVO_AUTH_A", SECRET)
    monkeypatch.setenv("KVO_AUTH_B", OTHER)
    monkeypatch.setenv("KVO_AUTH_NEXT", NEXT)


def namespace() -> str:
    return f"auth-{uuid.uuid4().hex[:8]}"


def tier_of(manager: TieringOffloadingManager) -> RedisTier:
    tier = manager.tiers[0]
    assert isinstance(tier, RedisTier)
    return tier


def rkey(ns: str, k: bytes) -> bytes:
    return f"{ns}:{k.hex()}".encode()


def writer(server: RedisServer, ns: str, keys: list[bytes], **auth: str) -> None:
    """An engine that stores ``keys`` (bytes derived from the key) into ``ns`` and stops."""
    m = redis_stack(server.url(), password_env="KVO_TEST_REDIS_PASSWORD", namespace=ns, **auth)
    store(m, keys, ReqContext(req_id="w"))
    m.drain()
    m.shutdown()


def reader(server: RedisServer, ns: str, **auth: str) -> TieringOffloadingManager:
    return redis_stack(server.url(), password_env="KVO_TEST_REDIS_PASSWORD", namespace=ns, **auth)


def answers(m: TieringOffloadingManager, keys: list[bytes], name: str) -> list[LookupResult]:
    """Each key's final answer in a request of its own; HITs are loaded, bytes compared."""
    out = []
    for i, k in enumerate(keys):
        ctx = ReqContext(req_id=f"{name}{i}")
        (answer,) = resolve(m, [k], ctx)
        if answer is HIT:
            load_and_check(m, [k], ctx)
        m.on_request_finished(ctx)
        out.append(answer)
    return out


def test_the_right_secret_round_trips_exact_bytes(redis_server: RedisServer) -> None:
    ns = namespace()
    keys = [key(i) for i in range(8)]
    writer(redis_server, ns, keys, auth_key_env="KVO_AUTH_A")
    raw = redis_server.client()
    value = raw.get(rkey(ns, keys[0]))
    raw.close()
    assert value is not None and struct.unpack_from("<H", value, 4)[0] == 2  # signed format
    assert SECRET.encode() not in value
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_A")
    assert answers(m, keys, "r") == [HIT] * 8
    assert tier_of(m).get_stats()["auth_failures"] == 0
    assert_quiet(m)
    m.shutdown()


def test_forged_values_with_valid_checksums_are_never_served(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Planted with a raw client under keys the stack never stored: one in the public
    unsigned format (valid XXH3), one signed-looking with a real value's key id and tag."""
    ns = namespace()
    real = key(1)
    writer(redis_server, ns, [real], auth_key_env="KVO_AUTH_A")
    raw = redis_server.client()
    good = raw.get(rkey(ns, real))
    assert good is not None
    payload = b"\x66" * BLOCK
    unsigned, signed = key(50), key(51)
    head = struct.pack(
        "<4sHHIQQ", b"KVOB", 1, len(unsigned), 0, BLOCK, xxhash.xxh3_64_intdigest(payload)
    )
    raw.set(rkey(ns, unsigned), head + unsigned + payload)
    record = good[20:60]  # the real value's algorithm, key id and tag
    raw.set(
        rkey(ns, signed),
        struct.pack("<4sHHIQ", b"KVOB", 2, len(signed), 0, BLOCK) + record + signed + payload,
    )
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_A")
    with caplog.at_level(logging.WARNING, "kv_offload.redis_tier"):
        assert answers(m, [unsigned, signed, real], "r") == [MISS, MISS, HIT]
        assert answers(m, [unsigned], "again") == [MISS]  # deleted: now simply absent
    stats = tier_of(m).get_stats()
    assert stats["auth_failures"] == 2
    assert stats["auth_failure_kinds"] == {"unsigned": 1, "bad_mac": 1}
    assert raw.exists(rkey(ns, unsigned)) == 0 and raw.exists(rkey(ns, signed)) == 0
    assert m.get_stats().tiers[0].failed_promotions == 2
    reports = [r for r in caplog.records if "failed authentication" in r.getMessage()]
    assert len(reports) == 2  # once per kind
    raw.close()
    assert_quiet(m)
    m.shutdown()


def test_a_real_value_copied_under_another_key_is_never_served(redis_server: RedisServer) -> None:
    ns = namespace()
    keys = [key(1), key(2)]
    writer(redis_server, ns, keys, auth_key_env="KVO_AUTH_A")
    raw = redis_server.client()
    value = bytearray(raw.get(rkey(ns, keys[1])))
    victim = key(3)  # never stored
    value[60 : 60 + len(victim)] = victim  # the key field rewritten
    raw.set(rkey(ns, victim), bytes(value))
    overwritten = bytearray(value)
    overwritten[60 : 60 + len(keys[0])] = keys[0]
    raw.set(rkey(ns, keys[0]), bytes(overwritten))  # and over a real block
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_A")
    assert answers(m, [victim, keys[0], keys[1]], "r") == [MISS, MISS, HIT]
    assert tier_of(m).get_stats()["auth_failure_kinds"] == {"bad_mac": 2}
    raw.close()
    m.shutdown()


def test_a_truncated_signed_value_is_reported_as_truncated(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut inside the key it names, a signed value was logged as "names another key"; cut
    inside the auth record or the payload, it is truncated too. Each is a failed load, counted,
    deleted, and its log line says what happened to it."""
    ns = namespace()
    keys = [key(1), key(2), key(3), key(4)]
    writer(redis_server, ns, keys, auth_key_env="KVO_AUTH_A")
    raw = redis_server.client()
    header = struct.calcsize("<4sHHIQ") + 40  # the signed header: fields, then the record
    cuts = {
        keys[0]: header + len(keys[0]) // 2,  # inside the key
        keys[1]: header - 10,  # inside the auth record
        keys[2]: header + len(keys[2]) + BLOCK // 2,  # inside the payload
    }
    for k, cut in cuts.items():
        raw.set(rkey(ns, k), raw.get(rkey(ns, k))[:cut])
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_A")
    with caplog.at_level(logging.WARNING, "kv_offload.redis_tier"):
        assert answers(m, keys, "r") == [MISS, MISS, MISS, HIT]
    lines = [r.getMessage() for r in caplog.records if "failed its check" in r.getMessage()]
    assert len(lines) == 3, lines
    assert not [line for line in lines if "another key" in line], lines
    assert all("(truncated: " in line for line in lines), lines
    assert "shorter than the header and the key it names" in lines[0]
    assert "shorter than the header (60)" in lines[1]
    assert f"of {BLOCK} payload bytes" in lines[2]
    stats = tier_of(m).get_stats()
    assert (stats["corrupt_values"], stats["auth_failures"]) == (3, 0)
    assert raw.exists(*[rkey(ns, k) for k in cuts]) == 0  # deleted
    raw.close()
    assert_quiet(m)
    m.shutdown()


def test_another_tenants_secret_serves_none_and_leaves_the_values(
    redis_server: RedisServer,
) -> None:
    ns = namespace()
    keys = [key(i) for i in range(4)]
    writer(redis_server, ns, keys, auth_key_env="KVO_AUTH_A")
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_B")
    assert answers(m, keys, "b") == [MISS] * 4
    assert tier_of(m).get_stats()["auth_failure_kinds"] == {"unknown_key": 4}
    m.shutdown()
    raw = redis_server.client()
    assert raw.exists(*[rkey(ns, k) for k in keys]) == 4  # left alone
    raw.close()
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_A")
    assert answers(m, keys, "a") == [HIT] * 4
    m.shutdown()


def test_rotation_reads_both_secrets_and_writes_the_current(redis_server: RedisServer) -> None:
    ns = namespace()
    writer(redis_server, ns, [key(1)], auth_key_env="KVO_AUTH_A")
    rotating = {"auth_key_env": "KVO_AUTH_NEXT", "auth_key_previous_env": "KVO_AUTH_A"}
    writer(redis_server, ns, [key(2)], **rotating)
    m = reader(redis_server, ns, **rotating)
    assert answers(m, [key(1), key(2)], "both") == [HIT, HIT]
    m.shutdown()
    m = reader(redis_server, ns, auth_key_env="KVO_AUTH_NEXT")  # the old secret retired
    assert answers(m, [key(2), key(1)], "next") == [HIT, MISS]
    m.shutdown()


def test_a_stack_without_auth_is_refused_on_an_authenticated_namespace(
    redis_server: RedisServer,
) -> None:
    ns = namespace()
    writer(redis_server, ns, [key(1)], auth_key_env="KVO_AUTH_A")
    with pytest.raises(ConfigError, match="every engine of a namespace must set auth_key_env"):
        reader(redis_server, ns)
    # Had the marker been evicted, the value itself is refused, and left for its tenant.
    raw = redis_server.client()
    raw.delete(f"{ns}:__format__")
    m = reader(redis_server, ns)
    assert answers(m, [key(1)], "plain") == [MISS]
    assert raw.exists(rkey(ns, key(1))) == 1
    raw.close()
    m.shutdown()


# -- tenants confined by the server's ACL -----------------------------------------------------

TENANT_PASSWORD = "tenant-a-redis-password"


def acl_server(directory: Path) -> RedisServer:
    """A server whose users are confined to their namespace, with only the tier's commands."""
    return RedisServer(
        directory,
        password=PASSWORD,
        extra=[
            f"user tenant-a on >{TENANT_PASSWORD} ~tenant-a:* resetchannels -@all "
            "+get +set +exists +del",
            f"user no-del on >{TENANT_PASSWORD} ~tenant-a:* resetchannels -@all +get +set +exists",
        ],
    )


def test_an_acl_confined_user_round_trips_its_namespace_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVO_TENANT_PASSWORD", TENANT_PASSWORD)
    server = acl_server(tmp_path / "acl")
    url = f"redis://tenant-a@127.0.0.1:{server.port}/0"
    try:
        m = redis_stack(
            url, password_env="KVO_TENANT_PASSWORD", namespace="tenant-a",
            auth_key_env="KVO_AUTH_A",
        )  # fmt: skip
        keys = [key(i) for i in range(6)]
        store(m, keys, ReqContext(req_id="w"))
        m.drain()
        m.reset_cache()
        assert answers(m, keys, "r") == [HIT] * 6
        assert_quiet(m)
        m.shutdown()
        with pytest.raises(ConfigError) as info:
            redis_stack(url, password_env="KVO_TENANT_PASSWORD", namespace="tenant-b")
        message = str(info.value)
        assert "namespace 'tenant-b'" in message and "may not run SET" in message, message
        assert info.value.key == "tiers[0].namespace"
        assert TENANT_PASSWORD not in message and PASSWORD not in message
        no_del = f"redis://no-del@127.0.0.1:{server.port}/0"
        with pytest.raises(ConfigError, match="may not run DEL on keys of namespace 'tenant-a'"):
            redis_stack(no_del, password_env="KVO_TENANT_PASSWORD", namespace="tenant-a")
    finally:
        server.stop()


def test_a_cluster_user_confined_to_its_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on every node of a Cluster; the client also needs the slot map
    (``+cluster|slots +command``), and a user without it is a ConfigError saying so."""
    monkeypatch.setenv("KVO_TENANT_PASSWORD", TENANT_PASSWORD)
    confined = "~tenant-a:* resetchannels -@all +get +set +exists +del"
    nodes = start_cluster(
        tmp_path / "cluster",
        extra=[
            f"user tenant-a on >{TENANT_PASSWORD} {confined} +cluster|slots +command",
            f"user no-slots on >{TENANT_PASSWORD} {confined}",
        ],
    )
    try:

        def build(user: str, ns: str) -> TieringOffloadingManager:
            return redis_stack(
                f"redis://{user}@{nodes[0].address}/0", cluster=True,
                startup_nodes=[n.address for n in nodes], password_env="KVO_TENANT_PASSWORD",
                namespace=ns, auth_key_env="KVO_AUTH_A",
            )  # fmt: skip

        m = build("tenant-a", "tenant-a")
        keys = [key(i) for i in range(12)]  # spread over the three masters
        store(m, keys, ReqContext(req_id="w"))
        m.drain()
        m.reset_cache()
        assert answers(m, keys, "r") == [HIT] * 12
        m.shutdown()
        with pytest.raises(ConfigError, match=r"may not run SET NX .* namespace 'tenant-b'"):
            build("tenant-a", "tenant-b")
        with pytest.raises(ConfigError, match=r"needs `\+cluster\|slots \+command`"):
            build("no-slots", "tenant-a")
        # cluster = false: INFO is refused to this user, CLUSTER SLOTS says it is a Cluster.
        with pytest.raises(ConfigError, match=r"is a Redis Cluster node .*; set cluster = true"):
            redis_stack(
                f"redis://tenant-a@{nodes[0].address}/0", password_env="KVO_TENANT_PASSWORD",
                namespace="tenant-a", auth_key_env="KVO_AUTH_A",
            )  # fmt: skip
    finally:
        for node in nodes:
            node.stop()


# -- the secret never shows ---------------------------------------------------------------------


def test_the_secret_is_nowhere_in_validate_replay_logs_or_errors(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    ns = namespace()
    config = tmp_path / "auth.toml"
    config.write_text(
        "num_blocks = 64\nblock_size_bytes = 4096\n"
        f'[[tiers]]\ntype = "redis"\nurl = "{redis_server.url()}"\n'
        f'password_env = "KVO_TEST_REDIS_PASSWORD"\nnamespace = "{ns}"\n'
        'auth_key_env = "KVO_AUTH_A"\n'
    )
    env = {"KVO_TEST_REDIS_PASSWORD": PASSWORD, "KVO_AUTH_A": SECRET}
    validate, validate_json, replay = kvo_many(
        ["validate", config],
        ["validate", config, "--json"],
        ["replay", config, TRACE, "--limit", "300", "--json", "--no-progress"],
        env=env,
    )
    for proc in (validate, validate_json, replay):
        assert proc.returncode == 0, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
    assert "KVO_AUTH_A" in validate.stdout  # the variable's name is shown, not its value
    assert json.loads(replay.stdout)["hit_ratio"] > 0
    # In-process: repr, stats, logs of a reader with the wrong secret, errors.
    with caplog.at_level(logging.DEBUG):
        writer(redis_server, ns + "x", [key(1)], auth_key_env="KVO_AUTH_A")
        m = reader(redis_server, ns + "x", auth_key_env="KVO_AUTH_B")
        assert answers(m, [key(1)], "r") == [MISS]
        shown = [repr(tier_of(m)), repr(tier_of(m).settings), str(tier_of(m).get_stats())]
        m.shutdown()
    assert "key_id=0x" in shown[0]
    for text in [*shown, caplog.text]:
        assert SECRET not in text and OTHER not in text
