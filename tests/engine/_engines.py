"""Engine processes for the real-engine tests: start, run to the end, kill, read back.

Every engine runs in its own process (:mod:`_engine_run`), one at a time, on the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _workloads import Phase

RUNNER = Path(__file__).parent / "_engine_run.py"
#: Seconds one engine process may take, start to shutdown (a start takes 15-30 s here).
ENGINE_TIMEOUT = 300.0
#: Greedy token ids per prompt, from the engine without offload.
Baseline = dict[tuple[int, ...], list[int]]


@dataclass
class EngineRun:
    """What one engine process reported: its phases in order, and its log."""

    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: float | None = None
    shutdown: float | None = None
    log: str = ""

    def outputs(self, name: str) -> list[list[int]]:
        return list(self.phases[name]["outputs"])

    def metric(self, phase: str, name: str) -> float:
        return float(self.phases[phase]["metrics"].get(name, 0.0))

    def gained(self, phase: str, name: str, before: str | None) -> float:
        """How much counter ``name`` grew during ``phase`` (``before`` the phase ahead)."""
        start = 0.0 if before is None else self.metric(before, name)
        return self.metric(phase, name) - start


def _parse(stdout: str, log: str) -> EngineRun:
    run = EngineRun(log=log)
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "phase" in record:
            run.phases[record["phase"]] = record
        elif "started" in record:
            run.started = record["started"]
        elif "shutdown" in record:
            run.shutdown = record["shutdown"]
    return run


@dataclass
class Engines:
    """Starts engine processes on the tiny model, one at a time."""

    model: Path
    workdir: Path
    count: int = 0

    def job(
        self,
        phases: Sequence[Phase],
        kv_transfer_config: dict[str, Any] | None,
        *,
        hooks: bool = False,
    ) -> Path:
        self.count += 1
        path = self.workdir / f"engine-{self.count}.json"
        job = {
            "model": str(self.model),
            "kv_transfer_config": kv_transfer_config,
            "phases": [{"name": p.name, "prompts": p.prompts} for p in phases],
            "hooks": hooks,
        }
        path.write_text(json.dumps(job))
        return path

    def run(
        self,
        phases: Sequence[Phase],
        kv_transfer_config: dict[str, Any] | None,
        *,
        env: dict[str, str] | None = None,
        hooks: bool = False,
        timeout: float = ENGINE_TIMEOUT,
    ) -> EngineRun:
        """Run an engine to its end; fail with its log's tail if it fails or overruns."""
        job = self.job(phases, kv_transfer_config, hooks=hooks)
        log_path = job.with_suffix(".log")
        with log_path.open("w") as log:
            try:
                done = subprocess.run(
                    [sys.executable, str(RUNNER), str(job)],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=timeout,
                    env={**os.environ, **(env or {})},
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"engine {job.name} ran over {timeout:.0f} s:\n{tail(log_path)}")
        if done.returncode != 0:
            pytest.fail(f"engine {job.name} exited with {done.returncode}:\n{tail(log_path)}")
        run = _parse(done.stdout, log_path.read_text(errors="replace"))
        assert run.shutdown is not None, f"engine {job.name} did not shut down:\n{run.log}"
        return run

    def start(
        self,
        phases: Sequence[Phase],
        kv_transfer_config: dict[str, Any] | None,
        *,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """An engine process left running (the caller reads its stdout and ends it)."""
        job = self.job(phases, kv_transfer_config)
        return subprocess.Popen(
            [sys.executable, str(RUNNER), str(job)],
            stdout=subprocess.PIPE,
            stderr=job.with_suffix(".log").open("w"),
            text=True,
            env={**os.environ, **(env or {})},
        )


def tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def kill(process: subprocess.Popen[str]) -> None:
    """``SIGKILL`` the engine process (it holds the engine core, the worker and the tiers)."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(30)


def read_until(process: subprocess.Popen[str], phase: str, timeout: float) -> list[str]:
    """The engine's stdout lines up to and including its record of ``phase``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("{") and json.loads(line).get("phase") == phase:
            return lines
    kill(process)
    pytest.fail(f"the engine did not report phase {phase!r} within {timeout:.0f} s")


def expected(baseline: Baseline, phase: Phase) -> list[list[int]]:
    return [baseline[tuple(prompt)] for prompt in phase.prompts]
