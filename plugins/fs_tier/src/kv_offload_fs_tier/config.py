"""Validation of the fs tier's config keys: each error names the tier, the key and the fix.

Two layers, so that ``kv-offload validate`` and ``load_config`` find every mistake the
constructor would, without creating or allocating anything: :func:`check_arguments` (the
keys as written; ``validate_arguments``) and :func:`check_for_block_size` (what needs the
stack's ``block_size_bytes``: a byte capacity below one block file, a ``root_dir`` written
with another block size; ``validate_for_stack``). The constructor runs both through
:func:`validate`, then :class:`~.layout.RootDir` repeats the directory checks on the
descriptors it opens (the directory may change between validation and construction).
Every error carries ``key=`` the argument at fault, so a TOML config's error names its line.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kv_offload.block_auth import BlockAuth
from kv_offload.errors import ConfigError

from . import layout

__all__ = [
    "DEFAULTS",
    "FSYNC_MODES",
    "MAX_IO_THREADS",
    "FsTierSettings",
    "check_arguments",
    "check_for_block_size",
    "validate",
]

FSYNC_MODES = ("always", "never")
MAX_IO_THREADS = 64
#: The constructor's defaults (a test checks them against its signature).
DEFAULTS: dict[str, Any] = {
    "root_dir": None,
    "capacity_bytes": None,
    "capacity_blocks": None,
    "fsync": "never",
    "io_threads": 4,
    "delete_on_shutdown": False,
    "auth_key_env": None,
    "auth_key_previous_env": None,
}


@dataclass(frozen=True)
class FsTierSettings:
    root_dir: Path
    capacity: int
    capacity_in_bytes: bool
    durable: bool
    io_threads: int
    delete_on_shutdown: bool
    #: signs and checks every block (``auth_key_env``); ``None``: checksums only
    auth: BlockAuth | None = None


def _positive_int(tier: str, key: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"tier {tier!r}: {key} must be a positive integer, got {value!r}; {fix}", key=key
        )
    return value


def _root_error(tier: str, path: Path, what: str, fix: str) -> ConfigError:
    return ConfigError(f"tier {tier!r}: root_dir {str(path)!r} {what}; {fix}", key="root_dir")


def _check_root(tier: str, path: Path) -> None:
    """``path`` is a directory this process can write (or can be created, as the nearest
    existing ancestor is a writable directory), and holds no foreign or damaged layout."""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise _root_error(
                tier, path, "exists and is not a directory", "point it at a directory"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise _root_error(
                tier,
                path,
                "is not writable",
                "the fs tier writes blocks there: choose a writable directory or fix its "
                "permissions",
            )
        _check_marker(tier, path)
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise _root_error(
            tier,
            path,
            f"does not exist and cannot be created ({str(parent)!r} is not a writable directory)",
            "choose a writable location",
        )


def _read_marker(path: Path) -> dict[str, Any] | bool | None:
    """The directory's marker fields; ``None`` for a damaged or foreign one; ``False``
    when it has none."""
    try:
        data = (path / layout.MARKER_NAME).read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return layout.parse_marker(data)


def _check_marker(tier: str, path: Path) -> None:
    marker = _read_marker(path)
    if marker is False:
        for name in ("blocks", "tmp"):
            if (path / name).exists() or (path / name).is_symlink():
                raise _root_error(
                    tier,
                    path,
                    f"has a {name!r} entry but no {layout.MARKER_NAME}: it was not written by "
                    "the kv-offload fs tier",
                    "point root_dir at an empty or new directory",
                )
        return
    if not isinstance(marker, dict):
        raise _root_error(
            tier,
            path,
            f"has a damaged or foreign {layout.MARKER_NAME}",
            "point root_dir at a directory of its own, or delete this one",
        )
    version = marker.get("format_version")
    if version != layout.FORMAT_VERSION:
        raise _root_error(
            tier,
            path,
            f"was written in fs-tier format version {version!r}, this version reads "
            f"{layout.FORMAT_VERSION}",
            "point root_dir at another directory, or delete this one",
        )


def check_arguments(tier: str, **arguments: Any) -> dict[str, Any]:
    """The keys as written (missing ones take the constructor's defaults); the values with
    ``root_dir`` as a :class:`~pathlib.Path`. Creates nothing."""
    values = {**DEFAULTS, **arguments}
    root_dir = values["root_dir"]
    if root_dir is None or root_dir == "":
        raise ConfigError(
            f"tier {tier!r}: root_dir is required: the directory the blocks are written to, "
            f'e.g. root_dir = "/mnt/nvme/kv-cache"',
            key="root_dir",
        )
    if not isinstance(root_dir, (str, os.PathLike)):
        raise ConfigError(
            f"tier {tier!r}: root_dir must be a path string, got {root_dir!r}", key="root_dir"
        )
    path = Path(os.fspath(root_dir)).expanduser()
    capacity_bytes, capacity_blocks = values["capacity_bytes"], values["capacity_blocks"]
    if (capacity_bytes is None) == (capacity_blocks is None):
        raise ConfigError(
            f"tier {tier!r}: set exactly one of capacity_bytes or capacity_blocks (got "
            f"{'both' if capacity_bytes is not None else 'neither'}); the tier evicts least "
            "recently used blocks to stay within it",
            key="capacity_blocks" if capacity_blocks is not None else "capacity_bytes",
        )
    if capacity_blocks is not None:
        _positive_int(tier, "capacity_blocks", capacity_blocks, "e.g. 100000")
    else:
        _positive_int(tier, "capacity_bytes", capacity_bytes, "e.g. 107374182400")
    fsync = values["fsync"]
    if fsync not in FSYNC_MODES:
        raise ConfigError(
            f"tier {tier!r}: fsync must be one of {', '.join(repr(m) for m in FSYNC_MODES)}, "
            f"got {fsync!r}",
            key="fsync",
        )
    threads = _positive_int(tier, "io_threads", values["io_threads"], "e.g. 4")
    if threads > MAX_IO_THREADS:
        raise ConfigError(
            f"tier {tier!r}: io_threads must be at most {MAX_IO_THREADS}, got {threads}",
            key="io_threads",
        )
    delete_on_shutdown = values["delete_on_shutdown"]
    if not isinstance(delete_on_shutdown, bool):
        raise ConfigError(
            f"tier {tier!r}: delete_on_shutdown must be true or false, got {delete_on_shutdown!r}",
            key="delete_on_shutdown",
        )
    _check_root(tier, path)
    auth = BlockAuth.from_arguments(
        tier,
        values["auth_key_env"],
        values["auth_key_previous_env"],
        context=layout.AUTH_CONTEXT,
    )
    return {**values, "root_dir": path, "auth": auth}


def check_for_block_size(tier: str, block_size: int, **arguments: Any) -> None:
    """What needs the stack's block size (after :func:`check_arguments`)."""
    values = {**DEFAULTS, **arguments}
    capacity_bytes = values["capacity_bytes"]
    if capacity_bytes is not None and capacity_bytes < layout.file_size(block_size):
        raise ConfigError(
            f"tier {tier!r}: capacity_bytes {capacity_bytes} is smaller than one block file "
            f"({layout.file_size(block_size)} bytes: a {layout.HEADER_SPACE}-byte header "
            f"and block_size_bytes {block_size}); raise it",
            key="capacity_bytes",
        )
    path = Path(os.fspath(values["root_dir"])).expanduser()
    marker = _read_marker(path) if path.is_dir() else False
    if isinstance(marker, dict) and marker.get("block_size_bytes") != block_size:
        raise _root_error(
            tier,
            path,
            f"holds blocks of {marker.get('block_size_bytes')!r} bytes, this stack's "
            f"block_size_bytes is {block_size}",
            "use a root_dir per block size, or delete this one",
        )
    _warn_if_larger_than_the_disk(tier, path, block_size, values)


def _warn_if_larger_than_the_disk(
    tier: str, path: Path, block_size: int, values: dict[str, Any]
) -> None:
    """A capacity the filesystem cannot hold passes (the disk may be freed before it fills),
    with a warning giving both figures: the tier bounds its capacity by what the disk holds
    (see the README), which is rarely what was meant."""
    capacity_bytes = values["capacity_bytes"]
    if capacity_bytes is None:
        capacity_bytes = values["capacity_blocks"] * layout.file_size(block_size)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        usage = shutil.disk_usage(existing)
    except OSError:
        return
    # A root that already holds blocks has them on the disk: only its size can be compared
    # without scanning it (validation stays cheap); a new root needs free space.
    room, what = (usage.total, "in all") if (path / "blocks").is_dir() else (usage.free, "free")
    if capacity_bytes > room:
        warnings.warn(
            f"tier {tier!r}: the capacity needs {capacity_bytes:,} bytes on disk but the "
            f"filesystem of root_dir {str(path)!r} has {room:,} bytes {what}; lower the "
            f"capacity or free space (the tier bounds its capacity by what the disk holds, "
            "less 5%)",
            UserWarning,
            stacklevel=2,
        )


def validate(tier: str, block_size: int, **arguments: Any) -> FsTierSettings:
    """Both checks, for the constructor: the settings it runs with."""
    values = check_arguments(tier, **arguments)
    check_for_block_size(tier, block_size, **arguments)
    in_bytes = values["capacity_bytes"] is not None
    return FsTierSettings(
        values["root_dir"],
        values["capacity_bytes"] if in_bytes else values["capacity_blocks"],
        in_bytes,
        values["fsync"] == "always",
        values["io_threads"],
        values["delete_on_shutdown"],
        values["auth"],
    )
