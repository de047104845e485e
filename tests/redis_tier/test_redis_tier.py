"""The Redis tier against real redis-server processes on 127.0.0.1 (no fake server, no mocks).

Each test uses its own namespace on the shared server, or a server of its own when it kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
from _redis_servers import PASSWORD, RedisServer, make_tls_files, slot_owners
from _redis_stack import BLOCK, assert_quiet, load_and_check, redis_stack, resolve, store
from _tiers import key
from kv_offload import ConfigError, LookupResult, ReqContext, TieringOffloadingManager
from kv_offload_redis_tier import RedisTier
from kv_offload_redis_tier.stored import check
from kv_offload_redis_tier.wire import exists_many
from redis.cluster import key_slot

HIT, MISS = LookupResult.HIT, LookupResult.MISS
TESTS = Path(__file__).resolve().parents[1]


def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def tier_of(manager) -> RedisTier:  # type: ignore[no-untyped-def]
    tier = manager.tiers[0]
    assert isinstance(tier, RedisTier)
    return tier


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_random_bytes_round_trip_through_the_tiered_manager(
    redis_server: RedisServer, password_env: str, policy: str
) -> None:
    """More blocks than the CPU tier holds: the evicted ones come back from Redis, identical."""
    rng = np.random.default_rng(7)
    manager = redis_stack(
        redis_server.url(), policy=policy, num_blocks=16, password_env=password_env,
        namespace=namespace(), batch_blocks=4,
    )  # fmt: skip
    keys = [key(i) for i in range(48)]
    written: dict[bytes, np.ndarray] = {}
    for start in range(0, len(keys), 8):  # one request per 8 blocks, CPU tier churns
        ctx = ReqContext(req_id=f"w{start}")
        chunk = keys[start : start + 8]
        out = manager.prepare_store(chunk, ctx)
        assert out is not None
        rows = rng.integers(0, 256, (len(chunk), BLOCK), dtype=np.uint8)
        manager.kv_buffer.write_blocks(out.store_spec.block_ids, rows)
        written.update(zip(chunk, rows))
        manager.complete_store(chunk, ctx)
        manager.drain()
        manager.on_request_finished(ctx)
    for start in range(0, len(keys), 8):  # read back 8 at a time (they fit the CPU tier)
        ctx = ReqContext(req_id=f"r{start}")
        chunk = keys[start : start + 8]
        assert resolve(manager, chunk, ctx) == [HIT] * 8
        spec = manager.prepare_load(chunk, ctx)
        got = manager.kv_buffer.read_blocks(spec.block_ids)
        manager.complete_load(chunk, ctx)
        assert np.array_equal(got, np.stack([written[k] for k in chunk]))
        manager.on_request_finished(ctx)
    stats = manager.get_stats()
    assert stats.tiers[0].cascaded_blocks == 48 and stats.tiers[0].promoted_blocks > 0
    counters = tier_of(manager).get_stats()
    # This tier stored them itself, so it knew they were there without asking the server.
    assert counters["stored_blocks"] == 48 and counters["corrupt_values"] == 0
    assert_quiet(manager)
    manager.shutdown()


WRITER = """
import sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, {here!r})
from _redis_stack import redis_stack, store
from _tiers import key
from kv_offload import ReqContext
manager = redis_stack({url!r}, password_env={env!r}, namespace={ns!r})
ctx = ReqContext(req_id="writer")
keys = [key(i) for i in range(100, 124)]
store(manager, keys, ctx)
manager.drain()
assert manager.get_stats().tiers[0].cascaded_blocks == len(keys)
manager.shutdown()
print("stored", len(keys))
"""


def test_two_stacks_in_two_processes_share_one_server(
    redis_server: RedisServer, password_env: str
) -> None:
    ns = namespace()
    script = WRITER.format(
        tests=str(TESTS), here=str(Path(__file__).parent), url=redis_server.url(),
        env=password_env, ns=ns,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    assert "stored 24" in done.stdout
    # This process never stored them: the tier answers from the server.
    manager = redis_stack(redis_server.url(), password_env=password_env, namespace=ns)
    ctx = ReqContext(req_id="reader")
    keys = [key(i) for i in range(100, 124)]
    assert resolve(manager, keys, ctx) == [HIT] * len(keys)
    load_and_check(manager, keys, ctx)
    absent = ReqContext(req_id="absent")
    assert resolve(manager, [key(999)], absent) == [MISS]
    assert_quiet(manager)
    manager.shutdown()


def test_server_killed_and_restarted_mid_replay(own_server: RedisServer, password_env: str) -> None:
    """SIGKILL mid-run: in-flight jobs fail within the timeout, later ones fail fast, CPU hits
    keep being served, the tier reconnects by itself; no pin leaks, no hung request."""
    manager = redis_stack(
        own_server.url(), password_env=password_env, namespace=namespace(), num_blocks=24,
        timeout_s=1.0, connect_timeout_s=0.5, retry_after_s=0.2, max_retry_after_s=0.5,
    )  # fmt: skip
    tier = tier_of(manager)
    step_times: list[float] = []

    def request(i: int, *, reuse: int | None = None) -> int:
        """Store 4 new blocks; optionally look up an earlier request's blocks first and
        load the hits (bytes checked). Returns the number of hits."""
        ctx = ReqContext(req_id=f"q{i}")
        start = time.monotonic()
        hits: list[bytes] = []
        if reuse is not None:
            old = [key(reuse * 4 + j) for j in range(4)]
            answers = resolve(manager, old, ctx, timeout=10.0)
            hits = [k for k, a in zip(old, answers) if a is HIT]
            if hits:
                load_and_check(manager, hits, ctx)
        store(manager, [key(i * 4 + j) for j in range(4)], ctx)
        manager.on_schedule_end()
        manager.on_request_finished(ctx)
        step_times.append(time.monotonic() - start)
        return len(hits)

    for i in range(10):
        request(i, reuse=i - 8 if i >= 8 else None)
        # Cascades pin their CPU blocks until the tier reports; with 24 CPU blocks the next
        # requests would find no room if a fast machine outran the server's replies.
        manager.drain(10.0)
    own_server.kill()
    killed_at = time.monotonic()
    for i in range(10, 30):
        # The previous request's blocks are in the CPU tier: served while Redis is down.
        assert request(i, reuse=i - 1) == 4
        # Cascades in flight at the kill hold their CPU pins until timeout_s; an engine keeps
        # stepping meanwhile (outside the step times measured above).
        manager.drain(10.0)
    manager.drain(10.0)
    outage = tier.get_stats()
    assert outage["server_errors"] >= 1
    assert outage["fast_failed_jobs"] >= 1, outage  # no per-job timeout storm
    assert manager.get_stats().tiers[0].failed_cascades > 0
    assert time.monotonic() - killed_at < 15.0
    assert max(step_times[10:]) < 5.0, step_times  # nothing waits on the dead server
    assert_quiet(manager)

    own_server.start()
    deadline = time.monotonic() + 10.0
    i = 30
    while tier.get_stats()["reconnects"] == 0:
        assert time.monotonic() < deadline, "the tier did not reconnect by itself"
        request(i)
        manager.drain(10.0)
        time.sleep(0.05)
        i += 1
    # After recovery: blocks stored now round-trip through the server, bytes verified.
    fresh = [key(10_000 + j) for j in range(12)]
    ctx = ReqContext(req_id="after")
    store(manager, fresh, ctx)
    manager.drain(10.0)
    manager.on_request_finished(ctx)
    manager.reset_cache()  # the CPU tier forgets them: they can only come from the server
    reader = ReqContext(req_id="after-read")
    assert resolve(manager, fresh, reader) == [HIT] * 12
    load_and_check(manager, fresh, reader)
    assert manager.get_stats().tiers[0].promoted_blocks == 12
    assert_quiet(manager)
    manager.shutdown()


def test_frozen_server_fails_in_flight_jobs_within_the_timeout(
    own_server: RedisServer, password_env: str
) -> None:
    """A server that stops answering (SIGSTOP) but keeps its sockets open: the jobs waiting
    on it fail once ``timeout_s`` has passed, not later, and the tier resumes after SIGCONT."""
    assert own_server.process is not None
    manager = redis_stack(
        own_server.url(), password_env=password_env, namespace=namespace(), timeout_s=0.5,
        retry_after_s=0.1, max_retry_after_s=0.2,
    )  # fmt: skip
    tier = tier_of(manager)
    own_server.process.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        ctx = ReqContext(req_id="frozen")
        store(manager, [key(i) for i in range(8)], ctx)
        manager.drain(10.0)
        elapsed = time.monotonic() - start
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    assert manager.get_stats().tiers[0].failed_cascades == 8
    assert 0.4 < elapsed < 3.0, elapsed  # one socket timeout (0.5 s), not one per block
    assert tier.get_stats()["server_errors"] >= 1
    deadline = time.monotonic() + 10.0
    while True:  # the next attempt after the breaker's delay reaches the thawed server
        more = ReqContext(req_id=f"thawed-{time.monotonic()}")
        store(manager, [key(int(time.monotonic() * 1000))], more)
        manager.drain(10.0)
        if manager.get_stats().tiers[0].cascaded_blocks:
            break
        assert time.monotonic() < deadline, "the tier did not resume"
        time.sleep(0.1)
    assert_quiet(manager)
    manager.shutdown()


def test_cluster_master_killed_fails_only_its_slots(
    cluster: list[RedisServer], password_env: str
) -> None:
    seed = cluster[0]
    manager = redis_stack(
        seed.url(), cluster=True, startup_nodes=[n.address for n in cluster[1:]],
        namespace="clu", num_blocks=64, timeout_s=1.0, connect_timeout_s=0.5,
        retry_after_s=0.2,
    )  # fmt: skip
    keys = [key(i) for i in range(48)]
    ctx = ReqContext(req_id="w")
    store(manager, keys, ctx)
    manager.drain(10.0)
    assert manager.get_stats().tiers[0].cascaded_blocks == 48
    manager.reset_cache()  # the CPU tier forgets them; Redis still has them

    # Which master owns each key's slot, asked from the server itself.
    client = seed.client()
    owner: dict[int, str] = {}
    for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
        address = f"{master[0].decode()}:{master[1]}"
        owner.update((slot, address) for slot in range(start, end + 1))
    client.close()
    victim = cluster[1]
    victim.kill()
    on_victim = {k for k in keys if owner[key_slot(b"clu:" + k.hex().encode())] == victim.address}
    assert 0 < len(on_victim) < len(keys)
    answers = {}
    for k in keys:  # one request per key: a failing key fails only its own promotion
        req = ReqContext(req_id=k.hex())
        answers[k] = resolve(manager, [k], req, timeout=10.0)[0]
        if answers[k] is HIT:
            load_and_check(manager, [k], req)
        manager.on_request_finished(req)
    assert {k for k, a in answers.items() if a is MISS} == on_victim
    assert all(answers[k] is HIT for k in keys if k not in on_victim)
    assert_quiet(manager)
    manager.shutdown()


@pytest.mark.parametrize("built", ["before the kill", "after the kill"])
def test_cluster_jobs_spanning_a_dead_master_fail_only_its_keys(
    cluster: list[RedisServer], password_env: str, built: str
) -> None:
    """One job of 48 keys spans every master. With one master dead, 7,695 of 7,743 cascaded
    blocks failed (a job failed whole when any of its keys did), and a manager built while a
    master was down could not use the others. Now only the dead master's keys fail, in stores
    and in promotions, each live key with its bytes."""
    seed, victim = cluster[0], cluster[1]
    owner = slot_owners(seed)

    def build() -> TieringOffloadingManager:
        return redis_stack(
            seed.url(), cluster=True, startup_nodes=[n.address for n in cluster],
            namespace="span", num_blocks=64, timeout_s=1.0, connect_timeout_s=0.5,
            retry_after_s=0.2,
        )  # fmt: skip

    manager = build() if built == "before the kill" else None
    victim.kill()
    if manager is None:
        manager = build()
    keys = [key(i) for i in range(48)]
    on_victim = {k for k in keys if owner[key_slot(b"span:" + k.hex().encode())] == victim.address}
    assert 0 < len(on_victim) < len(keys)
    ctx = ReqContext(req_id="one-job")
    store(manager, keys, ctx)  # one cascade job of 48 keys
    manager.drain(15.0)
    stats = manager.get_stats().tiers[0]
    assert (stats.cascaded_blocks, stats.failed_cascades) == (48 - len(on_victim), len(on_victim))
    manager.on_request_finished(ctx)
    manager.reset_cache()  # the CPU tier forgets them; the live masters still have theirs
    req = ReqContext(req_id="reader")
    answers = resolve(manager, keys, req, timeout=15.0)  # one promotion job of 48 keys
    hits = [k for k, a in zip(keys, answers) if a is HIT]
    assert set(hits) == set(keys) - on_victim
    load_and_check(manager, hits, req)
    manager.on_request_finished(req)
    assert_quiet(manager)
    manager.shutdown()


def namespace_marked_on(owner: dict[int, str], master: RedisServer, prefix: str) -> str:
    """A namespace whose marker ``<namespace>:__format__`` hashes to a slot of ``master``."""
    for i in range(10_000):
        ns = f"{prefix}-{i}"
        if owner[key_slot(f"{ns}:__format__".encode())] == master.address:
            return ns
    raise AssertionError(f"no namespace {prefix}-N has its marker on {master.address}")


def copy_on(owner: dict[int, str], ns: str, master: RedisServer) -> bytes:
    """The key of the marker's copy on ``master`` (``<ns>:__format__{N}``, the first N whose
    slot it owns), as the README states the rule."""
    home = f"{ns}:__format__".encode()
    if owner[key_slot(home)] == master.address:
        return home
    return next(
        home + b"{%d}" % n for n in range(1 << 16) if owner[key_slot(b"%d" % n)] == master.address
    )


def test_a_stack_built_while_the_master_of_its_namespace_marker_is_down(
    cluster: list[RedisServer], password_env: str
) -> None:
    """One namespace in three has its marker ``<namespace>:__format__`` on a given master:
    built while that master was dead, the stack said "not reachable at startup" and cascaded
    nothing at all. The marker has a copy on every master now: the stack claims the live
    ones, stores and promotes through the live masters, and claims the dead one's copy when
    it is back; a stack of another block size is still refused, and a refused stack leaves
    no claim behind."""
    seed, victim, other = cluster
    owner = slot_owners(seed)
    ns = namespace_marked_on(owner, victim, "marker")
    victim.kill()
    client = seed.client()
    deadline = time.monotonic() + 20
    while "fail" not in client.execute_command("CLUSTER NODES")[victim.address]["flags"].split(","):
        assert time.monotonic() < deadline, "the Cluster never marked the killed master failed"
        time.sleep(0.05)
    assert client.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
    client.close()

    def build(namespace: str, block: int = BLOCK) -> TieringOffloadingManager:
        return redis_stack(
            seed.url(), cluster=True, startup_nodes=[n.address for n in cluster],
            namespace=namespace, num_blocks=64, timeout_s=1.0, connect_timeout_s=0.5,
            retry_after_s=0.2, max_retry_after_s=0.5, block=block,
        )  # fmt: skip

    manager = build(ns)
    keys = [key(i) for i in range(48)]
    on_victim = {k for k in keys if owner[key_slot(f"{ns}:{k.hex()}".encode())] == victim.address}
    assert 0 < len(on_victim) < len(keys)
    ctx = ReqContext(req_id="w")
    store(manager, keys, ctx)
    manager.drain(15.0)
    stats = manager.get_stats().tiers[0]
    assert (stats.cascaded_blocks, stats.failed_cascades) == (48 - len(on_victim), len(on_victim))
    manager.on_request_finished(ctx)
    manager.reset_cache()
    req = ReqContext(req_id="reader")
    hits = [k for k, a in zip(keys, resolve(manager, keys, req, timeout=15.0)) if a is HIT]
    assert set(hits) == set(keys) - on_victim
    load_and_check(manager, hits, req)
    manager.on_request_finished(req)

    with pytest.raises(ConfigError, match=rf"namespace '{ns}' .* holds .*block_size={BLOCK}"):
        build(ns, block=2 * BLOCK)  # the live masters' copies refuse it
    # A refused stack withdraws what it wrote: plant a foreign marker on one live master's
    # copy only; the stack claims the other's, meets the foreign one, deletes its own.
    fresh = namespace_marked_on(owner, other, "fresh")
    raw_seed, raw_other = seed.client(), other.client()
    raw_seed.set(copy_on(owner, fresh, seed), b"kv-offload-redis-tier format=1 block_size=999")
    with pytest.raises(ConfigError, match="block_size=999"):
        build(fresh)
    assert raw_other.exists(copy_on(owner, fresh, other)) == 0, "a refused stack left a claim"

    victim.start()  # back, empty: the stack claims its copy and stores there again
    marker = f"kv-offload-redis-tier format=1 block_size={BLOCK}".encode()
    raw_victim = victim.client()
    while raw_victim.execute_command("CLUSTER INFO")["cluster_state"] != "ok":  # rejoining
        assert time.monotonic() < deadline + 30, "the restarted master never rejoined"
        time.sleep(0.05)
    batch = 0
    while raw_victim.get(copy_on(owner, ns, victim)) != marker:
        assert time.monotonic() < deadline + 30, "the returned master's copy was never claimed"
        batch += 1
        more = [key(1000 * batch + i) for i in range(8)]
        req = ReqContext(req_id=f"after-{batch}")
        store(manager, more, req)
        manager.drain(15.0)
        manager.on_request_finished(req)
        manager.reset_cache()
        time.sleep(0.1)
    for raw in (raw_seed, raw_other, raw_victim):
        raw.close()
    assert_quiet(manager)
    manager.shutdown()


def test_cluster_heals_when_a_replica_takes_over_a_killed_master(
    replicated_cluster: list[RedisServer], password_env: str
) -> None:
    """Kill a master of a Cluster with replicas: once its replica is promoted, the tier finds
    the new owner of the slots (its topology refreshed after the failures), every store
    lands again, and the blocks written before the kill are served from the replica."""
    nodes = replicated_cluster
    owner = slot_owners(nodes[0])
    masters = sorted(set(owner.values()))
    victim = next(n for n in nodes if n.address == masters[0])
    seed = next(n for n in nodes if n is not victim)
    manager = redis_stack(
        seed.url(), cluster=True, startup_nodes=[n.address for n in nodes if n is not victim],
        namespace="heal", num_blocks=64, timeout_s=1.0, connect_timeout_s=0.5,
        retry_after_s=0.2, max_retry_after_s=0.5,
    )  # fmt: skip
    before = [key(i) for i in range(24)]
    ctx = ReqContext(req_id="before")
    store(manager, before, ctx)
    manager.drain(15.0)
    assert manager.get_stats().tiers[0].cascaded_blocks == 24
    manager.on_request_finished(ctx)
    time.sleep(0.3)  # let the replicas catch up (asynchronous replication)
    victim.kill()
    deadline = time.monotonic() + 30
    while victim.address in slot_owners(seed).values():  # the replica's election
        assert time.monotonic() < deadline, "no replica took over the killed master"
        time.sleep(0.1)
    # Stores resume: within the deadline, a whole job of new keys lands with no failure.
    healed = False
    batch = 0
    while not healed:
        assert time.monotonic() < deadline, "stores never resumed after the failover"
        batch += 1
        keys = [key(1000 * batch + i) for i in range(24)]
        req = ReqContext(req_id=f"after-{batch}")
        failed = manager.get_stats().tiers[0].failed_cascades
        store(manager, keys, req)
        manager.drain(15.0)
        healed = manager.get_stats().tiers[0].failed_cascades == failed
        manager.on_request_finished(req)
        manager.reset_cache()
        time.sleep(0.1)
    reader = ReqContext(req_id="reader")
    answers = resolve(manager, before, reader, timeout=15.0)
    assert all(a is HIT for a in answers), answers
    load_and_check(manager, before, reader)
    manager.on_request_finished(reader)
    assert_quiet(manager)
    manager.shutdown()


def test_corrupt_and_vanished_values_fail_the_load_and_are_counted(
    redis_server: RedisServer, password_env: str
) -> None:
    ns = namespace()
    manager = redis_stack(redis_server.url(), password_env=password_env, namespace=ns)
    keys = [key(i) for i in range(6)]
    ctx = ReqContext(req_id="w")
    store(manager, keys, ctx)
    manager.drain()
    manager.reset_cache()
    raw = redis_server.client()

    def rkey(i: int) -> bytes:
        return f"{ns}:{keys[i].hex()}".encode()

    good = raw.get(rkey(0))
    assert good is not None and check(good, keys[0], BLOCK).nbytes == BLOCK
    raw.setrange(rkey(0), len(good) - 1, bytes([good[-1] ^ 0xFF]))  # one payload bit flip
    raw.set(rkey(1), raw.get(rkey(1))[:-100])  # truncated
    raw.set(rkey(2), b"not a kv-offload block at all, " * 10)  # foreign
    raw.set(rkey(3), raw.get(rkey(4)))  # another key's (valid) value
    for i in range(4):
        req = ReqContext(req_id=f"bad{i}")
        assert resolve(manager, [keys[i]], req) == [MISS], i  # failed promotion -> MISS
        assert raw.exists(rkey(i)) == 0, "a corrupt value must be deleted"
    stats = tier_of(manager).get_stats()
    assert stats["corrupt_values"] == 4 and stats["failed_load_jobs"] == 4
    # Vanished between lookup and load: the existence check said yes, the GET finds nothing.
    req = ReqContext(req_id="vanish")
    while True:  # until the tier said "present" and the promotion is queued for the step end
        assert manager.lookup(keys[5], req) is LookupResult.PENDING
        if manager.get_stats().promotions_queued:
            break
        manager.on_schedule_end()
        assert tier_of(manager).settle_lookups(5.0)
    raw.delete(rkey(5))
    assert resolve(manager, [keys[5]], req) == [MISS]
    assert tier_of(manager).get_stats()["vanished_values"] == 1
    # The intact neighbour still loads.
    ok = ReqContext(req_id="ok")
    assert resolve(manager, [keys[4]], ok) == [HIT]
    load_and_check(manager, [keys[4]], ok)
    assert manager.get_stats().tiers[0].failed_promotions == 5
    raw.close()
    assert_quiet(manager)
    manager.shutdown()


def test_wrong_or_missing_password_is_a_config_error_that_hides_the_secret(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "definitely-not-the-password"
    monkeypatch.setenv("KVO_WRONG", wrong)
    with pytest.raises(ConfigError, match="refused the credentials") as info:
        redis_stack(redis_server.url(), password_env="KVO_WRONG", namespace=namespace())
    assert wrong not in str(info.value) and PASSWORD not in str(info.value)
    url_with_secret = f"redis://:{wrong}@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(ConfigError) as info:
        redis_stack(url_with_secret, namespace=namespace())
    assert wrong not in str(info.value) and ":***@" in str(info.value)
    with pytest.raises(ConfigError, match="refused the credentials"):
        redis_stack(redis_server.url(), namespace=namespace())  # no password at all
    # The right password in the URL works, and is never shown.
    manager = redis_stack(redis_server.url(password=True), namespace=namespace())
    assert PASSWORD not in repr(tier_of(manager))
    assert PASSWORD not in repr(tier_of(manager).settings)
    manager.shutdown()


def test_namespace_refuses_another_block_size(redis_server: RedisServer, password_env: str) -> None:
    ns = namespace()
    first = redis_stack(redis_server.url(), password_env=password_env, namespace=ns)
    with pytest.raises(ConfigError, match=f"namespace {ns!r}.*block_size={BLOCK}"):
        redis_stack(redis_server.url(), password_env=password_env, namespace=ns, block=BLOCK * 2)
    other = redis_stack(
        redis_server.url(), password_env=password_env, namespace=namespace(), block=BLOCK * 2
    )
    first.shutdown()
    other.shutdown()


def test_tls(tmp_path: Path, password_env: str) -> None:
    files = make_tls_files(tmp_path / "tls")
    try:
        server = RedisServer(tmp_path / "redis-tls", password=PASSWORD, tls=files)
    except RuntimeError as exc:  # a build without TLS refuses the tls-* settings
        pytest.skip(f"this redis-server does not support TLS: {exc}")
    try:
        manager = redis_stack(
            server.url(), password_env=password_env, namespace="tls", num_blocks=8,
            tls_ca_file=files["ca"],
        )  # fmt: skip
        keys = [key(i) for i in range(16)]
        ctx = ReqContext(req_id="tls")
        store(manager, keys[:8], ctx)
        manager.drain()
        store(manager, keys[8:], ctx)  # evicts the first eight
        manager.drain()
        manager.on_request_finished(ctx)
        reader = ReqContext(req_id="tls-read")
        assert resolve(manager, keys[:8], reader) == [HIT] * 8
        load_and_check(manager, keys[:8], reader)
        assert_quiet(manager)
        manager.shutdown()
        # Without the CA the server's certificate is not trusted: the stack refuses to start.
        with pytest.raises(ConfigError, match="set tls_ca_file"):
            redis_stack(server.url(), password_env=password_env, namespace="tls2")
    finally:
        server.stop()


def test_in_flight_limit_refuses_jobs_at_once(redis_server: RedisServer, password_env: str) -> None:
    manager = redis_stack(
        redis_server.url(), password_env=password_env, namespace=namespace(), max_in_flight=2
    )
    for i in range(5):  # five cascades submitted before the manager polls any result
        store(manager, [key(i)], ReqContext(req_id=f"r{i}"))
    manager.drain()
    assert tier_of(manager).get_stats()["refused_jobs"] == 3
    stats = manager.get_stats().tiers[0]
    assert stats.cascaded_blocks == 2 and stats.failed_cascades == 3
    assert_quiet(manager)
    manager.shutdown()


def test_exists_many_answers_in_order_and_leaves_the_connection_usable(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    ns = namespace()
    present = [f"{ns}:{i}".encode() for i in range(0, 3000, 3)]
    client.mset({k: b"x" for k in present})
    asked = [f"{ns}:{i}".encode() for i in range(3000)]
    assert exists_many(client, asked) == [i % 3 == 0 for i in range(3000)]
    assert client.get(present[0]) == b"x"  # the pooled connection is in a clean state
    with pytest.raises(redis.RedisError):  # refused (no password): the connection is dropped
        exists_many(redis.Redis(host="127.0.0.1", port=redis_server.port), asked[:10])
    assert exists_many(client, asked[:3]) == [True, False, False]
    client.close()


def test_cluster_true_against_a_standalone_server_is_a_config_error(
    redis_server: RedisServer, password_env: str
) -> None:
    """It was a warning and a stack that cascaded nothing: a permanent misconfiguration."""
    with pytest.raises(ConfigError, match=r"cluster = true, but .* is a standalone server"):
        redis_stack(redis_server.url(), cluster=True, password_env=password_env)


def test_cluster_false_against_a_cluster_node_is_a_config_error(
    cluster: list[RedisServer], password_env: str
) -> None:
    """The mirror of the case above: a raw MovedError when the namespace marker's slot was
    on another master, and a stack whose jobs failed with MOVED when it was on this one."""
    node = cluster[0]
    owner = slot_owners(node)
    for master in (node, cluster[1]):  # the marker's slot on this node, and on another
        ns = namespace_marked_on(owner, master, "single")
        with pytest.raises(ConfigError, match=r"is a Redis Cluster node .*; set cluster = true"):
            redis_stack(node.url(), namespace=ns)


def test_a_database_the_server_does_not_have_is_a_config_error(
    redis_server: RedisServer, password_env: str
) -> None:
    """``/99`` passed validate and failed at build as a PluginError wrapping ResponseError."""
    url = redis_server.url().rsplit("/", 1)[0] + "/99"
    with pytest.raises(ConfigError, match=r"selects database 99, which the server does not"):
        redis_stack(url, password_env=password_env)
