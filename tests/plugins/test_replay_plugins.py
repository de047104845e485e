"""Issue 37: the replay's plugin kinds, routers and load-wait policies, installed as a real
distribution, broken in every way their contracts allow. Each failure is one line naming the
plugin and what it broke (never ``internal error``); a router that hangs stops the fleet
within a bound, with its engines; an unknown name says how to install one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _dists import DistSpec
from test_cli import TRACE, assert_one_line_error, kvo

BAD_PLUGINS = """
import math
import threading

from kv_offload.fleet import Router
from kv_offload.load_wait import LoadWaitPolicy


class Hangs(Router):
    def route(self, keys, loads):
        threading.Event().wait()  # forever


class Raises(Router):
    def route(self, keys, loads):
        raise ValueError("no engine for you")


class Answers(Router):
    def route(self, keys, loads):
        return "0"


class NeedsArgument(Router):
    def __init__(self, region):
        self.region = region


class InitRaises(Router):
    def __init__(self):
        raise RuntimeError("router init broke")


class StringBudget(LoadWaitPolicy):
    def budget_s(self, prefix_blocks, block_tokens):
        return "0.1"


class NaNBudget(LoadWaitPolicy):
    def budget_s(self, prefix_blocks, block_tokens):
        return math.nan


class NegativeBudget(LoadWaitPolicy):
    def budget_s(self, prefix_blocks, block_tokens):
        return -1.0


class BudgetRaises(LoadWaitPolicy):
    def budget_s(self, prefix_blocks, block_tokens):
        raise KeyError("budget")


class DescribesBadly(LoadWaitPolicy):
    def budget_s(self, prefix_blocks, block_tokens):
        return 0.0

    def describe(self):
        return None


class WaitInitRaises(LoadWaitPolicy):
    def __init__(self):
        raise RuntimeError("load-wait init broke")


class NotAPolicy:
    pass
"""

ROUTERS = {
    "hangs": "Hangs",
    "raises": "Raises",
    "answers-a-string": "Answers",
    "needs-argument": "NeedsArgument",
    "init-raises": "InitRaises",
}
LOAD_WAITS = {
    "string-budget": "StringBudget",
    "nan-budget": "NaNBudget",
    "negative-budget": "NegativeBudget",
    "budget-raises": "BudgetRaises",
    "init-raises": "WaitInitRaises",
    "describes-badly": "DescribesBadly",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broken routers and load-wait policies, really pip-installed (``--target``); put the
    directory on PYTHONPATH to make them visible."""
    spec = DistSpec(
        name="kv-offload-bad-replay-plugins",
        version="0.0.1",
        files={"kvo_bad_replay.py": BAD_PLUGINS},
        entry_points={
            "kv_offload.routers": {n: f"kvo_bad_replay:{c}" for n, c in ROUTERS.items()},
            "kv_offload.load_wait": {n: f"kvo_bad_replay:{c}" for n, c in LOAD_WAITS.items()},
        },
    )
    return spec.install_target(tmp_path_factory.mktemp("bad-replay-plugins"))


# A CPU tier far smaller than the trace's blocks in front of an fs tier: requests meet blocks
# the disk is still promoting (PENDING), so the load-wait policy is asked for a budget.
TIERED = """\
num_blocks = 16
block_size_bytes = 1024
[[tiers]]
type = "fs"
root_dir = "{root}"
capacity_blocks = 4000
delete_on_shutdown = true
"""


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "tiered.toml"
    config.write_text(TIERED.format(root=tmp_path / "fs"))
    return config


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("raises", ["router 'raises'", "route()", "ValueError: no engine for you"]),
        ("answers-a-string", ["router 'answers-a-string'", "route() contract", "'0'"]),
        ("needs-argument", ["router 'needs-argument'", "failed to initialise", "region"]),
        ("init-raises", ["router 'init-raises'", "failed to initialise", "router init broke"]),
    ],
)
def test_a_broken_router_is_named_with_its_contract(
    site: Path, tmp_path: Path, name: str, fragments: list[str]
) -> None:
    proc = kvo(
        "replay", _config(tmp_path), TRACE, "--limit", "20", "--speed", "100",
        "--engines", "2", "--router", name, pythonpath=site,
    )  # fmt: skip
    assert "internal error" not in proc.stderr
    assert_one_line_error(proc, *fragments)


