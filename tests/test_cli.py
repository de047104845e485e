"""The ``kv-offload`` command, run for real: the installed console script in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest
from _dists import DistSpec, _clean_env

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "conversation_trace.jsonl"


def _script() -> str | None:
    """The console script of the interpreter running the tests, else the one on PATH."""
    name = "kv-offload.exe" if os.name == "nt" else "kv-offload"
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else shutil.which("kv-offload")


SCRIPT = _script()
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="no kv-offload console script installed")


def _env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in _clean_env().items() if not k.startswith("KV_OFFLOAD_")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def kvo(
    *args: str | Path, pythonpath: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``kv-offload ARGS`` and wait for it (``env``: extra environment variables)."""
    (proc,) = kvo_many(list(args), pythonpath=pythonpath, env=env)
    return proc


def kvo_many(
    *commands: list[str | Path], pythonpath: Path | None = None, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Run several ``kv-offload`` commands at once (each pays the interpreter's start-up)."""
    assert SCRIPT is not None
    children = [
        (
            argv,
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**_env(pythonpath), **(env or {})},
            ),
        )
        for argv in ([SCRIPT, *map(str, command)] for command in commands)
    ]
    results = []
    for argv, child in children:
        with child:
            stdout, stderr = child.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(argv, child.returncode, stdout, stderr))
    return results


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit status 2, nothing on stdout, exactly one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


# -- plugins ---------------------------------------------------------------------------------


