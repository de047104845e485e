"""Two fs tiers in cascade from one config (issue 11): an "nvme" tier and a "network" tier,
both ``type = "fs"``, told apart by the ``name`` key in stats, events, hooks, the tiers' own
stats and logs, and ``kv-offload replay`` output; real directories, bytes checked."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from _fs import BLOCK, HIT, block_files, check_no_leaks, promote, store
from _tiers import key
from kv_offload import ConfigError, ReqContext, TieringOffloadingManager, build_manager
from kv_offload.plugins import create_plugin_manager, hookimpl
from kv_offload_fs_tier import FileSystemTier
from test_cli import TRACE, kvo


def two_tiers(tmp_path: Path, near: int = 8, far: int = 100) -> dict[str, Any]:
    return {
        "num_blocks": 4,
        "block_size_bytes": BLOCK,
        "enable_events": True,
        "tiers": [
            {"type": "fs", "name": "nvme", "root_dir": str(tmp_path / "nvme"),
             "capacity_blocks": near},
            {"type": "fs", "name": "network", "root_dir": str(tmp_path / "net"),
             "capacity_blocks": far},
        ],
    }  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str, bool]] = []

    @hookimpl
    def kv_offload_tier_job_finished(self, tier: str, direction: str, success: bool) -> None:
        self.jobs.append((tier, direction, success))


def test_two_named_fs_tiers_cascade_evict_and_promote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    pm = create_plugin_manager(autoload=False, plugins=[recorder])
    m = build_manager(two_tiers(tmp_path), plugin_manager=pm)
    assert isinstance(m, TieringOffloadingManager)
    near, far = m.tiers
    assert isinstance(near, FileSystemTier) and isinstance(far, FileSystemTier)
    assert [entry.name for entry in m.entries] == ["nvme", "network"]
    ctx = ReqContext("r")
    keys = [key(i) for i in range(24)]
    for start in range(0, 24, 2):
        store(m, keys[start : start + 2], ctx)
    # The small tier keeps the 8 most recent blocks, the large one all 24, each on its disk.
    assert len(near) == 8 and len(far) == 24
    assert len(block_files(tmp_path / "nvme")) == 8
    assert len(block_files(tmp_path / "net")) == 24
    assert near.get_stats().evicted_blocks == 16 and far.get_stats().evicted_blocks == 0
    events = m.take_events()
    assert {e.medium for e in events} == {"CPU", "nvme", "network"}
    assert sum(len(e.keys) for e in events if e.medium == "network" and not e.removed) == 24
    # Every block comes back byte-identical: recent ones from nvme, older ones from network.
    for k in keys:
        assert promote(m, k, ctx) is HIT
    stats = m.get_stats()
    assert [t.name for t in stats.tiers] == ["nvme", "network"]
    assert stats.tiers[0].promoted_blocks > 0 and stats.tiers[1].promoted_blocks > 0
    assert stats.tiers[0].failed_promotions == stats.tiers[1].failed_promotions == 0
    assert {(t, d) for t, d, ok in recorder.jobs if ok} == {
        ("nvme", "store"), ("network", "store"), ("nvme", "load"), ("network", "load")
    }  # fmt: skip
    check_no_leaks(m)
    # A failure is logged under the tier's name: remove a block file behind nvme's back.
    victim = next(k for k in reversed(keys) if k in near)
    (next(p for p in block_files(tmp_path / "nvme") if p.name == victim.hex())).unlink()
    evict_all = [key(1000 + i) for i in range(4)]
    store(m, evict_all, ctx)  # the CPU tier forgets the victim
    with caplog.at_level(logging.WARNING, logger="kv_offload.fs_tier"):
        promote(m, victim, ctx)
    # A tier logs under its type (the stack's name for it is the manager's: stats, hooks).
    assert "tier 'fs'" in caplog.text and "the block file is gone" in caplog.text
    m.shutdown()


def test_two_fs_tiers_cannot_share_a_root_dir(tmp_path: Path) -> None:
    config = two_tiers(tmp_path)
    config["tiers"][1]["root_dir"] = config["tiers"][0]["root_dir"]
    with pytest.raises(ConfigError, match="another fs tier of this process"):
        build_manager(config)


def test_replay_reports_each_named_fs_tier(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(
        f"""num_blocks = 64
block_size_bytes = 256

[[tiers]]
type = "fs"
name = "nvme"
root_dir = "{tmp_path / "nvme"}"
capacity_blocks = 64

[[tiers]]
type = "fs"
name = "network"
root_dir = "{tmp_path / "net"}"
capacity_blocks = 5000
"""
    )
    text, as_json = (
        kvo("replay", path, TRACE, "--limit", "40"),
        kvo("replay", path, TRACE, "--limit", "40", "--json"),
    )
    assert text.returncode == 0, text.stderr
    assert "from nvme" in text.stdout and "from network" in text.stdout
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert list(report["hit_ratio_by_tier"]) == ["CPU", "nvme", "network"]
    assert report["corrupted_blocks"] == 0 and report["cascaded_blocks"] > 0
