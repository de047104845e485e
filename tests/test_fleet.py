"""Issue 25: fleet replays (``--engines N --router NAME``): routers, engines as real
processes, a private-only stack said to share nothing, an engine that dies mid-run reported
by number and cause while the others' results count, and bad options refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kv_offload.config import parse_config
from kv_offload.errors import ConfigError, PluginNotFoundError
from kv_offload.fleet import LeastLoaded, PrefixHash, RoundRobin, plan_fleet, router_registry
from kv_offload.keys import make_offload_key
from test_cli import SCRIPT, TRACE, _env, kvo, kvo_many

KEYS = [make_offload_key(i) for i in range(4)]


def test_round_robin_takes_live_engines_in_turn() -> None:
    router = RoundRobin()
    assert [router.route(KEYS, [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert router.route(KEYS, [0, 0]) == 1  # one engine died: the turn goes on over two


def test_hash_routes_a_shared_prefix_to_one_engine_and_spreads_sessions() -> None:
    router = PrefixHash()
    session = [make_offload_key(0), make_offload_key(7), make_offload_key(8)]
    first = router.route(session, [0] * 4)
    assert router.route([*session, make_offload_key(9)], [5, 5, 5, 5]) == first
    # Every request of the bundled trace starts with block 0: two blocks tell sessions apart.
    engines = {router.route([make_offload_key(0), make_offload_key(s)], [0] * 4) for s in range(64)}
    assert engines == {0, 1, 2, 3}
    assert PrefixHash(prefix_blocks=1).route(session, [0] * 4) == PrefixHash(prefix_blocks=1).route(
        [make_offload_key(0)], [0] * 4
    )
    with pytest.raises(ConfigError, match="prefix_blocks"):
        PrefixHash(prefix_blocks=0)


def test_least_loaded_takes_the_engine_with_fewest_unfinished_requests() -> None:
    assert LeastLoaded().route(KEYS, [3, 1, 2]) == 1
    assert LeastLoaded().route(KEYS, [2, 2]) == 0


def test_routers_are_entry_points_of_the_core() -> None:
    names = {info.name: info for info in router_registry.available()}
    assert {"round-robin", "hash", "least-loaded"} <= set(names)
    assert names["hash"].distribution == "kv-offload"
    with pytest.raises(PluginNotFoundError, match="round-robin"):
        router_registry.resolve("random")


def test_plan_gives_private_tiers_a_directory_per_engine(tmp_path: Path) -> None:
    stack = parse_config(
        {
            "num_blocks": 16,
            "block_size_bytes": 256,
            "tiers": [{"type": "fs", "root_dir": str(tmp_path), "capacity_blocks": 64}],
        }
    )
    plan = plan_fleet(stack, 3)
    roots = [s.tiers[0].arguments["root_dir"] for s in plan.stacks]
    assert roots == [str(tmp_path / f"engine-{i}") for i in range(3)]
    assert plan.shared == [] and plan.private == ["fs"]
    assert plan.note() is not None and "nothing is shared" in plan.note()  # type: ignore[operator]


PRIVATE = """\
num_blocks = 300
block_size_bytes = 1024
[[tiers]]
type = "example"
capacity_blocks = 2000
"""


def test_fleet_of_isolated_engines_reports_each_engine(tmp_path: Path) -> None:
    config = tmp_path / "private.toml"
    config.write_text(PRIVATE)
    run = ["replay", config, TRACE, "--limit", "400", "--speed", "200", "--engines", "3"]
    as_json, text = kvo_many([*run, "--json", "--router", "least-loaded"], run)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["fleet"]["engines"] == 3 and report["fleet"]["router"] == "least-loaded"
    assert "nothing is shared" in report["fleet"]["note"]
    assert "nothing is shared" in as_json.stderr  # said outside the JSON too
    assert report["requests"] == report["requests_sent"] == 400
    assert [e["status"] for e in report["engines"]] == ["ok"] * 3
    assert all(e["requests"] > 50 for e in report["engines"])  # the load was spread
    assert report["corrupted_blocks"] == 0 and report["verified_blocks"] > 0
    total = sum(e["blocks"] * e["hit_ratio"] for e in report["engines"])
    assert report["hit_ratio"] == pytest.approx(total / report["blocks"])
    assert report["shared_tier_share"] == 0.0
    assert text.returncode == 0, text.stderr
    assert "fleet            3 engines, router 'round-robin'" in text.stdout
    assert "note: nothing is shared" in text.stdout


# A tier that kills its own process (SIGKILL) at its 20th store, in the first engine to
# claim the marker file: an engine dying mid-run, as an OOM kill would.
CRASHER = """
import os, signal
from kv_offload_example_tier import ExampleSecondaryTierManager


