"""Validation of the fs tier's config keys: each error names the tier, the key and the fix."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kv_offload.errors import ConfigError

from ._format import file_size

__all__ = ["FSYNC_MODES", "MAX_IO_THREADS", "FsTierSettings", "validate"]

FSYNC_MODES = ("always", "never")
MAX_IO_THREADS = 64


@dataclass(frozen=True)
class FsTierSettings:
    root_dir: Path
    capacity: int
    capacity_in_bytes: bool
    durable: bool
    io_threads: int
    delete_on_shutdown: bool


def _positive_int(tier: str, key: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"tier {tier!r}: {key} must be a positive integer, got {value!r}; {fix}")
    return value


def validate(
    tier: str,
    block_size: int,
    root_dir: Any,
    capacity_bytes: Any,
    capacity_blocks: Any,
    fsync: Any,
    io_threads: Any,
    delete_on_shutdown: Any,
) -> FsTierSettings:
    if root_dir is None or root_dir == "":
        raise ConfigError(
            f"tier {tier!r}: root_dir is required: the directory the blocks are written to, "
            f'e.g. root_dir = "/mnt/nvme/kv-cache"'
        )
    if not isinstance(root_dir, (str, os.PathLike)):
        raise ConfigError(f"tier {tier!r}: root_dir must be a path string, got {root_dir!r}")
    path = Path(os.fspath(root_dir)).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"tier {tier!r}: root_dir {str(path)!r} exists and is not a directory; "
            "point it at a directory"
        )
    if (capacity_bytes is None) == (capacity_blocks is None):
        raise ConfigError(
            f"tier {tier!r}: set exactly one of capacity_bytes or capacity_blocks (got "
            f"{'both' if capacity_bytes is not None else 'neither'}); the tier evicts least "
            "recently used blocks to stay within it"
        )
    if capacity_blocks is not None:
        capacity = _positive_int(tier, "capacity_blocks", capacity_blocks, "e.g. 100000")
        in_bytes = False
    else:
        capacity = _positive_int(tier, "capacity_bytes", capacity_bytes, "e.g. 107374182400")
        in_bytes = True
        if capacity < file_size(block_size):
            raise ConfigError(
                f"tier {tier!r}: capacity_bytes {capacity} is smaller than one block file "
                f"({file_size(block_size)} bytes); raise it"
            )
    if fsync not in FSYNC_MODES:
        raise ConfigError(
            f"tier {tier!r}: fsync must be one of {', '.join(repr(m) for m in FSYNC_MODES)}, "
            f"got {fsync!r}"
        )
    threads = _positive_int(tier, "io_threads", io_threads, "e.g. 4")
    if threads > MAX_IO_THREADS:
        raise ConfigError(
            f"tier {tier!r}: io_threads must be at most {MAX_IO_THREADS}, got {threads}"
        )
    if not isinstance(delete_on_shutdown, bool):
        raise ConfigError(
            f"tier {tier!r}: delete_on_shutdown must be true or false, got {delete_on_shutdown!r}"
        )
    return FsTierSettings(path, capacity, in_bytes, fsync == "always", threads, delete_on_shutdown)