def test_a_router_that_hangs_stops_the_fleet_within_its_bound(site: Path, tmp_path: Path) -> None:
    from kv_offload.fleet.dispatch import ROUTE_TIMEOUT_S

    started = time.monotonic()
    proc = kvo(
        "replay", _config(tmp_path), TRACE, "--limit", "20", "--speed", "100",
        "--engines", "2", "--router", "hangs", pythonpath=site,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert_one_line_error(proc, "router 'hangs'", "did not answer", f"{ROUTE_TIMEOUT_S:g} s")
    assert "leaked" not in proc.stderr  # no semaphore left for the resource tracker
    assert seconds < ROUTE_TIMEOUT_S + 45, seconds
    # The engines ended with the run: their fs directories were removed at their shutdown,
    # and a new fleet on the same root_dir starts.
    again = kvo("replay", _config(tmp_path), TRACE, "--limit", "10", "--speed", "100",
                "--engines", "2", pythonpath=site)  # fmt: skip
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("string-budget", ["load-wait policy 'string-budget'", "budget_s() contract", "'0.1'"]),
        ("nan-budget", ["load-wait policy 'nan-budget'", "budget_s() contract", "nan"]),
        ("negative-budget", ["load-wait policy 'negative-budget'", "budget_s() contract", "-1"]),
        ("budget-raises", ["load-wait policy 'budget-raises'", "budget_s()", "KeyError"]),
        ("init-raises", ["load-wait policy 'init-raises'", "failed to initialise", "init broke"]),
        ("describes-badly", ["load-wait policy 'describes-badly'", "describe() contract"]),
    ],
)
def test_a_broken_load_wait_policy_is_named_with_its_contract(
    site: Path, tmp_path: Path, name: str, fragments: list[str]
) -> None:
    proc = kvo(
        "replay", _config(tmp_path), TRACE, "--limit", "200", "--speed", "100",
        "--load-wait", name, pythonpath=site,
    )  # fmt: skip
    assert "internal error" not in proc.stderr
    assert_one_line_error(proc, *fragments)


def test_the_plugins_command_checks_them(site: Path) -> None:
    proc = kvo("plugins", "--check", "--json", pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(proc.stdout)}
    assert rows[("router", "hangs")]["status"] == "ok"  # importing it does not hang
    assert rows[("load-wait-policy", "nan-budget")]["distribution"] == (
        "kv-offload-bad-replay-plugins"
    )


@pytest.mark.parametrize(
    ("args", "kind", "installed"),
    [
        (["--engines", "2", "--router", "nosuch"], "router", "'round-robin'"),
        (["--load-wait", "nosuch"], "load-wait policy", "'wait_complete'"),
    ],
)
def test_an_unknown_name_says_what_is_installed_and_how_to_add_one(
    args: list[str], kind: str, installed: str
) -> None:
    proc = kvo("replay", "default", TRACE, "--limit", "5", "--speed", "10", *args)
    line = assert_one_line_error(proc, f"unknown {kind} 'nosuch'", installed, "entry point")
    assert "module" not in line  # these kinds have no module_path: no hint at one


def test_a_broken_load_wait_policy_in_a_fleet_is_named_for_each_engine(
    site: Path, tmp_path: Path
) -> None:
    """Every engine fails on the policy's answer; the error names it, and the engines' queues
    are closed without a semaphore left to the resource tracker (no warning after the line)."""
    proc = kvo(
        "replay", _config(tmp_path), TRACE, "--limit", "200", "--speed", "100",
        "--engines", "2", "--load-wait", "nan-budget", pythonpath=site,
    )  # fmt: skip
    line = assert_one_line_error(proc, "every engine died", "engine 0: PluginError")
    assert line.count("load-wait policy 'nan-budget' broke the budget_s() contract") == 2