def test_plugins_json_lists_builtins_with_distribution_and_version() -> None:
    proc = kvo("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    infos = {(p["kind"], p["name"]): p for p in json.loads(proc.stdout)}
    expected = {
        ("policy", "lru"): "kv-offload-lru",
        ("policy", "arc"): "kv-offload-arc",
        ("policy", "prefix-lru"): "kv-offload-lru",
        ("policy", "vllm-arc"): "kv-offload-vllm-arc",
        ("tier", "example"): "kv-offload-example-tier",
    }
    for key, dist in expected.items():
        info = infos[key]
        assert info["distribution"] == dist
        assert info["version"]
        assert info["source"] == "entry point"
        assert info["error"] is None


BUILT_IN_KINDS = {
    "router": {"round-robin", "hash", "least-loaded"},
    "load-wait-policy": {"best_effort", "timeout", "wait_complete"},
    "backpressure-detector": {"ema", "utilization"},
    "drop-policy": {"throttled", "drop_all"},
    "admission": {"store-threshold"},
}


def test_plugins_lists_every_kind_the_core_resolves() -> None:
    """Issue 37 #12: routers, load-wait policies, backpressure detectors and drop policies are
    listed (and imported by --check) like policies and tiers."""
    listing, checked = kvo_many(["plugins", "--json"], ["plugins", "--check", "--json"])
    for proc, status in ((listing, "installed"), (checked, "ok")):
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        for kind, names in BUILT_IN_KINDS.items():
            found = {r["name"]: r for r in rows if r["kind"] == kind}
            assert names <= set(found), (kind, sorted(found))
            for name in names:
                assert found[name]["distribution"] == "kv-offload"
                assert found[name]["status"] == status, found[name]


def test_plugins_lists_every_entry_point_group_the_project_declares() -> None:
    """Every group a pyproject.toml of the repository declares entry points in is one that
    ``kv-offload plugins`` lists: a new plugin kind cannot be forgotten by the listing."""
    from kv_offload.cli.plugins_cmd import LISTED_GROUPS

    declared = set()
    for pyproject in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")]:
        declared |= set(tomllib.loads(pyproject.read_text())["project"].get("entry-points", {}))
    assert declared and declared <= set(LISTED_GROUPS), declared - set(LISTED_GROUPS)


@pytest.mark.parametrize(("flags", "status"), [((), "installed"), (("--check",), "ok")])
def test_plugins_table(flags: tuple[str, ...], status: str) -> None:
    proc = kvo("plugins", *flags)
    assert proc.returncode == 0, proc.stderr
    header, rule, *rows = proc.stdout.splitlines()
    assert header.split() == ["name", "kind", "distribution", "version", "found", "via", "status"]
    assert set(rule) <= {"-", " "}
    lru = next(row.split() for row in rows if row.startswith("lru "))
    assert lru[:3] == ["lru", "policy", "kv-offload-lru"]
    assert lru[-1] == status


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a policy and a hook plugin that fail to import, really pip-installed
    (``pip install --target``); put it on PYTHONPATH to make them visible."""
    tmp = tmp_path_factory.mktemp("broken")
    spec = DistSpec(
        name="kv-offload-broken",
        version="6.6.6",
        files={
            "kv_offload_broken.py": "raise ImportError('this plugin is broken on purpose')\n",
        },
        entry_points={
            "kv_offload.policies": {"broken": "kv_offload_broken:BrokenPolicy"},
            "kv_offload.hooks": {"broken-hook": "kv_offload_broken"},
            "kv_offload.routers": {"broken-router": "kv_offload_broken:BrokenRouter"},
            "kv_offload.load_wait": {"broken-wait": "kv_offload_broken:BrokenWait"},
        },
    )
    target = spec.install_target(tmp)
    assert (target / "kv_offload_broken-6.6.6.dist-info" / "entry_points.txt").is_file()
    return target


def test_broken_plugins_are_listed_with_their_error(broken_site: Path) -> None:
    proc, table = kvo_many(
        ["plugins", "--check", "--json"], ["plugins", "--check"], pythonpath=broken_site
    )
    assert proc.returncode == 0, proc.stderr
    infos = {(p["kind"], p["name"]): p for p in json.loads(proc.stdout)}
    for key in (
        ("policy", "broken"),
        ("hook", "broken-hook"),
        ("router", "broken-router"),
        ("load-wait-policy", "broken-wait"),
    ):
        info = infos[key]
        assert info["distribution"] == "kv-offload-broken"
        assert info["version"] == "6.6.6"
        assert "broken on purpose" in info["error"]
    assert infos[("policy", "lru")]["error"] is None  # the others still load

    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("broken "))
    assert "BROKEN" in row and "broken on purpose" in row


def test_selecting_a_broken_policy_is_one_clear_error(broken_site: Path, tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text('num_blocks = 10\npolicy = "broken"\n\n[hooks]\nblock = ["broken-hook"]\n')
    proc = kvo("validate", config, pythonpath=broken_site)
    assert_one_line_error(proc, f"{config}:2", "policy", "'broken'", "kv-offload-broken 6.6.6")


def test_a_broken_autoloaded_hook_is_skipped_by_validate_and_replay(
    broken_site: Path, tmp_path: Path
) -> None:
    """Issue 10 #5: validate and the managers agree; only a plugin enabled by name fails."""
    config = tmp_path / "stack.toml"
    config.write_text("num_blocks = 64\n")
    check, run = kvo_many(
        ["validate", config],
        ["replay", config, TRACE, "--limit", "20"],
        pythonpath=broken_site,
    )
    assert check.returncode == 0, check.stderr
    assert run.returncode == 0, run.stderr
    assert "hook plugin 'broken-hook' from distribution kv-offload-broken 6.6.6" in run.stderr
    assert "(skipped)" in run.stderr
    enabled = tmp_path / "enabled.toml"
    enabled.write_text('num_blocks = 64\n\n[hooks]\nenable = ["broken-hook"]\n')
    for command in (["validate", enabled], ["replay", enabled, TRACE, "--limit", "20"]):
        proc = kvo(*command, pythonpath=broken_site)
        assert_one_line_error(proc, "'broken-hook'", "kv-offload-broken 6.6.6")


# -- validate --------------------------------------------------------------------------------


def test_validate_default_prints_the_resolved_stack() -> None:
    proc = kvo("validate", "default")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "valid" in out.splitlines()[0]
    assert "5000 blocks" in out and "'lru'" in out and "kv-offload-lru" in out
    assert "tier 1: 'fs'" in out and "kv-offload-fs-tier" in out  # tests/test_cli_default.py
    assert "capacity_blocks=20000" in out


def test_validate_json(tmp_path: Path) -> None:
    config = tmp_path / "stack.toml"
    config.write_text(
        textwrap.dedent(
            """
            cpu_bytes = 8192
            block_size_bytes = 1024
            policy = "arc"

            [[tiers]]
            type = "example"
            capacity_blocks = 32
            """
        )
    )
    proc = kvo("validate", config, "--json")
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert described["source"] == str(config)
    assert described["cpu"]["num_blocks"] == 8
    assert described["cpu"]["policy"] == "arc"
    assert described["tiers"] == [{"type": "example", "capacity_blocks": 32}]
    plugins = {(p["kind"], p["name"]): p for p in described["plugins"]}
    assert plugins[("policy", "arc")]["distribution"] == "kv-offload-arc"
    assert plugins[("tier", "example")]["distribution"] == "kv-offload-example-tier"


def test_bad_config_is_one_line_unless_debug(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('num_blocks = 100\n\n[hooks]\nenabel = ["x"]\n')
    plain, before, after = kvo_many(
        ["validate", config], ["--debug", "validate", config], ["validate", config, "--debug"]
    )
    assert_one_line_error(plain, f"{config}:4", "hooks.enabel", "did you mean 'enable'")
    for debug in (before, after):  # --debug works before and after the command
        assert debug.returncode == 2
        assert "Traceback" in debug.stderr and "ConfigError" in debug.stderr
        assert debug.stderr.strip().splitlines()[-1].startswith("kv-offload validate: error:")


# -- replay ----------------------------------------------------------------------------------


def test_replay_default_json_with_progress_on_stderr() -> None:
    proc = kvo("replay", "default", TRACE, "--limit", "300", "--json", "--progress")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # the progress bar did not leak into stdout
    assert "replay" in proc.stderr and "blk" in proc.stderr  # ... it went to stderr
    assert report["requests"] == 300
    assert report["corrupted_blocks"] == 0
    assert report["verified_blocks"] > 0
    by_tier = report["hit_ratio_by_tier"]
    assert set(by_tier) == {"CPU", "fs"}  # the default's fs tier: tests/test_cli_default.py
    assert sum(by_tier.values()) == pytest.approx(report["hit_ratio"])
    assert report["cascaded_blocks"] > 0  # how many depends on the disk's speed
    assert report["evictions"] > 0
    assert report["bytes_moved"]["to_tiers"] > 0
    assert report["bytes_moved"]["from_tiers"] == report["promotions"] * 4096
    assert report["blocks_per_second"] > 0


def test_replay_text_report() -> None:
    proc = kvo("replay", "default", TRACE, "--limit", "200")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for fragment in (
        "policy 'lru', 5000 CPU blocks",
        "200 requests",
        "hit ratio",
        "from CPU",
        "from fs",
        "evictions",
        "promotions",
        "bytes moved",
        "0 corrupted",
        "blocks/s",
    ):
        assert fragment in out, fragment
    assert proc.stderr == ""  # no terminal, no --progress: no progress bar


def _bare_lru_hit_ratio(trace: Path, capacity: int) -> float:
    """The reference: the same request flow on one OrderedDict, straight from the JSONL."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits_total = blocks = 0
    with trace.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            ids = record["hash_ids"][: record["input_length"] // 512]  # full blocks only
            hits = 0
            for block in ids:
                if block not in cache:
                    break
                hits += 1
            for block in reversed(ids[:hits]):  # the first block of a prefix most recent
                cache.move_to_end(block)
            for block in ids[hits:]:
                if block not in cache:
                    if len(cache) >= capacity:
                        cache.popitem(last=False)
                    cache[block] = None
            hits_total += hits
            blocks += len(ids)
    return hits_total / blocks


def test_replay_lru_matches_a_bare_dict_lru(tmp_path: Path) -> None:
    config = tmp_path / "cpu-only.toml"
    config.write_text('num_blocks = 5000\npolicy = "lru"\n')
    assert SCRIPT is not None
    # Replay in the child while the reference runs here.
    with subprocess.Popen(
        [SCRIPT, "replay", str(config), str(TRACE), "--json", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    ) as child:
        expected = _bare_lru_hit_ratio(TRACE, 5000)
        stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr
    report = json.loads(stdout)
    assert report["blocks"] == 276_491  # 288,500 minus the partial last blocks
    assert report["partial_blocks_left_out"] == 288_500 - 276_491
    assert report["hit_ratio"] == pytest.approx(expected, abs=0.005)
    assert report["hit_ratio_by_tier"] == {"CPU": report["hit_ratio"]}


# -- compare ---------------------------------------------------------------------------------


def _has_matplotlib() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import matplotlib"], capture_output=True, env=_env()
    )
    return probe.returncode == 0


COMPARE = [
    "compare", TRACE, "--policy", "lru", "--policy", "arc",
    "--capacity", "500", "--capacity", "2000", "--limit", "400",
]  # fmt: skip
COMBINATIONS = [("lru", 500), ("arc", 500), ("lru", 2000), ("arc", 2000)]


def test_compare_table_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "hit-ratio.png"
    with_plot = _has_matplotlib()
    table, as_json = kvo_many(
        [*COMPARE, *(["--plot", plot] if with_plot else [])],
        [*COMPARE, "--json", "--progress"],
    )
    assert table.returncode == 0, table.stderr
    header, _, *rows = table.stdout.strip().splitlines()
    assert header.split()[:3] == ["policy", "CPU", "blocks"]
    cells = [row.split() for row in rows if not row.startswith(("plot written", "trace "))]
    assert [(c[0], int(c[1])) for c in cells] == COMBINATIONS
    ratios = {(c[0], int(c[1])): float(c[2]) for c in cells}
    for policy in ("lru", "arc"):
        assert ratios[(policy, 2000)] >= ratios[(policy, 500)] > 0

    assert as_json.returncode == 0, as_json.stderr
    reports = json.loads(as_json.stdout)  # progress bars went to stderr
    assert "blk" in as_json.stderr
    assert [(r["policy"], r["num_blocks"]) for r in reports] == COMBINATIONS
    assert all(r["requests"] == 400 for r in reports)
    assert [round(r["hit_ratio"], 4) for r in reports] == [ratios[c] for c in COMBINATIONS]

    if not with_plot:
        pytest.skip("matplotlib is not installed: the --plot part is skipped")
    assert f"plot written to {plot}" in table.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 1000


def test_compare_bounds_adds_belady_infinite_and_gap_shares(tmp_path: Path) -> None:
    args = ["compare", TRACE, "--policy", "arc", "--capacity", "300", "--capacity", "1500"]
    args += ["--limit", "600", "--bounds"]
    table, as_json = kvo_many(args, [*args, "--json"])
    assert table.returncode == 0, table.stderr
    header, _, *rows = table.stdout.strip().splitlines()
    assert header.endswith("LRU-to-Belady gap closed")
    cells = [row.split() for row in rows[:8]]
    expected = ["lru", "arc", "belady", "infinite"] * 2  # lru added as the gap's baseline
    assert [c[0] for c in cells] == expected
    assert [int(c[1]) for c in cells] == [300] * 4 + [1500] * 4
    assert cells[0][-1] == "0.0%" and cells[1][-1].endswith("%")
    assert "belady: offline eviction" in table.stdout

    assert as_json.returncode == 0, as_json.stderr
    reports = json.loads(as_json.stdout)
    for capacity in (300, 1500):
        group = {r["policy"]: r for r in reports if r["num_blocks"] == capacity}
        lru, arc = group["lru"]["hit_ratio"], group["arc"]["hit_ratio"]
        opt, inf = group["belady"]["hit_ratio"], group["infinite"]["hit_ratio"]
        assert max(lru, arc) <= opt <= inf
        assert group["belady"]["bound"] and group["belady"]["blocks_per_second"] is None
        assert group["arc"]["gap_share"] == pytest.approx((arc - lru) / (opt - lru))
    if _has_matplotlib():
        plot = tmp_path / "bounds.png"
        proc = kvo(*args, "--plot", plot)
        assert proc.returncode == 0, proc.stderr
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_leaves_out_partial_last_blocks(tmp_path: Path) -> None:
    """1,100 tokens are two full 512-token blocks and a partial one: the partial block is
    never stored, so its repeat cannot hit; --keep-partial-blocks restores the old replay."""
    trace = tmp_path / "partial.jsonl"
    lines = [
        {"input_length": 1100, "hash_ids": [1, 2, 3]},
        {"input_length": 1100, "hash_ids": [1, 2, 3]},
        {"input_length": 1024, "hash_ids": [1, 2]},
        {"hash_ids": [7, 8]},  # no input_length: every block kept
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = tmp_path / "cpu.toml"
    config.write_text('num_blocks = 100\npolicy = "lru"\n')
    faithful, old, small = kvo_many(
        ["replay", config, trace, "--json"],
        ["replay", config, trace, "--json", "--keep-partial-blocks"],
        ["replay", config, trace, "--json", "--block-tokens", "256"],
    )
    for proc in (faithful, old, small):
        assert proc.returncode == 0, proc.stderr
    report = json.loads(faithful.stdout)
    assert (report["blocks"], report["partial_blocks_left_out"]) == (8, 2)
    assert report["hit_ratio"] == pytest.approx(4 / 8)
    assert report["block_tokens"] == 512
    report = json.loads(old.stdout)
    assert (report["blocks"], report["partial_blocks_left_out"]) == (10, 0)
    assert report["hit_ratio"] == pytest.approx(5 / 10)
    assert report["block_tokens"] is None
    report = json.loads(small.stdout)  # 1,100 // 256 = 4 >= 3 blocks: nothing left out
    assert (report["blocks"], report["partial_blocks_left_out"]) == (10, 0)
    text = kvo("replay", config, trace)
    assert "full 512-token blocks only: 2 partial last blocks" in text.stdout


def test_bad_input_length_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"input_length": 10, "hash_ids": [1]}\n{"input_length": "x", "hash_ids": [1]}\n'
    )
    proc = kvo("replay", "default", trace)
    assert_one_line_error(proc, f"{trace}:2", "input_length")


# -- errors ----------------------------------------------------------------------------------


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text('{"hash_ids": [1, 2]}\n\n{"hash_ids": [1, 2, 3]}\n{"hash_ids": [1,\n')
    wrong_type = tmp_path / "wrong-type.jsonl"
    wrong_type.write_text('{"hash_ids": [1, 2]}\n{"hash_ids": "12"}\n')
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"hash_ids": [1]}\n\xff\xfe\n')
    first, second, third, debug = kvo_many(
        ["replay", "default", truncated],
        ["compare", wrong_type, "--no-progress"],
        ["replay", "default", binary],
        ["--debug", "replay", "default", binary],
    )
    assert_one_line_error(first, f"{truncated}:4", "malformed trace line")
    assert_one_line_error(second, f"{wrong_type}:2", "hash_ids")
    assert_one_line_error(third, f"{binary}:2", "malformed trace line")
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_missing_files_and_bad_arguments(tmp_path: Path) -> None:
    missing_trace = tmp_path / "nope.jsonl"
    missing_config = tmp_path / "nope.toml"
    trace, config, policy, plot, limit = kvo_many(
        ["replay", "default", missing_trace],
        ["replay", missing_config, TRACE],
        ["compare", TRACE, "--policy", "lur", "--capacity", "100"],
        ["compare", TRACE, "--limit", "10", "--plot", tmp_path / "no" / "dir" / "x.png"],
        ["replay", "default", TRACE, "--limit", "0"],
    )
    assert_one_line_error(trace, "kv-offload replay: error:", str(missing_trace), "does not exist")
    assert_one_line_error(config, "cannot read config file", str(missing_config))
    assert_one_line_error(policy, "unknown policy 'lur'", "did you mean 'lru'")
    assert_one_line_error(plot, "cannot write plot")
    assert limit.returncode == 2 and "--limit: must be > 0" in limit.stderr


def test_router_help_says_how_many_blocks_hash_uses() -> None:
    """Issue 37: the help said the first block; the hash router's default is two."""
    import inspect

    from kv_offload.fleet.routers import PrefixHash

    blocks = inspect.signature(PrefixHash).parameters["prefix_blocks"].default
    assert blocks == 2
    proc = kvo("replay", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "hash (of the first two blocks" in " ".join(proc.stdout.split())


def test_a_warning_is_one_clean_line_printed_once(tmp_path: Path) -> None:
    """Issue 37: the fs tier's disk-space warning came as a raw UserWarning with the source
    line that issued it, once per check of the stack (three times per replay)."""
    config = tmp_path / "big.toml"
    config.write_text(
        f'num_blocks = 64\nblock_size_bytes = 4096\n[[tiers]]\ntype = "fs"\nroot_dir = '
        f'"{tmp_path / "root"}"\ncapacity_blocks = 1000000000\n'  # 8 TB of block files
    )
    replay, validate = kvo_many(
        ["replay", config, TRACE, "--limit", "3"], ["validate", config, "--json"]
    )
    for proc, command in ((replay, "replay"), (validate, "validate")):
        assert proc.returncode == 0, proc.stderr
        # (The fs tier also logs, when built, that it bounds its capacity by the disk.)
        lines = [x for x in proc.stderr.splitlines() if not x.startswith("WARNING kv_offload")]
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(
            f"kv-offload {command}: warning: tier 'fs': the capacity needs 8,192,000,000,000 "
            "bytes on disk"
        )
        assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr
