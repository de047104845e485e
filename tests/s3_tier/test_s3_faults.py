"""The S3 tier when the store fails under it (real radosgw, killed with SIGKILL or frozen with
SIGSTOP mid-run) and when a build names what cannot work: every job reports within a bound,
``lookup`` never holds the caller, nothing wrong reaches the CPU buffer, and a wrong config is
a ConfigError naming the bucket."""

from __future__ import annotations

import time

import numpy as np
import pytest
from _ceph import BUCKET, STRANGER_ACCESS_KEY, STRANGER_SECRET_KEY, CephS3, _free_port
from _s3_stack import BLOCK, Direct, clear_prefix
from _tiers import block_bytes, expected_rows, key
from kv_offload import ReqContext
from kv_offload.errors import ConfigError
from kv_offload.tiering import JobDirection, JobResult

#: Short request bounds, so a dead or frozen endpoint is found out in about a second.
FAST = {"connect_timeout_s": 0.5, "timeout_s": 1.0, "max_attempts": 2, "retry_after_s": 0.3,
        "max_retry_after_s": 0.6}  # fmt: skip
#: What a job may take, whatever the store does: attempts x (connect + read) + backoff + slack
#: for the shared 2-core machine.
BOUND_S = 2 * (0.5 + 1.0) + 1.0 + 5.0


@pytest.fixture(autouse=True)
def _cleanup(ceph: CephS3, prefix: str):  # type: ignore[no-untyped-def]
    yield
    ceph.ensure_rgw()
    clear_prefix(ceph, prefix)


def _results(tier: Direct, jobs: list[int], bound: float) -> dict[int, JobResult]:
    """Every job's result, each within ``bound`` seconds of the call (else: a hang)."""
    out = {}
    for job in jobs:
        out[job] = tier.wait(job, timeout=bound)
    return out


def _served_right(tier: Direct, keys: list[bytes], result: JobResult, first_slot: int) -> None:
    """A load's keys reported good hold their stored bytes; the failed ones hold zeros."""
    for offset, k in enumerate(keys):
        row = bytes(tier.cpu[first_slot + offset])
        failed = not result.success or k in result.failed_keys
        if failed:
            assert row == bytes(BLOCK), "a failed load wrote into its slot"
        else:
            assert row == block_bytes(k, BLOCK), "a load reported good served wrong bytes"


def test_radosgw_killed_mid_run_fails_jobs_within_a_bound_and_recovers(
    rgw_faults: CephS3, s3_env: CephS3, prefix: str
) -> None:
    tier = Direct(s3_env, prefix, slots=64, **FAST)
    stored = [key(i) for i in range(16)]
    assert tier.store(stored).success
    # a mix of stores and loads in flight when radosgw dies
    tier.cpu[16:32] = expected_rows([key(i) for i in range(100, 116)], BLOCK)
    tier.cpu[32:48] = 0
    stores = [tier.submit(JobDirection.STORE, [key(i)], [16 + i - 100]) for i in range(100, 116)]
    loads = [tier.submit(JobDirection.LOAD, [k], [32 + n]) for n, k in enumerate(stored)]
    rgw_faults.kill_rgw()
    started = time.monotonic()
    results = _results(tier, stores + loads, BOUND_S)
    assert time.monotonic() - started < BOUND_S + len(results) * 0.05
    for n, job in enumerate(loads):
        _served_right(tier, [stored[n]], results[job], 32 + n)

    # down: new jobs fail fast, lookups answer at once and settle as misses
    tier.cpu[:16] = 0
    t0 = time.monotonic()
    result = tier.wait(tier.submit(JobDirection.LOAD, stored, range(16)), timeout=BOUND_S)
    assert not result.success or result.failed_keys, "a load succeeded with radosgw dead"
    assert time.monotonic() - t0 < BOUND_S
    assert not np.any(tier.cpu[:16])
    assert tier.ask([key(900)], timeout=BOUND_S) == [False]
    assert tier.tier.get_stats()["breaker_trips"] >= 1

    # back: after the breaker's delay the stored blocks are served again, exact
    rgw_faults.start_rgw()
    deadline = time.monotonic() + 20
    while True:
        result = tier.load(stored, timeout=BOUND_S)
        if result.success and not result.failed_keys:
            break
        assert time.monotonic() < deadline, f"not served after radosgw came back: {result}"
        time.sleep(0.3)
    assert all(tier.loaded_right(stored))
    tier.close()


def test_radosgw_frozen_times_out_jobs_and_never_holds_lookup(
    rgw_faults: CephS3, s3_env: CephS3, prefix: str
) -> None:
    """SIGSTOP: the kernel still accepts connections, nothing answers. Jobs fail by their
    timeouts, ``lookup`` returns in microseconds meanwhile, and SIGCONT brings it back."""
    tier = Direct(s3_env, prefix, **FAST)
    keys = [key(i) for i in range(4)]
    assert tier.store(keys).success
    rgw_faults.pause_rgw()
    tier.cpu[:4] = 0
    t0 = time.monotonic()
    job = tier.submit(JobDirection.LOAD, keys)
    ctx = ReqContext(req_id="frozen")
    slowest = 0.0
    for _ in range(20):  # the scheduler keeps asking while the store is frozen
        s = time.perf_counter()
        assert tier.tier.lookup(key(500), ctx) in (None, False)  # never a hit
        slowest = max(slowest, time.perf_counter() - s)
        tier.tier.on_schedule_end()
        time.sleep(0.01)
    result = tier.wait(job, timeout=BOUND_S)
    assert time.monotonic() - t0 < BOUND_S
    assert not result.success or set(result.failed_keys) == set(keys)
    assert not np.any(tier.cpu[:4])
    assert slowest < 0.05, f"lookup held the caller {slowest * 1e3:.1f} ms"
    rgw_faults.resume_rgw()
    deadline = time.monotonic() + 20
    while not (result := tier.load(keys, timeout=BOUND_S)).success or result.failed_keys:
        assert time.monotonic() < deadline, f"not served after SIGCONT: {result}"
        time.sleep(0.3)
    assert all(tier.loaded_right(keys))
    tier.close()


def test_a_missing_bucket_is_a_config_error_naming_it(s3_env: CephS3, prefix: str) -> None:
    with pytest.raises(ConfigError, match="'kvo-no-such-bucket' does not exist"):
        Direct(s3_env, prefix, bucket="kvo-no-such-bucket")


def test_a_dead_endpoint_at_build_is_a_bounded_config_error(s3_env: CephS3, prefix: str) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"bucket '{BUCKET}' is unreachable"):
        Direct(s3_env, prefix, endpoint_url=dead, **FAST)
    assert time.monotonic() - t0 < BOUND_S


def test_refused_credentials_are_a_config_error_naming_bucket_and_permission(
    s3_env: CephS3, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0000000000000000000000000")
    with pytest.raises(ConfigError, match=f"bucket '{BUCKET}'") as refused:
        Direct(s3_env, prefix)
    assert "not-the-secret" not in str(refused.value)
    # a real user without a grant on the bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", STRANGER_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", STRANGER_SECRET_KEY)
    with pytest.raises(ConfigError, match=f"bucket '{BUCKET}'.*s3:ListBucket") as stranger:
        Direct(s3_env, prefix)
    assert STRANGER_SECRET_KEY not in str(stranger.value)
