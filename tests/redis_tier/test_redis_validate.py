"""``kv-offload validate`` / ``load_config`` check the Redis tier's arguments as its
constructor does (``validate_arguments``), located at the key's line, and connect to
nothing: a valid config for a server that is not there validates."""

from __future__ import annotations

import inspect
import socket
from pathlib import Path

import pytest
from _tier_config_files import line_of, tier_config_file
from kv_offload import ConfigError, load_config
from kv_offload_redis_tier import RedisTier
from kv_offload_redis_tier.tier import _constructor_defaults
from test_cli import kvo

SECRET = "s3cret-in-url"


def config_file(tmp_path: Path, lines: str) -> Path:
    return tier_config_file(tmp_path, "redis", lines)


@pytest.mark.parametrize(
    ("lines", "key", "fragment"),
    [
        ('url = "http://127.0.0.1:6379"', "url", "must start with redis://"),
        ("url = 6379", "url", "must be a string"),
        ('url = "redis:///0"', "url", "names no host"),
        ('url = "redis://h:99999/0"', "url", "malformed"),
        ('url = "redis://h:6379/zero"', "url", "db number"),
        (f'url = "redis://:{SECRET}@h:6379/x"', "url", "db number"),
        ('password_env = "KVO_SURELY_UNSET_VARIABLE"', "password_env", "is not set"),
        ('cluster = "yes"', "cluster", "true or false"),
        ('startup_nodes = ["h:1"]', "startup_nodes", "needs cluster = true"),
        ('namespace = "has space"', "namespace", "namespace"),
        ("batch_blocks = 0", "batch_blocks", "positive int"),
        ("io_threads = 1.5", "io_threads", "positive int"),
        ("max_in_flight = true", "max_in_flight", "positive int"),
        ('timeout_s = "5"', "timeout_s", "positive number"),
        ("ttl_s = -1", "ttl_s", "positive number"),
        ("retry_after_s = 5\nmax_retry_after_s = 1", "max_retry_after_s", "must be >="),
        ('tls_ca_file = "/etc/hostname"', "tls_ca_file", "needs a rediss:// url"),
    ],
)
def test_bad_values_are_located_at_their_line(
    tmp_path: Path, lines: str, key: str, fragment: str
) -> None:
    path = config_file(tmp_path, lines)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert fragment in message, message
    assert f"{path}:{line_of(path, key)}" in message, message
    assert SECRET not in message  # the URL is shown redacted


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_validation_connects_to_nothing(tmp_path: Path) -> None:
    path = config_file(tmp_path, f'url = "redis://127.0.0.1:{_unused_port()}/3"\nttl_s = 60')
    load_config(path)  # no server there: validation never tried to reach it
    proc = kvo("validate", path)
    assert proc.returncode == 0, proc.stderr
    assert "tier 1: 'redis'" in proc.stdout


def test_the_defaults_are_read_from_the_constructor() -> None:
    parameters = list(inspect.signature(RedisTier.__init__).parameters.values())[4:]
    assert _constructor_defaults() == {p.name: p.default for p in parameters}
    assert _constructor_defaults()["url"] == "redis://127.0.0.1:6379/0"
