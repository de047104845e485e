"""Config files with one secondary tier, for the tiers' validation tests (fs, Redis): a
file with the tier's lines, and the line a key is on (errors are located there)."""

from __future__ import annotations

from pathlib import Path

TOML = """num_blocks = 8
block_size_bytes = {block}

[[tiers]]
type = "{tier}"
{lines}
"""


def tier_config_file(tmp_path: Path, tier: str, lines: str, block: int = 64) -> Path:
    """``tmp_path/stack.toml``: 8 CPU blocks of ``block`` bytes and one ``tier`` with
    ``lines`` (TOML lines of its table)."""
    path = tmp_path / "stack.toml"
    path.write_text(TOML.format(block=block, tier=tier, lines=lines))
    return path


def line_of(path: Path, key: str) -> int:
    """The number of the line of ``path`` that sets ``key``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith(f"{key} ="):
            return number
    raise AssertionError(f"{key} not in {path}")
