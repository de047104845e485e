"""The optional ``name`` of a ``[[tiers]]`` entry: defaults, repeats of one type, uniqueness,
and the name in stats, events, hooks and ``kv-offload replay``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _tiers import expected_rows, key
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    load_config,
)
from kv_offload.plugins import create_plugin_manager, hookimpl
from kv_offload.tiering import OffloadingConfig, SecondaryTierFactory, TierEntry
from kv_offload.tiering.names import tier_names
from kv_offload_example_tier import ExampleSecondaryTierManager

BLOCK = 64
TRACE = Path(__file__).resolve().parents[2] / "data" / "conversation_trace.jsonl"


def config(*tiers: dict[str, Any]) -> dict[str, Any]:
    return {"num_blocks": 4, "block_size_bytes": BLOCK, "enable_events": True, "tiers": list(tiers)}


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([("fs", None)], ["fs"]),
        ([("fs", None), ("fs", None)], ["1:fs", "2:fs"]),
        ([("redis", None), ("fs", None), ("fs", None)], ["redis", "2:fs", "3:fs"]),
        ([("fs", "hot"), ("fs", None)], ["hot", "fs"]),
        ([("fs", "hot"), ("fs", "cold")], ["hot", "cold"]),
        ([("fs", None), ("fs", "fs-b"), ("fs", None)], ["1:fs", "fs-b", "3:fs"]),
    ],
)
def test_names(entries: list[tuple[str, str | None]], expected: list[str]) -> None:
    assert tier_names(entries) == expected


def test_two_explicit_names_alike_name_both_entries() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            config({"type": "example", "name": "disk"}, {"type": "example", "name": "disk"})
        )
    message = str(info.value)
    assert "tiers[1].name" in message and "tiers[0]" in message and "'disk'" in message
    assert "distinct name" in message


def test_an_explicit_name_may_not_take_an_unnamed_tier_s_name() -> None:
    with pytest.raises(ConfigError, match=r"tiers\[1\].*'example'.*like tiers\[0\]"):
        load_config(config({"type": "example"}, {"type": "example", "name": "example"}))


def test_cpu_is_reserved() -> None:
    with pytest.raises(ConfigError, match="reserved for the CPU tier"):
        load_config(config({"type": "example", "name": "CPU"}))


def test_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.name: must be a non-empty string"):
        load_config(config({"type": "example", "name": 3}))


def test_toml_errors_point_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'num_blocks = 4\nblock_size_bytes = 64\n\n[[tiers]]\ntype = "example"\nname = "a"\n\n'
        '[[tiers]]\ntype = "example"\nname = "a"\n'
    )
    with pytest.raises(ConfigError, match=rf"{path.name}:10"):
        load_config(path)


def test_name_is_not_a_constructor_argument() -> None:
    stack = load_config(config({"type": "example", "name": "hot", "capacity_blocks": 8}))
    assert stack.tiers[0].name == "hot"
    assert stack.tiers[0].arguments == {"capacity_blocks": 8}
    assert stack.describe()["tiers"] == [{"type": "example", "capacity_blocks": 8, "name": "hot"}]


class Recorder:
    def __init__(self) -> None:
        self.media: list[tuple[str, str]] = []

    @hookimpl
    def kv_offload_blocks_stored(self, medium: str) -> None:
        self.media.append(("stored", medium))

    @hookimpl
    def kv_offload_tier_job_finished(self, tier: str) -> None:
        self.media.append(("job", tier))


def test_two_tiers_of_one_type_in_stats_events_and_hooks() -> None:
    recorder = Recorder()
    pm = create_plugin_manager(autoload=False, plugins=[recorder])
    m = build_manager(config({"type": "example"}, {"type": "example"}), plugin_manager=pm)
    assert isinstance(m, TieringOffloadingManager)
    assert [entry.name for entry in m.entries] == ["1:example", "2:example"]
    ctx = ReqContext("r")
    out = m.prepare_store([key(0)], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows(out.keys_to_store, BLOCK))
    m.complete_store(out.keys_to_store, ctx)
    m.drain()
    assert [t.name for t in m.tier_stats()] == ["1:example", "2:example"]
    assert [t.cascaded_blocks for t in m.tier_stats()] == [1, 1]
    assert [e.medium for e in m.take_events()] == ["CPU", "1:example", "2:example"]
    assert ("job", "1:example") in recorder.media and ("stored", "2:example") in recorder.media
    m.shutdown()


def test_explicit_names_reach_the_tiers() -> None:
    m = build_manager(config({"type": "example", "name": "hot"}, {"type": "example"}))
    assert isinstance(m, TieringOffloadingManager)
    assert [entry.name for entry in m.entries] == ["hot", "example"]
    assert [entry.tier for entry in m.entries] == m.tiers
    m.shutdown()


def test_a_tier_built_in_code_is_called_by_its_type_unless_its_entry_names_it() -> None:
    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    view, config = primary.kv_buffer.view, OffloadingConfig(4, BLOCK)
    plain = ExampleSecondaryTierManager(config, view, "example")
    named = ExampleSecondaryTierManager(config, view, "example")
    m = TieringOffloadingManager(primary, [plain, TierEntry(named, name="renamed")])
    assert [entry.name for entry in m.entries] == ["example", "renamed"]
    assert [t.name for t in m.tier_stats()] == ["example", "renamed"]
    assert "name" not in vars(named) and "_name" not in vars(named)  # the stack's, not its
    m.shutdown()


class FixedName(ExampleSecondaryTierManager):
    """A tier with an attribute of its own called ``name``: the stack neither reads nor
    overwrites it."""

    @property
    def name(self) -> str:
        return "fixed"


def test_a_tier_s_own_name_attribute_is_left_alone(tmp_path: Path) -> None:
    SecondaryTierFactory.register_tier("fixed", __name__, "FixedName")
    try:
        m = build_manager(config({"type": "fixed", "name": "other"}))
        assert isinstance(m, TieringOffloadingManager)
        assert m.tier_stats()[0].name == "other"
        assert m.tiers[0].name == "fixed"  # type: ignore[attr-defined]
        m.shutdown()
    finally:
        SecondaryTierFactory.unregister_tier("fixed")


def test_replay_reports_tiers_by_name(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'num_blocks = 500\nblock_size_bytes = 256\n\n[[tiers]]\ntype = "example"\n\n'
        '[[tiers]]\ntype = "example"\nname = "second"\n'
    )
    command = [sys.executable, "-m", "kv_offload.cli", "replay", str(path), str(TRACE)]
    proc = subprocess.run(
        [*command, "--limit", "200", "--json", "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["hit_ratio_by_tier"]) == {"CPU", "example", "second"}
