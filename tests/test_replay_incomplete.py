"""Issue 10 #14: a tier that never reports its jobs: ``kv-offload replay`` still prints its
report, marked incomplete, after ``drain_timeout_s`` (config) or ``--drain-timeout`` (CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kv_offload import ConfigError, TieringOffloadingManager, build_manager
from test_cli import TRACE, kvo, kvo_many

STUCK = """num_blocks = 16
block_size_bytes = 256
{extra}
[[tiers]]
type = "faulty"
delay_polls = 1000000000   # holds every result: the tier never reports
[tiers.inner]
type = "example"
"""


def test_replay_with_a_stuck_tier_prints_an_incomplete_report(tmp_path: Path) -> None:
    config = tmp_path / "stuck.toml"
    config.write_text(STUCK.format(extra="drain_timeout_s = 0.2\n"))
    text, as_json = kvo_many(
        ["replay", config, TRACE, "--limit", "20"],
        ["replay", config, TRACE, "--limit", "20", "--json", "--drain-timeout", "0.1"],
    )
    assert text.returncode == 1, text.stderr
    assert text.stdout.startswith("INCOMPLETE: ") and "did not finish" in text.stdout
    assert "hit ratio" in text.stdout
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert "did not finish within the drain timeout" in report["incomplete"]
    assert report["requests"] == 20


def test_drain_timeout_s_is_a_config_key() -> None:
    manager = build_manager(
        {
            "num_blocks": 4,
            "block_size_bytes": 64,
            "drain_timeout_s": 2.5,
            "tiers": [{"type": "example"}],
        }
    )
    assert isinstance(manager, TieringOffloadingManager) and manager.drain_timeout == 2.5
    manager.shutdown()
    for bad in (0, -1, "10", True, float("inf")):
        with pytest.raises(ConfigError, match="drain_timeout_s"):
            build_manager({"num_blocks": 4, "drain_timeout_s": bad})


def test_drain_timeout_option_must_be_positive(tmp_path: Path) -> None:
    proc = kvo("replay", "default", TRACE, "--drain-timeout", "0")
    assert proc.returncode == 2 and "--drain-timeout" in proc.stderr
