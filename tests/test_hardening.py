"""Regression tests for defects a new user's trial found: each fails on the code before its fix.

The CLI cases run the installed ``kv-offload`` script in a subprocess, the API cases call the
library directly; every error must come from kv-offload's hierarchy and name what was wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dists import DistSpec
from kv_offload import CPUKVBuffer, ReqContext, make_offload_key
from kv_offload.errors import InvalidArgumentError, InvalidKeyError
from test_cli import assert_one_line_error, kvo, kvo_many

MARKER_CODE = """
import os, pathlib
pathlib.Path(os.environ["KVO_TEST_MARKER"]).write_text("imported")
"""


@pytest.fixture(scope="module")
def marker_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hook plugin and a policy whose import writes a marker file: proof of an import."""
    spec = DistSpec(
        name="kv-offload-marker",
        version="1.0",
        files={"kv_offload_marker.py": MARKER_CODE},
        entry_points={
            "kv_offload.hooks": {"marker": "kv_offload_marker"},
            "kv_offload.policies": {"marker-policy": "kv_offload_marker:Nothing"},
        },
    )
    return spec.install_target(tmp_path_factory.mktemp("marker"))


# -- 4: listing plugins reads metadata; --check imports, never a blocked plugin --------------


def test_listing_plugins_imports_nothing(marker_site: Path, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    proc = kvo("plugins", "--json", pythonpath=marker_site, env={"KVO_TEST_MARKER": str(marker)})
    assert proc.returncode == 0, proc.stderr
    infos = {(p["kind"], p["name"]): p for p in json.loads(proc.stdout)}
    assert infos[("hook", "marker")]["status"] == "installed"
    assert infos[("hook", "marker")]["distribution"] == "kv-offload-marker"
    assert not marker.exists(), "listing ran a plugin's import code"


# The listing reads the variable as the managers do: names split on commas and whitespace.
@pytest.mark.parametrize("blocked", ["marker", "other, marker", "other marker"])
def test_check_imports_but_never_a_blocked_hook_plugin(
    marker_site: Path, tmp_path: Path, blocked: str
) -> None:
    marker = tmp_path / "imported"
    env = {"KVO_TEST_MARKER": str(marker), "KV_OFFLOAD_BLOCK_PLUGINS": blocked}
    proc = kvo("plugins", "--check", "--json", pythonpath=marker_site, env=env)
    assert proc.returncode == 0, proc.stderr
    infos = {(p["kind"], p["name"]): p for p in json.loads(proc.stdout)}
    assert infos[("hook", "marker")]["status"].startswith("blocked")
    # The policy entry point of the same module is not blocked: checking it imports it...
    assert "has no attribute 'Nothing'" in infos[("policy", "marker-policy")]["error"]
    assert marker.exists()
    marker.unlink()
    # ...so block the policy's check too by listing without --check: nothing runs.
    kvo("plugins", pythonpath=marker_site, env=env)
    assert not marker.exists()


# -- 10: malformed trace lines name file and line, exit 2 ----------------------------------


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"hash_ids": [1, 18446744073709551616]}', "does not fit in 64 bits"),
        ('{"hash_ids": [-9223372036854775809]}', "does not fit in 64 bits"),
        ('{"hash_ids": [4, 5, 4]}', "hash 4 appears twice"),
        ("[1, 2, 3]", "the line is a JSON list, not an object"),
        ('"hash_ids"', "the line is a JSON str, not an object"),
    ],
)
def test_malformed_trace_lines_name_file_and_line(tmp_path: Path, line: str, fragment: str) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n' + line + "\n")
    assert_one_line_error(kvo("replay", "default", trace), f"{trace}:2:", fragment)


# -- 12: the first error of a replay is the one reported ------------------------------------

FAILING_HOOKS = """
from kv_offload.plugins import hookimpl

failed = []

@hookimpl
def kv_offload_blocks_stored(keys):
    if not failed:
        failed.append(True)
        raise RuntimeError("first failure, in blocks_stored")

@hookimpl
def kv_offload_shutdown():
    raise RuntimeError("second failure, in shutdown")
"""


def test_replay_reports_the_first_hook_error(tmp_path: Path) -> None:
    site = DistSpec(
        name="kv-offload-failing-hooks",
        version="1.0",
        files={"kv_offload_failing_hooks.py": FAILING_HOOKS},
        entry_points={"kv_offload.hooks": {"failing": "kv_offload_failing_hooks"}},
    ).install_target(tmp_path)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n')
    proc = kvo("replay", "default", trace, pythonpath=site)
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("kv-offload replay:")]
    assert len(error) == 1 and "first failure" in error[0], proc.stderr
    assert "second failure" in proc.stderr, "the later error is still listed"


