"""The Redis tier's parts that need no server: config validation, the value codec, the
circuit breaker, and a tier whose server is not there."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _redis_servers import free_port
from _redis_stack import BLOCK, assert_quiet, redis_stack, resolve, store
from _tiers import key
from kv_offload import ConfigError, LookupResult, ReqContext
from kv_offload_redis_tier import stored as codec
from kv_offload_redis_tier.io import CircuitBreaker
from kv_offload_redis_tier.wire import Parts, ZeroCopyPacker

SECRET = "pa55-in-url"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "http://127.0.0.1:6379"}, "must start with redis://"),
        ({"url": "redis:///0"}, "names no host"),
        ({"url": "redis://h:6379/zero"}, "db number"),
        ({"url": "redis://h:6379/2", "cluster": True}, "only db 0"),
        ({"url": f"redis://:{SECRET}@h/0", "password_env": "KVO_TEST_REDIS_PASSWORD"}, "both"),
        ({"password_env": "KVO_SURELY_UNSET"}, "'KVO_SURELY_UNSET' .* is not set"),
        ({"startup_nodes": ["h:1"]}, "needs cluster = true"),
        ({"cluster": True, "startup_nodes": ["nohost"]}, "not 'host:port'"),
        ({"cluster": True, "startup_nodes": "h:1"}, "list of 'host:port'"),
        ({"cluster": "yes"}, "true or false"),
        ({"namespace": "has space"}, "namespace"),
        ({"namespace": ""}, "namespace"),
        ({"ttl_s": -1}, "ttl_s must be a positive"),
        ({"batch_blocks": 0}, "batch_blocks"),
        ({"max_in_flight": True}, "max_in_flight"),
        ({"io_threads": 1.5}, "io_threads must be a positive int"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"retry_after_s": 5, "max_retry_after_s": 1}, "max_retry_after_s"),
        ({"tls_ca_file": "/etc/hostname"}, "needs a rediss:// url"),
        ({"url": "rediss://h/0", "tls_ca_file": "/nonexistent/ca.pem"}, "not a readable file"),
        ({"timeout": 3}, "has no argument 'timeout'; it accepts: url, password_env"),
    ],
)
def test_bad_config_is_a_config_error_naming_the_key(
    arguments: dict[str, Any], message: str
) -> None:
    url = arguments.pop("url", "redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match=message) as info:
        redis_stack(url, **arguments)
    assert SECRET not in str(info.value)


def test_unreachable_server_at_startup_warns_and_fails_fast(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No server: the stack still builds, cascades fail at once, lookups end as MISS."""
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="kv_offload.redis_tier"):
        manager = redis_stack(
            url, connect_timeout_s=0.5, retry_after_s=30, max_retry_after_s=30, num_blocks=8
        )
    assert "not reachable at startup" in caplog.text and SECRET not in caplog.text
    ctx = ReqContext(req_id="r")
    start = time.monotonic()
    store(manager, [key(i) for i in range(4)], ctx)
    manager.drain(5.0)
    assert time.monotonic() - start < 2.0
    assert manager.get_stats().tiers[0].failed_cascades == 4
    assert manager.tiers[0].get_stats()["fast_failed_jobs"] >= 1  # type: ignore[attr-defined]
    assert resolve(manager, [key(99)], ReqContext(req_id="q"), timeout=5.0) == [LookupResult.MISS]
    assert SECRET not in repr(manager.tiers[0])
    assert_quiet(manager)
    manager.shutdown()


# -- the value codec -----------------------------------------------------------------------


def value(k: bytes, payload: bytes) -> bytes:
    return codec.header(k, payload) + payload


def test_codec_round_trip_is_a_view_of_the_payload() -> None:
    payload = np.random.default_rng(1).integers(0, 256, BLOCK, dtype=np.uint8).tobytes()
    stored = value(key(1), payload)
    assert len(stored) == codec.HEADER.size + len(key(1)) + BLOCK
    assert bytes(codec.check(stored, key(1), BLOCK)) == payload


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda v: v[:-1], "truncated"),
        (lambda v: v[:10], "shorter than the header"),
        (lambda v: v[: codec.HEADER.size + 3], "truncated: .* shorter than the header and the key"),
        (lambda v: b"XXXX" + v[4:], "bad magic"),
        (lambda v: v[:4] + (99).to_bytes(2, "little") + v[6:], "format version 99"),
        (lambda v: v[:-1] + bytes([v[-1] ^ 1]), "checksum mismatch"),
        (lambda v: value(key(2), v[-BLOCK:]), "another key"),
        (lambda v: value(key(1), v[-BLOCK // 2 :]), f"this stack's blocks have {BLOCK}"),
    ],
)
def test_codec_rejects_every_kind_of_bad_value(mangle, reason: str) -> None:  # type: ignore[no-untyped-def]
    good = value(key(1), bytes(range(256)) * (BLOCK // 256))
    with pytest.raises(codec.BadValue, match=reason):
        codec.check(mangle(good), key(1), BLOCK)


def test_packer_sends_parts_as_one_bulk_string_without_joining_them() -> None:
    row = np.arange(64, dtype=np.uint8)
    out = ZeroCopyPacker().pack("SET", b"k", Parts(b"HDR", row), "PX", 1500)
    assert b"".join(bytes(chunk) for chunk in out) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$67\r\nHDR"
        + row.tobytes()
        + b"\r\n$2\r\nPX\r\n$4\r\n1500\r\n"
    )
    assert any(isinstance(c, memoryview) and c.obj is row for c in out)  # the row, not a copy
    assert ZeroCopyPacker().pack("CLUSTER SLOTS")[0] == b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n"


# -- the circuit breaker -------------------------------------------------------------------


def test_breaker_opens_backs_off_and_closes() -> None:
    now = [0.0]
    breaker = CircuitBreaker(0.5, 2.0, clock=lambda: now[0])
    assert breaker.allow() and not breaker.is_open
    assert breaker.failure() is True  # just opened
    assert not breaker.allow() and breaker.blocked()
    now[0] = 0.5
    assert breaker.allow()  # the half-open trial
    assert not breaker.allow()  # only one per delay
    assert breaker.failure() is False  # still open: delay doubles to 1.0
    now[0] = 1.4
    assert not breaker.allow()
    now[0] = 1.5
    assert breaker.allow()
    breaker.failure()  # 2.0 (the cap)
    breaker.failure()  # still 2.0
    now[0] = 3.4
    assert not breaker.allow()
    now[0] = 3.5
    assert breaker.allow()
    assert breaker.success() is True and breaker.allow() and breaker.trips == 1


def test_tls_files_must_exist(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    with pytest.raises(ConfigError, match="tls_cert_file"):
        redis_stack("rediss://127.0.0.1:1/0", tls_cert_file=str(ca))
