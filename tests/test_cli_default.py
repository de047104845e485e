"""The ``default`` config of ``kv-offload validate`` / ``replay``: a CPU tier in front of a
real fs tier in a temporary directory (or ``--root``), deleted at the end unless ``--keep``;
and the README's demo, which is that replay's real output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from test_cli import ROOT, SCRIPT, TRACE, _env, assert_one_line_error, kvo, kvo_many


def _tmpdir_env(tmp: Path) -> dict[str, str]:
    """Children make their temporary directories in ``tmp`` (``tempfile`` reads TMPDIR)."""
    tmp.mkdir(exist_ok=True)
    return {"TMPDIR": str(tmp)}


def test_default_replay_runs_an_fs_tier_in_a_temporary_directory_and_removes_it(
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "tmp"
    proc = kvo("replay", "default", TRACE, "--limit", "300", "--json", env=_tmpdir_env(tmp))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["config"] == "<default config>" and report["num_blocks"] == 5000
    assert set(report["hit_ratio_by_tier"]) == {"CPU", "fs"}
    assert report["cascaded_blocks"] > 0  # blocks reached the disk ...
    assert report["bytes_moved"]["to_tiers"] == report["cascaded_blocks"] * 4096
    assert report["corrupted_blocks"] == 0 and report["verified_blocks"] > 0
    assert list(tmp.iterdir()) == []  # ... and the directory is gone afterwards
    assert proc.stderr == ""


def test_keep_and_root_let_a_second_run_start_with_the_blocks(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    first = kvo("replay", "default", TRACE, "--limit", "200", "--root", root, "--keep")
    assert first.returncode == 0, first.stderr
    assert f"kept in {root}" in first.stderr and f"--root {root}" in first.stderr
    assert (root / "kv-offload-fs.json").is_file() and (root / "blocks").is_dir()
    # A new process, an empty CPU tier: the first request's blocks come from the disk.
    second = kvo("replay", "default", TRACE, "--limit", "200", "--root", root, "--json")
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    assert report["promotions"] > 0 and report["hit_ratio_by_tier"]["fs"] > 0
    assert report["failed_promotions"] == 0 and report["corrupted_blocks"] == 0
    assert report["bytes_moved"]["from_tiers"] == report["promotions"] * 4096
    # Without --keep the tier deletes what it wrote; the directory it found stays.
    assert list(root.iterdir()) == []


def test_keep_without_root_names_the_temporary_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    proc = kvo("replay", "default", TRACE, "--limit", "50", "--keep", env=_tmpdir_env(tmp))
    assert proc.returncode == 0, proc.stderr
    (kept,) = tmp.iterdir()
    assert kept.name.startswith("kv-offload-default-")
    assert f"kept in {kept} " in proc.stderr
    assert any((kept / "blocks").rglob("*")), "the blocks are on disk"


def test_a_failed_replay_leaves_no_temporary_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hash_ids": [1, 2]}\n{oops\n')
    for keep in ((), ("--keep",)):
        proc = kvo("replay", "default", bad, *keep, env=_tmpdir_env(tmp))
        assert_one_line_error(proc, "bad.jsonl:2")
        assert list(tmp.iterdir()) == []  # nothing was stored: nothing to keep


def test_validate_default_shows_the_fs_tier_and_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "not-yet"
    plain, rooted = kvo_many(["validate", "default"], ["validate", "default", "--root", root])
    assert plain.returncode == 0, plain.stderr
    assert "tier 1: 'fs'" in plain.stdout and "kv-offload-fs-tier" in plain.stdout
    assert "capacity_blocks=20000" in plain.stdout and "delete_on_shutdown=True" in plain.stdout
    assert "kv-offload-default-XXXXXXXX" in plain.stdout
    assert rooted.returncode == 0, rooted.stderr
    assert f"root_dir={str(root)!r}" in rooted.stdout
    assert not root.exists()


def test_root_and_keep_apply_to_the_default_config_only(tmp_path: Path) -> None:
    config = tmp_path / "stack.toml"
    config.write_text("num_blocks = 16\n")
    for proc, option in zip(
        kvo_many(
            ["replay", config, TRACE, "--root", tmp_path / "r"],
            ["validate", config, "--keep"],
        ),
        ("--root", "--keep"),
    ):
        assert_one_line_error(proc, option, "'default' config only", "root_dir")
    assert not (tmp_path / "r").exists()


def _site_without_fs_tier(tmp_path: Path) -> Path:
    """A site directory with every entry of this environment's but the fs tier's
    distribution: a real installation that lacks ``kv-offload-fs-tier``."""
    shadow = tmp_path / "site"
    shadow.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        if "kv_offload_fs_tier" not in entry.name:
            (shadow / entry.name).symlink_to(entry)
    return shadow


def test_default_without_the_fs_tier_is_one_clear_error(tmp_path: Path) -> None:
    shadow = _site_without_fs_tier(tmp_path)
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]); "
        "from kv_offload.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    tmp = tmp_path / "tmp"
    for command in (["validate", "default"], ["replay", "default", str(TRACE), "--limit", "5"]):
        proc = subprocess.run(
            [sys.executable, "-S", "-c", code, str(shadow), *command],
            capture_output=True,
            text=True,
            env={**_env(), **_tmpdir_env(tmp)},
            timeout=120,
        )
        assert_one_line_error(proc, "kv-offload-fs-tier is not installed", "pip install")
    assert list(tmp.iterdir()) == []  # refused before making a directory
    # The same environment still runs a config of one's own.
    config = tmp_path / "cpu.toml"
    config.write_text("num_blocks = 64\n")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, str(shadow), "replay", str(config), str(TRACE),
         "--limit", "5"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


# -- the README's demo -----------------------------------------------------------------------

NOXFILE = ROOT / "noxfile.py"
README = ROOT / "README.md"


def _demo_block() -> list[str]:
    """The README's demo output: the code block after "You should see"."""
    text = README.read_text()
    match = re.search(r"You should see[^\n]*\n(?:[^\n]*\n)*?```\n(.*?)```", text, re.S)
    assert match, "the README's Quick start shows the demo's output"
    return match.group(1).splitlines()


