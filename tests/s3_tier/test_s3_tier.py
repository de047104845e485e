"""The S3 tier against a real Ceph RADOS Gateway on 127.0.0.1 (no fake server, no mocks).

Each test writes under a prefix of its own in the session's bucket and deletes it at the end.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from _ceph import BUCKET, CephS3
from _s3_stack import (
    BLOCK,
    Direct,
    assert_quiet,
    clear_prefix,
    load_and_check,
    object_names,
    resolve,
    s3_stack,
    store,
)
from _tiers import key
from kv_offload import LookupResult, ReqContext
from kv_offload_s3_tier.layout import Layout

HIT, MISS = LookupResult.HIT, LookupResult.MISS


@pytest.fixture(autouse=True)
def _cleanup(ceph: CephS3, prefix: str):  # type: ignore[no-untyped-def]
    yield
    clear_prefix(ceph, prefix)


def test_round_trip_through_the_tiered_manager(s3_env: CephS3, prefix: str) -> None:
    """More blocks than the CPU tier holds: the evicted ones come back from S3, identical,
    from objects under the sharded layout."""
    manager = s3_stack(s3_env, prefix, num_blocks=16)
    keys = [key(i) for i in range(40)]
    for start in range(0, len(keys), 8):
        ctx = ReqContext(req_id=f"w{start}")
        store(manager, keys[start : start + 8], ctx)
        manager.drain()
        manager.on_request_finished(ctx)
    for start in range(0, len(keys), 8):
        ctx = ReqContext(req_id=f"r{start}")
        chunk = keys[start : start + 8]
        assert resolve(manager, chunk, ctx) == [HIT] * 8
        load_and_check(manager, chunk, ctx)
        manager.on_request_finished(ctx)
    stats = manager.get_stats()
    assert stats.tiers[0].cascaded_blocks == 40 and stats.tiers[0].promoted_blocks > 0
    layout = Layout(prefix)
    assert sorted(object_names(s3_env, prefix)) == sorted(layout.name(k) for k in keys)
    assert_quiet(manager)
    manager.shutdown()


def test_direct_round_trip_and_partial_failure(s3_env: CephS3, prefix: str) -> None:
    """Bytes verified per key; a load naming one absent key fails that key only."""
    tier = Direct(s3_env, prefix)
    keys = [key(i) for i in range(12)]
    assert tier.store(keys).success and tier.tier.stats.stored_blocks == 12
    result = tier.load(keys)
    assert result.success and not result.failed_keys and all(tier.loaded_right(keys))
    mixed = [*keys[:3], key(999), *keys[3:6]]
    result = tier.load(mixed)
    assert result.success and result.failed_keys == {key(999)}
    assert tier.loaded_right(mixed) == [True] * 3 + [False] + [True] * 3
    tier.close()


def test_restart_recovers_the_blocks_by_listing_the_prefix(s3_env: CephS3, prefix: str) -> None:
    first = Direct(s3_env, prefix, capacity_blocks=10)
    keys = [key(i) for i in range(8)]
    assert first.store(keys).success
    first.close()
    # shared_grace_s = 0: the blocks found are old enough to evict (with the default grace a
    # restarted engine cannot tell them from another engine's fresh ones, and keeps them)
    second = Direct(s3_env, prefix, capacity_blocks=10, shared_grace_s=0)
    assert second.tier.stats.recovered_blocks == 8
    ctx = ReqContext(req_id="after-restart")
    assert [second.tier.lookup(k, ctx) for k in keys] == [True] * 8  # no round trip
    assert second.load(keys).success and all(second.loaded_right(keys))
    # the bound holds across the restart: 8 found + 4 new -> the 2 oldest go
    new = [key(i) for i in range(100, 104)]
    assert second.store(new).success
    second.close()
    names = object_names(s3_env, prefix)
    assert len(names) == 10
    layout = Layout(prefix)
    assert {layout.name(k) for k in new} <= set(names)


def test_capacity_evicts_least_recently_used_by_batch_delete(s3_env: CephS3, prefix: str) -> None:
    tier = Direct(s3_env, prefix, capacity_blocks=6)
    first = [key(i) for i in range(6)]
    assert tier.store(first).success
    ctx = ReqContext(req_id="touch")
    tier.tier.touch(first[:2], ctx)  # 0 and 1 are now the most recently used
    assert tier.store([key(i) for i in range(10, 14)]).success
    tier.close()  # waits for the deletes
    layout = Layout(prefix)
    names = set(object_names(s3_env, prefix))
    assert len(names) == 6 and tier.tier.stats.evicted_blocks == 4
    assert {layout.name(first[0]), layout.name(first[1])} <= names
    assert not {layout.name(k) for k in first[2:]} & names


def test_capacity_bytes_bounds_by_object_size(s3_env: CephS3, prefix: str) -> None:
    tier = Direct(s3_env, prefix, capacity_blocks=None, capacity_bytes=3 * BLOCK + 500)
    assert tier.tier.capacity_blocks == 3
    keys = [key(i) for i in range(5)]
    result = tier.store(keys)  # more than the whole tier: the first 3 are kept
    assert result.success and result.failed_keys == set(keys[3:])
    assert tier.store([key(7)]).success
    tier.close()
    layout = Layout(prefix)
    assert sorted(object_names(s3_env, prefix)) == sorted(
        layout.name(k) for k in [keys[1], keys[2], key(7)]
    )


def test_two_engines_sharing_a_prefix_keep_each_others_fresh_blocks(
    s3_env: CephS3, prefix: str
) -> None:
    """The sharing rule: an engine deletes a block it did not write only once it is older than
    shared_grace_s; a fresh one leaves its accounting instead. Both bounds still hold."""
    a = Direct(s3_env, prefix, capacity_blocks=6)
    mine_a = [key(i) for i in range(6)]
    assert a.store(mine_a).success
    b = Direct(s3_env, prefix, capacity_blocks=6)
    assert b.tier.stats.recovered_blocks == 6
    mine_b = [key(i) for i in range(100, 106)]
    assert b.store(mine_b).success
    b.close()
    layout = Layout(prefix)
    names = set(object_names(s3_env, prefix))
    assert {layout.name(k) for k in mine_a} <= names, "B deleted A's fresh blocks"
    assert {layout.name(k) for k in mine_b} <= names
    assert b.tier.stats.evicted_blocks == 0 and b.tier.stats.foreign_fresh_kept == 6
    # A sees B's blocks through its asynchronous lookups, and serves them
    assert a.ask(mine_b) == [True] * 6
    assert a.load(mine_b).success and all(a.loaded_right(mine_b))
    a.close()
    # with no grace, a restarted engine adopts the old blocks and may evict them
    c = Direct(s3_env, prefix, capacity_blocks=6, shared_grace_s=0)
    assert c.store([key(200)]).success
    c.close()
    assert len(object_names(s3_env, prefix)) == 6 and c.tier.stats.evicted_blocks == 7


def test_lookup_asks_the_store_once_per_step_and_answers_from_what_it_wrote(
    s3_env: CephS3, prefix: str
) -> None:
    reader = Direct(s3_env, prefix)  # started first: it knows nothing of the writer's
    writer = Direct(s3_env, prefix)
    keys = [key(i) for i in range(8)]
    assert writer.store(keys).success
    ctx = ReqContext(req_id="own")
    assert [writer.tier.lookup(k, ctx) for k in keys] == [True] * 8
    assert writer.tier.get_stats()["lookups"]["lookups"] == 0  # answered from its index
    ctx = ReqContext(req_id="other")
    asked = [reader.tier.lookup(k, ctx) for k in [*keys, key(77)]]
    assert asked == [None] * 9  # "ask again": nothing waited on the network
    assert [reader.tier.lookup(k, ctx) for k in keys] == [None] * 8  # no duplicate batch
    reader.tier.on_schedule_end()
    assert reader.tier.settle_lookups(10)
    assert [reader.tier.lookup(k, ctx) for k in [*keys, key(77)]] == [True] * 8 + [False]
    stats = reader.tier.get_stats()["lookups"]
    assert stats["batches"] == 1 and stats["resolved_keys"] == 9
    writer.close()
    reader.close()


def test_multipart_above_the_threshold(s3_env: CephS3, prefix: str) -> None:
    block = 6 * 1024 * 1024
    mib = 1024 * 1024
    tier = Direct(s3_env, prefix, block=block, slots=2, multipart_threshold_bytes=5 * mib,
                  multipart_part_bytes=5 * mib)  # fmt: skip
    keys = [key(1), key(2)]
    assert tier.store(keys).success
    assert tier.tier.stats.multipart_uploads == 2
    assert tier.load(keys).success and all(tier.loaded_right(keys))
    head = s3_env.client().head_object(Bucket=BUCKET, Key=Layout(prefix).name(keys[0]))
    assert head["ETag"].strip('"').endswith("-2")  # two parts
    tier.close()


def test_lookup_latency_is_memory_speed(s3_env: CephS3, prefix: str) -> None:
    """``lookup`` never waits on the store: a generous bound even on a loaded machine."""
    tier = Direct(s3_env, prefix)
    assert tier.store([key(i) for i in range(16)]).success
    ctx = ReqContext(req_id="timing")
    probes = [key(i) for i in range(32)]  # half known, half asked in the background
    samples = []
    for _ in range(50):
        for k in probes:
            t0 = time.perf_counter_ns()
            tier.tier.lookup(k, ctx)
            samples.append(time.perf_counter_ns() - t0)
        tier.tier.on_schedule_end()
    p99 = float(np.percentile(samples, 99)) / 1000
    assert p99 < 1000, f"p99 lookup {p99:.1f} us"
    tier.close()