# -- 15: global options work before and after the command ----------------------------------


def test_global_options_after_the_command() -> None:
    before, after, debug = kvo_many(
        ["--log-level", "INFO", "validate", "default"],
        ["validate", "default", "--log-level", "INFO"],
        ["validate", "default", "--debug"],
    )
    for proc in (before, after, debug):
        assert proc.returncode == 0, proc.stderr
        assert "valid" in proc.stdout


# -- 16: raw API edges become clear errors --------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("abc",), "encode a str first"),
        ((None,), "NoneType"),
        ((2**64,), "does not fit in 64 bits"),
        ((-(2**63) - 1,), "does not fit in 64 bits"),
        ((1.5,), "float"),
        ((True,), "bool"),
        ((1, -1), "group_idx -1 is out of range"),
        ((1, 2**32), "out of range"),
        ((1, "0"), "group_idx must be an int"),
    ],
)
def test_make_offload_key_rejects_bad_values(args: tuple[Any, ...], fragment: str) -> None:
    with pytest.raises(InvalidKeyError, match=fragment):
        make_offload_key(*args)


def test_make_offload_key_keeps_the_64_bit_range() -> None:
    # A signed hash is its two's-complement bit pattern: the same 64-bit value, the same key.
    assert make_offload_key(2**64 - 1) == make_offload_key(-1)
    assert make_offload_key(2**63) == make_offload_key(-(2**63))
    assert make_offload_key(b"\x01" * 16, 3)[-4:] == (3).to_bytes(4, "big")


@pytest.mark.parametrize("req_id", [123, None, b"req", 1.0])
def test_req_context_needs_a_str_id(req_id: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="req_id must be a str"):
        ReqContext(req_id=req_id)


@pytest.mark.parametrize("slots", [["a"], [1.7], [None], np.array([0.0])])
def test_buffer_slot_ids_must_be_integers(slots: Any) -> None:
    buffer = CPUKVBuffer(4, 16)
    buffer.write_blocks([1], np.full(16, 9, np.uint8))
    with pytest.raises(InvalidArgumentError, match="slot ids must be integers"):
        buffer.read_blocks(slots)
    with pytest.raises(InvalidArgumentError, match="slot ids must be integers"):
        buffer.write_blocks(slots, np.zeros(16, np.uint8))
    assert (buffer.read_blocks([1]) == 9).all(), "a refused write changes nothing"
    assert buffer.read_blocks(np.array([], np.int64)).shape == (0, 16)


# -- issue 37: a replay's rejected stores are explained in the text report ---------------------


def test_the_text_report_says_why_cpu_stores_were_refused(tmp_path: Path) -> None:
    """64 CPU blocks: untimed, the fs tier's cascades pin the blocks eviction needs, and some
    requests ask for more than 64 blocks; the JSON has the split, the text says both."""
    cpu = tmp_path / "cpu.toml"
    cpu.write_text("num_blocks = 64\nblock_size_bytes = 4096\n")
    fs = tmp_path / "fs.toml"
    fs.write_text(
        f'num_blocks = 64\nblock_size_bytes = 4096\n[[tiers]]\ntype = "fs"\n'
        f'root_dir = "{tmp_path / "root"}"\ncapacity_blocks = 4096\n'
    )
    trace = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
    alone, tiered, as_json = kvo_many(
        ["replay", cpu, trace, "--limit", "100"],
        ["replay", fs, trace, "--limit", "100"],
        ["replay", cpu, trace, "--limit", "100", "--json"],
    )
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    too_large = report["rejected_stores_too_large"]
    assert report["rejected_stores"] == too_large > 0  # no tier: only the oversized ones
    assert alone.returncode == 0, alone.stderr
    assert (
        f"rejected stores  {too_large} CPU stores refused: {too_large} larger than the CPU "
        "tier's 64 blocks"
    ) in alone.stdout
    assert tiered.returncode == 0, tiered.stderr
    (line,) = [x for x in tiered.stdout.splitlines() if x.startswith("rejected stores")]
    total = int(line.split()[2])
    pinned = int(line.split(": ")[1].split()[0])
    assert 0 < pinned < total
    assert "because tier jobs in flight (cascades, promotions) pinned the CPU tier's blocks" in line
