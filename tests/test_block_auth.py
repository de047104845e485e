"""``kv_offload.block_auth``: the helper tiers use to sign and verify blocks, and the config
checks every authenticating tier (``redis``, ``fs``) shares at ``validate``."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest
from _tier_config_files import line_of, tier_config_file
from kv_offload import ConfigError, load_config
from kv_offload.block_auth import (
    RECORD_SIZE,
    AuthFailureLog,
    BlockAuth,
    blake3_available,
)
from test_cli import kvo

SECRET = "a-secret-of-32-bytes-0123456789a"
SHORT = "fifteen-bytes!!"


@pytest.mark.parametrize("algorithm", ["blake3", "hmac-sha256"])
def test_sign_and_verify_bind_every_field(algorithm: str) -> None:
    if algorithm == "blake3" and not blake3_available():
        pytest.skip("blake3 is not installed")
    auth = BlockAuth(SECRET.encode(), context=b"t:ns", algorithm=algorithm)
    payload = bytearray(os.urandom(4096))
    record = auth.sign(b"key-1", 4096, 1, memoryview(payload))
    assert len(record) == RECORD_SIZE
    assert auth.verify(record, b"key-1", 4096, 1, payload) is None
    changed = {
        "key": auth.verify(record, b"key-2", 4096, 1, payload),
        "block size": auth.verify(record, b"key-1", 8192, 1, payload),
        "format version": auth.verify(record, b"key-1", 4096, 2, payload),
        "context": BlockAuth(SECRET.encode(), context=b"t:other", algorithm=algorithm).verify(
            record, b"key-1", 4096, 1, payload
        ),
    }
    payload[4095] ^= 1
    changed["payload"] = auth.verify(record, b"key-1", 4096, 1, payload)
    assert {what: f and f.kind for what, f in changed.items()} == dict.fromkeys(changed, "bad_mac")
    other = BlockAuth(b"another-secret-0123456789abcdef", context=b"t:ns", algorithm=algorithm)
    failure = other.verify(record, b"key-1", 4096, 1, payload)
    assert failure is not None and failure.kind == "unknown_key"
    truncated = auth.verify(record[:-1], b"key-1", 4096, 1, payload)
    assert truncated is not None and truncated.kind == "bad_record"


def test_rotation_and_what_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVO_OLD", SECRET)
    monkeypatch.setenv("KVO_NEW", "the-next-secret-0123456789abcdef")
    old = BlockAuth.from_arguments("t", "KVO_OLD", context=b"c")
    both = BlockAuth.from_arguments("t", "KVO_NEW", "KVO_OLD", context=b"c")
    assert old is not None and both is not None
    assert both.key_ids == (both.key_id, old.key_id) and both.key_id != old.key_id
    record = old.sign(b"k", 8, 1, b"12345678")
    assert both.verify(record, b"k", 8, 1, b"12345678") is None
    assert old.verify(both.sign(b"k", 8, 1, b"12345678"), b"k", 8, 1, b"12345678") is not None
    assert BlockAuth.from_arguments("t", None, context=b"c") is None
    assert SECRET not in repr(both) and f"{old.key_id:#010x}" in repr(both)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(both)


def test_failures_are_logged_once_per_kind_then_summarised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = AuthFailureLog("t", logging.getLogger("kv_offload.test_auth"))
    log.interval = 3600.0
    with caplog.at_level(logging.WARNING, "kv_offload.test_auth"):
        for _ in range(100):
            log.report("bad_mac", "forged", "deleted")
        log.report("unknown_key", "other tenant", "left alone")
        assert len(caplog.records) == 2
        log.interval = 0.0
        log.report("bad_mac", "forged again", "deleted")
    assert "100 more block(s) failed authentication (bad_mac)" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("tier", ["redis", "fs"])
@pytest.mark.parametrize(
    ("lines", "key", "fragment"),
    [
        ('auth_key_env = "KVO_SURELY_UNSET_SECRET"', "auth_key_env", "is not set"),
        ('auth_key_env = "KVO_SHORT_SECRET"', "auth_key_env", "is 15 bytes, at least 16"),
        ('auth_key_env = ""', "auth_key_env", "must name an environment variable"),
        ("auth_key_env = 3", "auth_key_env", "must name an environment variable"),
        (
            'auth_key_previous_env = "KVO_GOOD_SECRET"',
            "auth_key_previous_env",
            "auth_key_env is not",
        ),
        (
            'auth_key_env = "KVO_GOOD_SECRET"\nauth_key_previous_env = "KVO_SHORT_SECRET"',
            "auth_key_previous_env",
            "is 15 bytes",
        ),
        (
            'auth_key_env = "KVO_GOOD_SECRET"\nauth_key_previous_env = "KVO_SAME_SECRET"',
            "auth_key_previous_env",
            "equals the current one",
        ),
    ],
)
def test_bad_auth_keys_are_config_errors_at_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str, lines: str, key: str, fragment: str
) -> None:
    monkeypatch.setenv("KVO_SHORT_SECRET", SHORT)
    monkeypatch.setenv("KVO_GOOD_SECRET", SECRET)
    monkeypatch.setenv("KVO_SAME_SECRET", SECRET)
    extra = f'root_dir = "{tmp_path / "fs"}"\ncapacity_blocks = 10\n' if tier == "fs" else ""
    path = tier_config_file(tmp_path, tier, extra + lines)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert fragment in message, message
    assert f"{path}:{line_of(path, key)}" in message, message
    assert SECRET not in message and SHORT not in message


def test_validate_names_the_key_and_never_the_secret(tmp_path: Path) -> None:
    path = tier_config_file(
        tmp_path,
        "fs",
        f'root_dir = "{tmp_path / "fs"}"\ncapacity_blocks = 10\nauth_key_env = "KVO_FS_SECRET"',
    )
    bad, good = (
        kvo("validate", path, env={"KVO_FS_SECRET": SHORT}),
        kvo("validate", path, env={"KVO_FS_SECRET": SECRET}),
    )
    assert bad.returncode != 0 and "auth_key_env" in bad.stdout + bad.stderr
    assert good.returncode == 0, good.stderr
    assert "KVO_FS_SECRET" in good.stdout
    for proc in (bad, good):
        assert SHORT not in proc.stdout + proc.stderr and SECRET not in proc.stdout + proc.stderr
