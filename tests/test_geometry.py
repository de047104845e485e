"""Issue 25: block geometry for a replay (``--block-bytes``, ``--model``, ``--cpu-bytes``) and
a stack scaled to fit this machine, said with its figures, never silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kv_offload.config import parse_config
from kv_offload.errors import ConfigError
from kv_offload.geometry import (
    MEMORY_SHARE,
    MODEL_PRESETS,
    apply_geometry,
    describe_scaling,
    parse_size,
)
from test_cli import TRACE, kvo, kvo_many

MIB = 1024**2
GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("256KiB", 256 * 1024), ("2 MiB", 2 * MIB), ("1.5GB", 1_500_000_000)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text, "--block-bytes") == size


@pytest.mark.parametrize("bad", ["", "0", "2 parsecs", "-1KiB", "0.5", "lots"])
def test_bad_sizes_name_the_option(bad: str) -> None:
    with pytest.raises(ConfigError, match="--block-bytes"):
        parse_size(bad, "--block-bytes")


def test_a_model_preset_is_bytes_per_token_times_block_tokens() -> None:
    llama = MODEL_PRESETS["llama-3.1-8b"]
    assert llama.bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, bf16: 128 KiB
    stack = parse_config({"num_blocks": 10, "block_size_bytes": 4096})
    scaled, geometry = apply_geometry(
        stack, block_tokens=16, model="llama-3.1-8b", available_memory=64 * GIB
    )
    assert scaled.block_size_bytes == geometry.block_bytes == 16 * 128 * 1024
    assert scaled.num_blocks == 10 and geometry.scaled == []
    assert "131,072 bytes per token x 16 tokens" in geometry.source


def test_cpu_bytes_sizes_the_cpu_tier() -> None:
    stack = parse_config({"num_blocks": 10, "block_size_bytes": 4096})
    scaled, geometry = apply_geometry(
        stack, block_tokens=512, block_bytes=MIB, cpu_bytes=64 * MIB, available_memory=64 * GIB
    )
    assert scaled.num_blocks == geometry.cpu_blocks == 64
    with pytest.raises(ConfigError, match="holds no block"):
        apply_geometry(stack, block_tokens=512, block_bytes=MIB, cpu_bytes=1000)


def test_a_stack_too_big_for_memory_is_scaled_with_figures() -> None:
    stack = parse_config(
        {
            "num_blocks": 1000,
            "block_size_bytes": 4096,
            "tiers": [{"type": "example", "capacity_blocks": 3000}],
        }
    )
    memory = 4 * GIB  # the replay may use 60% of it: 2.4 GiB for 4000 blocks of 2 MiB
    scaled, geometry = apply_geometry(
        stack, block_tokens=512, block_bytes=2 * MIB, available_memory=memory
    )
    budget_blocks = int(memory * MEMORY_SHARE) // (2 * MIB)
    cpu = scaled.num_blocks
    tier = scaled.tiers[0].arguments["capacity_blocks"]
    assert cpu + tier <= budget_blocks and cpu == pytest.approx(budget_blocks / 4, abs=2)
    assert tier == pytest.approx(3 * cpu, abs=3)  # scaled by the same factor
    assert scaled.block_size_bytes == 2 * MIB  # same bytes per block
    assert [s["what"] for s in geometry.scaled] == ["CPU tier", "tier 'example'"]
    lines = describe_scaling(geometry)
    assert "1000 -> " in lines[0] and "2.1 GB" in lines[0] and "do not fit" in lines[0]
    # A fleet shares the machine: each engine gets its share.
    fleet, _ = apply_geometry(
        stack, block_tokens=512, block_bytes=2 * MIB, available_memory=memory, engines=4
    )
    assert fleet.num_blocks == pytest.approx(cpu / 4, abs=2)


def test_a_disk_tier_larger_than_its_disk_is_scaled(tmp_path: Path) -> None:
    stack = parse_config(
        {
            "num_blocks": 4,
            "block_size_bytes": 4096,
            "tiers": [{"type": "fs", "root_dir": str(tmp_path / "x"), "capacity_blocks": 1000}],
        }
    )
    scaled, geometry = apply_geometry(
        stack,
        block_tokens=512,
        block_bytes=MIB,
        available_memory=64 * GIB,
        free_disk=lambda root: 100 * MIB,
    )
    assert scaled.tiers[0].arguments["capacity_blocks"] == 80  # 80% of the free space
    assert geometry.scaled[0]["what"] == "tier 'fs'" and "disk at" in geometry.scaled[0]["why"]


def test_geometry_options_in_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 32\nblock_size_bytes = 4096\n")
    ok, both, model, size = kvo_many(
        ["replay", config, TRACE, "--limit", "30", "--block-bytes", "64KiB", "--json"],
        ["replay", config, TRACE, "--limit", "3", "--block-bytes", "1MiB", "--model", "qwen3-0.6b"],
        ["replay", config, TRACE, "--limit", "3", "--model", "gpt-9"],
        ["replay", config, TRACE, "--limit", "3", "--block-bytes", "big"],
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["geometry"]["block_bytes"] == 64 * 1024
    assert report["geometry"]["source"] == "--block-bytes" and report["geometry"]["scaled"] == []
    assert both.returncode == 2 and "not both" in both.stderr
    assert model.returncode == 2 and "'gpt-9' is not a preset" in model.stderr
    assert "llama-3.1-8b" in model.stderr
    assert size.returncode == 2 and "--block-bytes: 'big' is not a size" in size.stderr


def test_text_report_shows_the_block_size(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 32\n")
    proc = kvo("replay", config, TRACE, "--limit", "10", "--model", "llama-3.2-1b")
    assert proc.returncode == 0, proc.stderr
    assert "block size       16,777,216 bytes (--model llama-3.2-1b" in proc.stdout


# -- issue 37: a block too big for the machine is blamed on the block size; PiB is a size ---


@pytest.mark.parametrize(
    ("text", "size"), [("1PiB", 1024**5), ("2PB", 2 * 1000**5), ("1e", 10**18)]
)
def test_peta_and_exa_sizes(text: str, size: int) -> None:
    assert parse_size(text, "--cpu-bytes") == size


def test_a_bad_size_lists_the_units() -> None:
    with pytest.raises(ConfigError, match=r"units B, k/kB/KiB, .* T/TB/TiB, P/PB/PiB, E/EB/EiB"):
        parse_size("1ZiB", "--cpu-bytes")


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"block_bytes": 10 * 1024**4}, "--block-bytes: one block of 11.0 TB does not fit"),
        ({"model": "llama-3.1-70b"}, "give fewer --block-tokens, a smaller --model"),
    ],
)
def test_one_block_larger_than_the_memory_is_blamed_on_the_block_size(
    options: dict[str, object], fix: str
) -> None:
    stack = parse_config({"num_blocks": 10, "block_size_bytes": 4096})
    with pytest.raises(ConfigError, match=fix) as caught:
        apply_geometry(stack, block_tokens=512, available_memory=64 * MIB, **options)  # type: ignore[arg-type]
    assert "num_blocks" not in str(caught.value) and caught.value.key is None


def test_block_and_cpu_sizes_in_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 32\nblock_size_bytes = 4096\n")
    huge, peta = kvo_many(
        ["replay", config, TRACE, "--limit", "3", "--block-bytes", "10TiB"],
        ["replay", config, TRACE, "--limit", "3", "--cpu-bytes", "1PiB", "--json"],
    )
    assert huge.returncode == 2 and "num_blocks" not in huge.stderr
    assert "--block-bytes: one block of 11.0 TB does not fit in the" in huge.stderr
    assert "give a smaller --block-bytes" in huge.stderr
    assert peta.returncode == 0, peta.stderr
    scaled = json.loads(peta.stdout)["geometry"]["scaled"]
    assert scaled[0]["blocks_before"] == 1024**5 // 4096  # sized in bytes, then scaled to fit
