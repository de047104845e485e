"""Issue 25: the timed replay (``--speed``), its load-wait policies and its report.

Real tiers and real time: a faulty tier wrapping the example tier delays promotions by wall
seconds, and the engine loop steps in real time, so a block that arrives after its request's
budget is late and one that arrives in time is a hit from the tier.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kv_offload import TierStats, build_manager
from kv_offload.errors import ConfigError, PluginNotFoundError
from kv_offload.keys import make_offload_key
from kv_offload.load_wait import BestEffort, Timeout, WaitComplete, build_load_wait
from kv_offload.replay_clock import replay_timed
from kv_offload.replay_records import ReplayProbe, TierJob, TimedRequest, register_probe
from kv_offload.replay_report import busy_seconds, latency_summary, tier_throughput
from kv_offload.trace import TraceError, arrival_seconds, read_trace
from kv_offload.types import ReqContext
from test_cli import SCRIPT, TRACE, _env, assert_one_line_error, kvo, kvo_many

BLOCK = 256


def _stack(load_delay_s: float = 0.0, num_blocks: int = 8) -> Any:
    """CPU tier of ``num_blocks`` in front of a faulty(example) tier delaying its jobs."""
    return build_manager(
        {
            "num_blocks": num_blocks,
            "block_size_bytes": BLOCK,
            "tiers": [{"type": "faulty", "delay_s": load_delay_s, "inner": {"type": "example"}}],
        }
    )


def _requests(*prefixes: tuple[float, list[int]]) -> list[TimedRequest]:
    return [
        TimedRequest(ReqContext(f"r{i}"), [make_offload_key(h) for h in hashes], at)
        for i, (at, hashes) in enumerate(prefixes)
    ]


def _run(manager: Any, requests: list[TimedRequest], policy: Any, **kw: Any) -> Any:
    probe = ReplayProbe()
    undo = register_probe(manager, probe)
    try:
        return replay_timed(
            manager,
            requests,
            speed=kw.pop("speed", 1.0),
            load_wait=policy,
            block_tokens=512,
            data_plane=True,
            probe=probe,
            **kw,
        )
    finally:
        undo()
        manager.shutdown()


# A prefix stored, pushed out of an 8-block CPU tier by 8 other blocks once its cascade
# landed (a tier delaying jobs up to 0.3 s), then asked again:
# its 4 blocks come back from the tier.
PUSHED_OUT = ((0.0, [1, 2, 3, 4]), (0.4, list(range(10, 18))), (0.8, [1, 2, 3, 4]))


def test_wait_complete_serves_a_slow_tier_and_measures_the_wait() -> None:
    result = _run(_stack(load_delay_s=0.05), _requests(*PUSHED_OUT), WaitComplete())
    assert result.hits_by_origin["faulty"] == 4 and result.late_blocks == 0
    assert result.corrupted_blocks == 0 and result.verified_blocks == 4
    # Every promoted block waited at least the tier's delay, and not unboundedly.
    assert len(result.promotion_latencies) == 4
    assert all(0.05 <= s < 2.0 for s in result.promotion_latencies)


def test_best_effort_never_waits_so_a_promotion_is_late() -> None:
    result = _run(_stack(load_delay_s=0.05), _requests(*PUSHED_OUT), BestEffort())
    assert result.hit_blocks == 0
    assert result.late_blocks == 4 and result.waited_requests == 0


def test_timeout_budget_decides_whether_a_promotion_is_in_time() -> None:
    short = _run(_stack(load_delay_s=0.3), _requests(*PUSHED_OUT), Timeout(base_s=0.02))
    assert short.late_blocks == 4 and short.hits_by_origin["faulty"] == 0
    long = _run(_stack(load_delay_s=0.05), _requests(*PUSHED_OUT), Timeout(base_s=1.0))
    assert long.late_blocks == 0 and long.hits_by_origin["faulty"] == 4


def test_requests_arrive_at_their_time_scaled_by_speed() -> None:
    requests = _requests((0.0, [1]), (1.0, [2]), (2.0, [3]))
    result = _run(_stack(), requests, WaitComplete(), speed=10.0)
    assert result.requests == 3 and result.trace_seconds == 2.0
    assert 0.19 <= result.seconds < 1.0  # 2 s of trace at 10x
    assert max(result.admission_lags) < 0.1


def test_a_later_hit_on_a_promoted_block_is_the_cpu_tiers() -> None:
    requests = _requests(*PUSHED_OUT, (1.2, [1, 2, 3, 4]))
    result = _run(_stack(), requests, WaitComplete())
    assert result.hits_by_origin == {"faulty": 4, "CPU": 4}


def test_bad_speed_and_step_are_refused() -> None:
    manager = _stack()
    try:
        for bad in (0, -1.0, math.nan, math.inf):
            with pytest.raises(ConfigError, match="speed"):
                replay_timed(manager, [], speed=bad, load_wait=BestEffort(), block_tokens=512)
        with pytest.raises(ConfigError, match="step_s"):
            replay_timed(manager, [], speed=1, load_wait=BestEffort(), block_tokens=512, step_s=0)
    finally:
        manager.shutdown()


def test_load_wait_policies_by_name_with_options() -> None:
    assert isinstance(build_load_wait("best_effort"), BestEffort)
    assert math.isinf(build_load_wait("wait_complete").budget_s(10, 512))
    timeout = build_load_wait("timeout", {"base_s": 0.5, "per_1k_tokens_s": 0.1})
    assert timeout.budget_s(4, 512) == pytest.approx(0.5 + 0.1 * 2)
    with pytest.raises(ConfigError, match="base_s"):
        build_load_wait("timeout", {"base_s": -1})
    with pytest.raises(ConfigError, match="does not take"):
        build_load_wait("timeout", {"bogus": 1})
    with pytest.raises(PluginNotFoundError, match="nope"):
        build_load_wait("nope")


def test_latency_summary_and_busy_union() -> None:
    assert latency_summary([]) == {"count": 0, "p50": None, "p99": None, "max": None}
    summary = latency_summary([float(i) for i in range(1, 101)])
    assert summary["p50"] == 50.0 and summary["p99"] == 99.0 and summary["max"] == 100.0
    jobs = [
        TierJob("t", "store", 1, seconds=1.0, done=2.0, success=True),  # [1, 2]
        TierJob("t", "store", 1, seconds=1.0, done=2.5, success=True),  # [1.5, 2.5]
        TierJob("t", "load", 1, seconds=0.5, done=4.0, success=True),  # [3.5, 4]
    ]
    assert busy_seconds(jobs) == pytest.approx(2.0)


def _trace(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ('{"hash_ids": [2]}', "t.jsonl:2: the request has no 'timestamp'"),
        ('{"timestamp": 5, "hash_ids": [2]}', "t.jsonl:2: 'timestamp' 5 goes back in time"),
        ('{"timestamp": NaN, "hash_ids": [2]}', "t.jsonl:2: 'timestamp' must be finite"),
        ('{"timestamp": -1, "hash_ids": [2]}', "t.jsonl:2: 'timestamp' must be finite and >= 0"),
        ('{"timestamp": "10", "hash_ids": [2]}', "t.jsonl:2: 'timestamp' must be a number"),
    ],
)
def test_timestamps_a_timed_replay_cannot_use_name_file_and_line(
    tmp_path: Path, second: str, message: str
) -> None:
    path = _trace(tmp_path, '{"timestamp": 10, "hash_ids": [1]}', second)
    records = list(read_trace(path))
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        arrival_seconds(records, path)
    assert arrival_seconds(records[:1], path) == [0.01]


def _slow_tier_config(tmp_path: Path, delay_s: float) -> Path:
    """64 CPU blocks in front of a device taking ``delay_s`` per job, one job at a time."""
    config = tmp_path / f"slow-{delay_s}.toml"
    config.write_text(
        'num_blocks = 64\nblock_size_bytes = 1024\n[[tiers]]\ntype = "faulty"\n'
        f'delay_s = {delay_s}\n[tiers.inner]\ntype = "example"\n'
    )
    return config


def test_cli_timed_replay_reports_tiers_latency_and_verdict(tmp_path: Path) -> None:
    fast, slow = _slow_tier_config(tmp_path, 0.005), _slow_tier_config(tmp_path, 0.05)
    as_json, text, behind = kvo_many(
        ["replay", fast, TRACE, "--limit", "150", "--speed", "50", "--json"],
        ["replay", fast, TRACE, "--limit", "150", "--speed", "50", "--load-wait", "best_effort"],
        ["replay", slow, TRACE, "--limit", "150", "--speed", "500", "--json"],
    )
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["timed"] and report["speed"] == 50 and report["corrupted_blocks"] == 0
    assert report["hit_ratio_by_tier"]["faulty"] > 0
    assert report["promotion_latency_s"]["count"] > 0
    assert report["promotion_latency_s"]["p50"] >= 0.005
    tier = report["tiers"]["faulty"]
    assert tier["demand_bytes_per_s_at_speed"] == pytest.approx(tier["demand_bytes_per_s_1x"] * 50)
    assert tier["keeps_up"] and "faulty keeps up at 50x" in tier["verdict"]
    assert text.returncode == 0, text.stderr
    assert "best_effort" in text.stdout and "blocks late" in text.stdout
    assert "verdict        faulty keeps up" in text.stdout
    # One 50 ms job at a time cannot take the trace's cascades at 500x: its jobs queue.
    assert behind.returncode == 0, behind.stderr
    tier = json.loads(behind.stdout)["tiers"]["faulty"]
    assert not tier["keeps_up"] and tier["utilization"] > 0.9
    assert "faulty falls behind at 500x" in tier["verdict"] and tier["keeps_up_to_x"] < 500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed: must be a positive finite multiple"),
        (["--speed", "-3"], "--speed: must be a positive finite multiple"),
        (["--speed", "nan"], "--speed: must be a positive finite multiple"),
        (["--speed", "fast"], "--speed: not a number: 'fast'"),
        (["--load-wait", "best_effort"], "apply to a timed replay: add --speed"),
        (["--speed", "10", "--load-wait", "nope"], "nope"),
        (["--speed", "10", "--load-wait-option", "x"], "expected KEY=VALUE"),
    ],
)
def test_cli_refuses_bad_clock_options(args: list[str], message: str) -> None:
    proc = kvo("replay", "default", TRACE, "--limit", "5", *args)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_cli_timed_replay_of_a_trace_without_timestamps(tmp_path: Path) -> None:
    path = _trace(tmp_path, '{"hash_ids": [1]}')
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 4\n")
    timed, untimed = kvo_many(
        ["replay", config, path, "--speed", "5"], ["replay", config, path, "--speed", "max"]
    )
    assert timed.returncode != 0 and "t.jsonl:1" in timed.stderr and "--speed max" in timed.stderr
    assert untimed.returncode == 0, untimed.stderr


def test_a_replay_loop_slower_than_the_trace_says_so(tmp_path: Path) -> None:
    """100 requests of 1 MiB blocks, all due within a millisecond: the loop cannot admit
    them on time, and the report says its figures are about the loop, not the tiers."""
    config = tmp_path / "c.toml"
    config.write_text(
        'num_blocks = 64\nblock_size_bytes = 4096\n[[tiers]]\ntype = "example"\n'
        "capacity_blocks = 64\n"
    )
    args = ["--limit", "100", "--speed", "1000000", "--block-bytes", "1MiB"]
    text, as_json = kvo_many(
        ["replay", config, TRACE, *args], ["replay", config, TRACE, *args, "--json"]
    )
    assert text.returncode == 0, text.stderr
    assert "NOTE: the replay loop itself fell behind the trace" in text.stdout
    report = json.loads(as_json.stdout)
    assert report["engine_keeps_up"] is False and report["admission_lag_s"]["p99"] > 0.1
    # Issue 37, 9: the tier looked idle, and its verdict said it kept up; it cannot be given.
    tier = report["tiers"]["example"]
    assert tier["keeps_up"] is None
    assert tier["verdict"].startswith("example: no verdict at 1e+06x real time: the replay loop")
    assert "verdict        example: no verdict" in text.stdout and "keeps up" not in text.stdout


# -- issue 37, 3: a trace whose timed replay would take hours is refused before it starts -----


def _kvo_within(seconds: float, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``kv-offload ARGS``, killed (and the test failed) if it runs over ``seconds``."""
    assert SCRIPT is not None
    argv = [SCRIPT, *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=seconds)


