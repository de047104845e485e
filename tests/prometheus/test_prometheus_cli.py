"""``kv-offload replay ... --metrics-port N``: a real CLI process serves its metrics while it
replays, scraped over HTTP from the test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "conversation_trace.jsonl"
CLI = [sys.executable, "-m", "kv_offload.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def started(url: str) -> float | None:
    """``kv_offload_requests_started_total`` at ``url``, or ``None`` (nothing served yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kv_offload_requests_started_total":
                return sample.value
    return None


def test_replay_serves_metrics_while_it_runs(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KV_OFFLOAD_")}
    proc = subprocess.Popen(
        [
            *CLI,
            "replay",
            "default",
            str(TRACE),
            "--limit",
            "400",
            "--json",
            "--no-progress",
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: list[float] = []
    try:
        while proc.poll() is None and len(seen) < 2:
            value = started(url)
            if value and (not seen or value > seen[-1]):
                seen.append(value)  # two scrapes that saw the replay advance
            time.sleep(0.02)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"serving metrics at {url}" in err
    report = json.loads(out)
    assert len(seen) == 2, f"no scrape saw the replay running ({seen}); stderr: {err}"
    assert 0 < seen[0] < seen[1] <= report["requests"]
    assert started(url) is None  # the server stops with the replay


def test_metrics_port_in_use_is_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*CLI, "replay", "default", str(TRACE), "--limit", "1", "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"kv-offload replay: error: <default config>: hooks.prometheus.port: port {port} is in "
        "use on 127.0.0.1: pick a free port (or 0 for any free one), or stop what listens there"
    )