def _matches(expected: list[str], actual: list[str]) -> bool:
    """``...`` alone stands for any lines (none included); a line ending in ``...`` for a
    line that starts with what comes before it; any other line must be equal."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(_matches(rest, actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    line = actual[0]
    ok = line.startswith(head[:-3]) if head.endswith("...") else line == head
    return ok and _matches(rest, actual[1:])


def _demo_commands() -> list[list[str]]:
    """The ``kv-offload`` commands of noxfile.py's demo session, in order."""
    source = NOXFILE.read_text()
    body = source[source.index("def demo(") :]
    body = body[: body.find("\n@nox.session") if "\n@nox.session" in body else None]
    trace = re.search(r'^TRACE = "([^"]+)"', source, re.M)
    assert trace, "noxfile.py names the demo's trace"
    commands = []
    for call in re.findall(r"session\.run\(\s*(.*?)\)\n", body, re.S):
        words = re.findall(r'"([^"]*)"|\b(TRACE)\b', call)
        commands.append([trace.group(1) if name else text for text, name in words])
    assert commands and all(c[0] == "kv-offload" for c in commands)
    return commands


@pytest.mark.timeout(600)  # the whole demo: about 2 minutes on a loaded machine
def test_readme_demo_is_the_demo_sessions_real_output(tmp_path: Path) -> None:
    assert SCRIPT is not None
    outputs = []
    for command in _demo_commands():
        proc = subprocess.run(
            [SCRIPT, *command[1:]],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**_env(), **_tmpdir_env(tmp_path / "tmp")},
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    actual = "\n".join(out.rstrip("\n") for out in outputs).splitlines()
    expected = _demo_block()
    # Blank lines separate the commands' outputs in the README.
    expected = [line for line in expected if line.strip()]
    actual = [line for line in actual if line.strip()]
    assert _matches(expected, actual), "\n".join(actual)
