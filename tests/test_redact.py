"""Credentials in tier arguments never reach `kv-offload validate`'s output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kv_offload.cli import main
from kv_offload.redact import redact_secrets, redact_url

SECRET = "hunter2-not-for-print"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        (f"rediss://kv:{SECRET}@cache.example:6380", "rediss://kv:***@cache.example:6380"),
        ("redis://10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_secrets_walks_arguments_and_keeps_env_var_names() -> None:
    arguments = {
        "type": "redis",
        "url": f"redis://:{SECRET}@h:1/0",
        "password": SECRET,
        "password_env": "KV_REDIS_PASSWORD",
        "startup_nodes": ["h:1", "h:2"],
        "nested": {"api_key": SECRET},
        "ttl_s": 60,
    }
    shown = redact_secrets(arguments)
    assert SECRET not in json.dumps(shown)
    assert shown["password_env"] == "KV_REDIS_PASSWORD"
    assert shown["startup_nodes"] == ["h:1", "h:2"] and shown["ttl_s"] == 60
    assert arguments["password"] == SECRET  # the original is untouched


@pytest.mark.parametrize("as_json", [False, True])
def test_validate_never_prints_a_url_password(
    tmp_path: Path, as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "stack.toml"
    config.write_text(
        'num_blocks = 16\nblock_size_bytes = 4096\n\n[[tiers]]\ntype = "redis"\n'
        f'url = "redis://:{SECRET}@127.0.0.1:6379/0"\n'
    )
    pytest.importorskip("kv_offload_redis_tier")
    assert main(["validate", str(config), *(["--json"] if as_json else [])]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "redis://:***@127.0.0.1:6379/0" in out