class Crasher(ExampleSecondaryTierManager):
    def __init__(self, config, view, tier_type, *, marker, **kw):
        super().__init__(config, view, tier_type, **kw)
        self.stores = 0
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            self.doomed = True
        except FileExistsError:
            self.doomed = False

    def submit_store(self, job):
        self.stores += 1
        if self.doomed and self.stores == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        super().submit_store(job)
"""


def test_an_engine_that_dies_is_named_and_the_others_count(tmp_path: Path) -> None:
    (tmp_path / "crasher_tier.py").write_text(CRASHER)
    config = tmp_path / "crash.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            num_blocks = 300
            block_size_bytes = 1024
            allow_module_path = true
            [[tiers]]
            type = "Crasher"
            module_path = "crasher_tier"
            marker = "{tmp_path / "marker"}"
            """
        )
    )
    proc = kvo(
        "replay", config, TRACE, "--limit", "300", "--speed", "200", "--engines", "2",
        "--json", pythonpath=tmp_path, env={"KV_OFFLOAD_ALLOW_MODULE_PATH": "1"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    failed = [e for e in report["engines"] if e["status"] == "failed"]
    ok = [e for e in report["engines"] if e["status"] == "ok"]
    assert len(failed) == 1 and len(ok) == 1, report["engines"]
    assert "killed by signal SIGKILL" in failed[0]["reason"]
    assert failed[0]["lost_requests"] >= 1
    assert report["failed_engines"] == 1
    # Requests routed after the death went to the live engine: they count.
    assert report["requests"] == ok[0]["requests"] > 150


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engines", "0", "--speed", "10"], "--engines: must be > 0"),
        (["--engines", "2"], "a fleet replay is timed"),
        (["--router", "hash"], "--router applies to a fleet"),
        (["--engines", "2", "--speed", "10", "--router", "random"], "random"),
        (["--engines", "2", "--speed", "10", "--metrics-port", "9999"], "--metrics-port"),
    ],
)
def test_bad_fleet_options_are_refused(args: list[str], message: str) -> None:
    proc = kvo("replay", "default", TRACE, "--limit", "5", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr


# -- an engine never outlives its dispatcher (issue 37 #4) -----------------------------------


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's reaper is missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_engines_exit_when_their_dispatcher_is_killed(tmp_path: Path, how: signal.Signals) -> None:
    """Issue 37 #4 and #5: ``kill -9`` of the dispatcher, its engines (and multiprocessing's
    resource tracker) end within seconds, releasing the fs tier's locks, so the next fleet on
    the root_dir starts. ``SIGTERM``: the dispatcher stops its engines itself, says so, and
    leaves no semaphore behind for the resource tracker to clean up."""
    config = tmp_path / "fl.toml"
    root = tmp_path / "fs"
    config.write_text(
        f'num_blocks = 64\nblock_size_bytes = 1024\n[[tiers]]\ntype = "fs"\n'
        f'root_dir = "{root}"\ncapacity_blocks = 4000\n'
    )
    assert SCRIPT is not None
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        dispatcher = subprocess.Popen(
            [SCRIPT, "replay", str(config), str(TRACE), "--engines", "2", "--speed", "5"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=_env(),
        )
    try:
        deadline = time.monotonic() + 60
        while not all((root / f"engine-{i}" / "lock").exists() for i in range(2)):
            assert dispatcher.poll() is None, "the fleet ended before it was killed"
            assert time.monotonic() < deadline, "the engines did not start within 60 s"
            time.sleep(0.1)
        time.sleep(1.0)  # the engines replay: mid-run
        children = _children(dispatcher.pid)
        assert len(children) >= 2, children  # two engines (and the resource tracker)
        dispatcher.send_signal(how)
        code = dispatcher.wait(timeout=30)
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in children if _alive(pid)]
    finally:
        if dispatcher.poll() is None:
            dispatcher.kill()
            dispatcher.wait()
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the killed fleet still running 5 s later: {left}"
    said = stderr.read_text()
    if how == signal.SIGTERM:
        assert code == 2, said
        assert "the fleet was stopped by SIGTERM" in said, said
        assert "leaked" not in said, said  # its queues were closed, not left to the tracker
    again = kvo("replay", config, TRACE, "--limit", "30", "--speed", "100", "--engines", "2")
    assert again.returncode == 0, again.stderr
