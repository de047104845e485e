"""The ``default`` config of ``validate`` and ``replay``: the real stack with no file to write.

It is :data:`~kv_offload.config.DEFAULT_CONFIG`'s CPU tier (5,000 blocks of 4 KiB, LRU) in
front of the fs tier (``kv-offload-fs-tier``, 20,000 blocks) in a new temporary directory,
deleted at the end; ``--root DIR`` puts the tier in ``DIR`` instead and ``--keep`` keeps its
blocks there, so a later ``--root DIR`` run starts with them (the tier's persistence).

The fs tier gets a backpressure gate: a replay runs far faster than the trace's real time,
and a disk slower than that would otherwise pin every CPU block in cascades it cannot take
(the CPU tier then stores nothing and its hit ratio collapses); with the gate, cascades the
disk cannot take in time are dropped and the CPU tier keeps serving.

Without ``kv-offload-fs-tier`` the ``default`` config is refused with the command that
installs it: one name, one stack on every machine (a silent CPU-only fallback would make two
machines' ``default`` reports incomparable).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from ..config import DEFAULT_CONFIG, StackConfig, load_config, parse_config, resolve_config
from ..errors import ConfigError
from ..tiering import SecondaryTierFactory

__all__ = ["DEFAULT_NAME", "DEFAULT_SOURCE", "FS_DISTRIBUTION", "default_stack", "stack_for"]

#: The config argument that selects this stack (a file of that name: pass ./default).
DEFAULT_NAME = "default"
DEFAULT_SOURCE = "<default config>"
FS_DISTRIBUTION = "kv-offload-fs-tier"
#: The fs tier of the default stack; ``root_dir`` and ``delete_on_shutdown`` come from the
#: command line.
FS_TIER: dict[str, Any] = {
    "type": "fs",
    "capacity_blocks": 20000,
    "backpressure": {"detector": "utilization", "max_in_flight_jobs": 32},
}
_PREFIX = "kv-offload-default-"


def default_config(root: Path, keep: bool) -> dict[str, Any]:
    """The default stack as a config dict, its fs tier in ``root``."""
    tier = {**FS_TIER, "root_dir": str(root), "delete_on_shutdown": not keep}
    return {**DEFAULT_CONFIG, "tiers": [tier]}


def _require_fs_tier() -> None:
    if not any(info.name == "fs" for info in SecondaryTierFactory.registry.available()):
        raise ConfigError(
            f"the 'default' config is a CPU tier in front of the fs tier, and {FS_DISTRIBUTION} "
            f"is not installed: pip install {FS_DISTRIBUTION} (or pass a config of your own; "
            "one without [[tiers]] needs no plugin but a policy)"
        )


def default_stack(root: Path, keep: bool) -> StackConfig:
    """The resolved default stack with its fs tier in ``root`` (not created here)."""
    _require_fs_tier()
    stack = parse_config(default_config(root, keep), source=DEFAULT_SOURCE)
    resolve_config(stack)
    return stack


def _check_options(args: argparse.Namespace) -> None:
    if args.config != DEFAULT_NAME and (args.root is not None or args.keep):
        option = "--root" if args.root is not None else "--keep"
        raise ConfigError(
            f"{option} applies to the {DEFAULT_NAME!r} config only; for {args.config} set "
            "root_dir (and delete_on_shutdown) in its fs tier"
        )


def describe_stack(args: argparse.Namespace) -> StackConfig:
    """The stack ``validate`` checks: for ``default`` without ``--root``, the temporary
    directory a replay would make is shown by its pattern (``validate`` creates nothing)."""
    _check_options(args)
    if args.config != DEFAULT_NAME:
        return load_config(args.config)
    root = args.root or Path(tempfile.gettempdir()) / f"{_PREFIX}XXXXXXXX"
    return default_stack(root, args.keep)


@contextmanager
def stack_for(args: argparse.Namespace) -> Iterator[StackConfig]:
    """The stack ``replay`` runs. For ``default`` without ``--root``, a new temporary
    directory holds the fs tier for the duration: removed afterwards (the tier deletes its
    files at shutdown) unless ``--keep``, which says on stderr where the blocks are."""
    _check_options(args)
    if args.config != DEFAULT_NAME:
        yield load_config(args.config)
        return
    if args.root is not None:
        yield default_stack(args.root, args.keep)
        _say_kept(args.root, args.keep)
        return
    _require_fs_tier()  # before making a directory
    made = Path(tempfile.mkdtemp(prefix=_PREFIX))
    try:
        yield default_stack(made, args.keep)
    finally:
        # Empty once the tier deleted its files (or if it never ran): removed, even with
        # --keep; anything else is left alone (rmdir removes only an empty directory).
        with suppress(OSError):
            os.rmdir(made)
        _say_kept(made, args.keep and made.exists())


def _say_kept(root: Path, keep: bool) -> None:
    if keep:
        print(
            f"the fs tier's blocks are kept in {root} (replay with --root {root} to start "
            "with them; delete the directory when done)",
            file=sys.stderr,
        )
