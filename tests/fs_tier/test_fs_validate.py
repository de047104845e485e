"""``kv-offload validate`` / ``load_config`` find every fs-tier argument the constructor
would refuse, located at the key's line, and create nothing: the tier's
``validate_arguments`` (the keys, ``root_dir`` writable or creatable and not another
program's) and ``validate_for_stack`` (what needs ``block_size_bytes``)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
from _fs import BLOCK, build_fs_stack
from _tier_config_files import line_of, tier_config_file
from kv_offload import ConfigError, load_config
from kv_offload_fs_tier import FileSystemTier
from kv_offload_fs_tier.config import DEFAULTS
from test_cli import kvo


def config_file(tmp_path: Path, lines: str, block: int = BLOCK) -> Path:
    return tier_config_file(tmp_path, "fs", lines, block)


def refused(path: Path, key: str, fragment: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert fragment in message, message
    assert f"{path}:{line_of(path, key)}" in message, message
    assert key in str(info.value.key), info.value.key
    return info.value


def test_the_defaults_are_the_constructors() -> None:
    parameters = list(inspect.signature(FileSystemTier.__init__).parameters.values())[4:]
    assert {p.name: p.default for p in parameters} == DEFAULTS


@pytest.mark.parametrize(
    ("lines", "key", "fragment"),
    [
        ('root_dir = ""\ncapacity_blocks = 10', "root_dir", "root_dir is required"),
        ("root_dir = 3\ncapacity_blocks = 10", "root_dir", "root_dir must be a path"),
        ('root_dir = "{root}"\ncapacity_blocks = 0', "capacity_blocks", "positive integer"),
        ('root_dir = "{root}"\ncapacity_blocks = true', "capacity_blocks", "positive integer"),
        ('root_dir = "{root}"\ncapacity_bytes = "1G"', "capacity_bytes", "positive integer"),
        (
            'root_dir = "{root}"\ncapacity_blocks = 10\ncapacity_bytes = 100000',
            "capacity_blocks",
            "exactly one of",
        ),
        ('root_dir = "{root}"\ncapacity_bytes = 8191', "capacity_bytes", "smaller than one"),
        ('root_dir = "{root}"\ncapacity_blocks = 1\nfsync = "often"', "fsync", "fsync must"),
        ('root_dir = "{root}"\ncapacity_blocks = 1\nio_threads = 65', "io_threads", "at most"),
        ('root_dir = "{root}"\ncapacity_blocks = 1\nio_threads = 0', "io_threads", "positive"),
        (
            'root_dir = "{root}"\ncapacity_blocks = 1\ndelete_on_shutdown = 1',
            "delete_on_shutdown",
            "true or false",
        ),
    ],
)
def test_bad_values_are_located_at_their_line(
    tmp_path: Path, lines: str, key: str, fragment: str
) -> None:
    root = tmp_path / "fs"
    refused(config_file(tmp_path, lines.format(root=root)), key, fragment)
    assert not root.exists()


def test_root_dir_must_be_a_directory_that_can_be_written_or_created(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    for root, fragment in (
        (file, "exists and is not a directory"),
        (file / "sub" / "fs", "cannot be created"),
    ):
        path = config_file(tmp_path, f'root_dir = "{root}"\ncapacity_blocks = 10')
        refused(path, "root_dir", fragment)
    # A new directory several levels down is fine, and validation makes none of it.
    deep = tmp_path / "a" / "b" / "fs"
    load_config(config_file(tmp_path, f'root_dir = "{deep}"\ncapacity_blocks = 10'))
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not stop root")
def test_a_read_only_root_dir_is_refused_by_validation(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        for root, fragment in ((parent, "is not writable"), (parent / "fs", "cannot be")):
            path = config_file(tmp_path, f'root_dir = "{root}"\ncapacity_blocks = 10')
            refused(path, "root_dir", fragment)
    finally:
        parent.chmod(0o700)


def test_an_existing_root_of_another_block_size_or_format_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    build_fs_stack(root).shutdown()  # a real tier directory of BLOCK-byte blocks
    marker = root / "kv-offload-fs.json"
    lines = f'root_dir = "{root}"\ncapacity_blocks = 10'
    load_config(config_file(tmp_path, lines))  # the same block size: fine
    refused(config_file(tmp_path, lines, block=2 * BLOCK), "root_dir", f"holds blocks of {BLOCK}")
    fields = json.loads(marker.read_text())
    marker.write_text(json.dumps({**fields, "format_version": 99}))
    refused(config_file(tmp_path, lines), "root_dir", "format version 99")
    marker.write_text("not json")
    refused(config_file(tmp_path, lines), "root_dir", "damaged or foreign")
    marker.unlink()
    refused(config_file(tmp_path, lines), "root_dir", "not written by the kv-offload fs tier")


def test_kv_offload_validate_prints_the_located_error(tmp_path: Path) -> None:
    path = config_file(tmp_path, f'root_dir = "{tmp_path / "fs"}"\ncapacity_bytes = 100')
    proc = kvo("validate", path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{path}:{line_of(path, 'capacity_bytes')}" in proc.stderr
    assert "smaller than one block file (8192 bytes" in proc.stderr