@pytest.mark.parametrize("gap_ms", ["3600000000", "1e15", "1e300"])
def test_a_huge_timestamp_gap_is_refused_at_once_with_the_fixes(
    tmp_path: Path, gap_ms: str
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 8\n")
    path = _trace(
        tmp_path,
        '{"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2]}',
        '{"timestamp": 5, "input_length": 1024, "hash_ids": [1, 2]}',
        f'{{"timestamp": {gap_ms}, "input_length": 1024, "hash_ids": [1, 2]}}',
    )
    started = time.monotonic()
    proc = _kvo_within(60, "replay", config, path, "--speed", "30")
    assert time.monotonic() - started < 60
    line = assert_one_line_error(
        proc, "would take", "over the 6.0 h allowed", "between lines 2 and 3 of", "--speed max"
    )
    assert "give --speed" in line and "--max-duration" in line
    if gap_ms == "3600000000":  # 1,000 h of trace at 30x: 33.3 h; 170x fits in 6 h
        assert "would take 33.3 h" in line and "--speed 170 or more" in line


def test_a_timed_replay_says_how_long_it_takes_and_max_duration_bounds_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("num_blocks = 8\n")
    path = _trace(
        tmp_path,
        '{"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2]}',
        '{"timestamp": 2000, "input_length": 1024, "hash_ids": [1, 2]}',
    )
    slow, ran, refused, untimed = kvo_many(
        ["replay", config, path, "--speed", "1", "--json"],
        ["replay", config, path, "--speed", "10", "--json"],
        ["replay", config, path, "--speed", "10", "--max-duration", "0.1"],
        ["replay", config, path, "--max-duration", "10"],
    )
    assert slow.returncode == 0, slow.stderr
    assert slow.stderr == "timed replay: 2 s of trace at 1x real time: about 2 s\n"
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""  # 0.2 s: over before the line would help
    assert json.loads(ran.stdout)["requests"] == 2
    assert_one_line_error(refused, "would take 0.2 s", "over the 0.1 s allowed", "--speed 20")
    assert_one_line_error(untimed, "--max-duration applies to a timed replay: add --speed")


@pytest.mark.timeout(30)  # before the fix it slept for the 33 hours
def test_replay_timed_refuses_a_plan_over_max_wall_s_before_it_starts() -> None:
    manager = _stack()
    requests = _requests((0.0, [1, 2]), (3.6e6, [1, 2]))
    with pytest.raises(ConfigError, match=r"would take 33.3 h .*after request 0\)"):
        replay_timed(manager, requests, speed=30, load_wait=BestEffort(), block_tokens=512)
    assert manager.cpu_stats().resident_blocks == 0  # nothing ran
    result = _run(manager, requests[:1], BestEffort(), max_wall_s=1.0)
    assert result.requests == 1


# -- issue 37, 9 and 10: no verdict contradicts keeps_up_to_x; a trace of one instant has none


def _row(busy_jobs: list[tuple[float, float]], *, trace_s: float, span_s: float, **kw: Any) -> Any:
    """A tier's report row: 1 MiB moved per job (start, end) in one direction, no drops."""
    jobs = [TierJob("fs", "store", 1 << 20, end - start, end, True) for start, end in busy_jobs]
    stats = TierStats("fs", cascaded_blocks=len(jobs), bytes_written=len(jobs) << 20)
    return tier_throughput("fs", jobs, stats, 1 << 20, trace_s, 30.0, span_s, **kw)


def test_a_verdict_never_contradicts_keeps_up_to_x() -> None:
    # 10 MiB in 1 s busy of a 10 s run (idle 90%), for a 1 s trace: 10 MiB/s at 1x, so the
    # tier keeps up to 1x, not at 30x (its jobs ran long past the trace's 33 ms at 30x).
    slow = _row([(i, i + 0.1) for i in range(10)], trace_s=1.0, span_s=10.0)
    assert slow["keeps_up_to_x"] == pytest.approx(1.0)
    assert slow["keeps_up"] is False and slow["verdict"].startswith("fs falls behind at 30x")
    assert "keeps up to about 1.0x" in slow["verdict"]
    # The same work in 1/100 of the time: keeps up, to at least its multiple.
    fast = _row([(i / 1000, i / 1000 + 0.001) for i in range(10)], trace_s=1.0, span_s=0.1)
    assert fast["keeps_up_to_x"] == pytest.approx(100.0) and fast["keeps_up"] is True
    assert (
        fast["verdict"].startswith("fs keeps up at 30x")
        and "at least about 100x" in fast["verdict"]
    )
    # Busy all the time yet fast enough on average: at its limit, never "falls behind".
    full = _row([(i / 1000, i / 1000 + 0.001) for i in range(10)], trace_s=1.0, span_s=0.0105)
    assert full["keeps_up_to_x"] > 30 and full["keeps_up"] is False
    assert (
        full["verdict"].startswith("fs is at its limit at 30x") and "falls" not in full["verdict"]
    )
    # The replay loop fell behind: the figure measures the loop, so there is no verdict.
    loop = _row([(i, i + 0.1) for i in range(10)], trace_s=1.0, span_s=10.0, loop_kept_up=False)
    assert loop["keeps_up"] is None and "no verdict at 30x" in loop["verdict"]
    assert "the replay loop itself fell behind" in loop["verdict"]


def test_a_trace_of_one_instant_has_no_demand_rate(tmp_path: Path) -> None:
    """Every timestamp 0: blocks are cascaded, but there is no rate to keep up with."""
    lines = [json.loads(line) for line in TRACE.read_text().splitlines()[:60]]
    path = _trace(tmp_path, *(json.dumps({**line, "timestamp": 0}) for line in lines))
    config = tmp_path / "c.toml"
    config.write_text(
        'num_blocks = 64\nblock_size_bytes = 4096\n[[tiers]]\ntype = "example"\n'
        "capacity_blocks = 4096\n"
    )
    as_json, text = kvo_many(
        ["replay", config, path, "--speed", "30", "--json"],
        ["replay", config, path, "--speed", "30"],
    )
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["trace_seconds"] == 0 and report["cascaded_blocks"] > 0
    tier = report["tiers"]["example"]
    assert tier["keeps_up"] is None and tier["demand_bytes_per_s_1x"] is None
    assert "the trace spans 0 s" in tier["verdict"] and "no demand rate" in tier["verdict"]
    assert "moved nothing" not in tier["verdict"]
    assert text.returncode == 0, text.stderr
    assert "verdict        example: no verdict: the trace spans 0 s" in text.stdout
