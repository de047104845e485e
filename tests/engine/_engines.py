"""Engine processes for the real-engine tests: servers that run engines, and lone engines.

An :class:`EngineServer` is one :mod:`_engine_run` process kept for the whole test session,
in which engines are started one after another: a test whose engine needs no process of its
own runs it there (:meth:`Engines.run`, :meth:`Engines.open`) and pays vLLM's and torch's
import once per session instead of once per engine. A second server (``peer``) holds a
second engine alive beside the first, for the tests of two engines at once. An engine whose
process must end (an engine restart) or be killed runs alone (``fresh=True``,
:meth:`Engines.start`).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _workloads import Phase

RUNNER = Path(__file__).parent / "_engine_run.py"
#: Seconds one engine may take, start to shutdown (a start takes 15-30 s here).
ENGINE_TIMEOUT = 300.0
#: Greedy token ids per prompt, from the engine without offload.
Baseline = dict[tuple[int, ...], list[int]]


@dataclass
class EngineRun:
    """What one engine reported: its phases in order, and its log."""

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


class EngineServer:
    """One engine-server process (:mod:`_engine_run` without a job file): engines started
    in it one after another. Every answer is awaited with a bound; a server that fails or
    overruns is killed, the test fails with its log's tail, and the next engine gets a new
    server."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.process = subprocess.Popen(
            [sys.executable, str(RUNNER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_path.open("w"),
            text=True,
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.answers.put(json.loads(line))
        self.answers.put(None)  # the process ended

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self._fail(f"{command['op']}: the server had ended")

    def answer(self, what: str, timeout: float) -> dict[str, Any]:
        try:
            record = self.answers.get(timeout=timeout)
        except queue.Empty:
            self._fail(f"no answer to {what} within {timeout:.0f} s")
        if record is None:
            self._fail(f"the server ended during {what}")
        if "error" in record:
            self._fail(f"{what} failed:\n{record['error']}")
        return record

    def _fail(self, why: str) -> Any:
        self.kill()
        pytest.fail(f"engine server {self.name}: {why}\n{tail(self.log_path)}")

    def close(self, timeout: float = 60.0) -> None:
        if self.alive() and self.process.stdin is not None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(30)


@dataclass
class Engine:
    """An engine running in a server: send it phases, read back their records."""

    server: EngineServer
    run: EngineRun
    timeout: float
    deadline: float
    pending: list[str] = field(default_factory=list)

    def send(self, phase: Phase) -> None:
        """Send ``phase`` without waiting for it (:meth:`receive` reads its record)."""
        self.server.send({"op": "phase", "name": phase.name, "prompts": phase.prompts})
        self.pending.append(phase.name)

    def receive(self) -> dict[str, Any]:
        """The record of the oldest phase sent and not received yet."""
        name = self.pending.pop(0)
        record = self.server.answer(f"phase {name}", self.remaining(name))
        self.run.phases[name] = record
        return record

    def phase(self, phase: Phase) -> dict[str, Any]:
        self.send(phase)
        return self.receive()

    def remaining(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.server._fail(f"the engine ran over {self.timeout:.0f} s before {what}")
        return left


@dataclass
class Engines:
    """Starts engines on the tiny model: in the session's servers, or alone."""

    model: Path
    workdir: Path
    count: int = 0
    servers: dict[str, EngineServer] = field(default_factory=dict)

    def server(self, name: str) -> EngineServer:
        """The server ``name``, started when none is alive."""
        server = self.servers.get(name)
        if server is None or not server.alive():
            server = self.servers[name] = EngineServer(f"server-{name}", self.workdir)
        return server

    def close(self) -> None:
        for server in self.servers.values():
            server.close()

    def job(
        self,
        phases: Sequence[Phase],
        kv_transfer_config: dict[str, Any] | None,
        *,
        env: dict[str, str] | None = None,
        hooks: bool = False,
    ) -> Path:
        self.count += 1
        path = self.workdir / f"engine-{self.count}.json"
        job = self._start(kv_transfer_config, env, hooks)
        job["phases"] = [{"name": p.name, "prompts": p.prompts} for p in phases]
        path.write_text(json.dumps(job))
        return path

    def _start(
        self, kv_transfer_config: dict[str, Any] | None, env: dict[str, str] | None, hooks: bool
    ) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "kv_transfer_config": kv_transfer_config,
            "env": env or {},
            "hooks": hooks,
        }

    @contextmanager
    def open(
        self,
        kv_transfer_config: dict[str, Any] | None,
        *,
        env: dict[str, str] | None = None,
        hooks: bool = False,
        server: str = "main",
        timeout: float = ENGINE_TIMEOUT,
    ) -> Iterator[Engine]:
        """An engine started in server ``server``, shut down on leaving (whatever phase it
        was sent is received first); the whole of it bounded by ``timeout``."""
        process = self.server(server)
        begun = time.monotonic()
        process.send({"op": "start", **self._start(kv_transfer_config, env, hooks)})
        engine = Engine(process, EngineRun(), timeout, begun + timeout)
        engine.run.started = float(process.answer("start", engine.remaining("start"))["started"])
        try:
            yield engine
        finally:
            if process.alive():
                while engine.pending:
                    engine.receive()
                process.send({"op": "stop"})
                answer = process.answer("stop", max(engine.deadline - time.monotonic(), 60.0))
                engine.run.shutdown = float(answer["shutdown"])
        engine.run.log = tail(process.log_path)

    def run(
        self,
        phases: Sequence[Phase],
        kv_transfer_config: dict[str, Any] | None,
        *,
        env: dict[str, str] | None = None,
        hooks: bool = False,
        timeout: float = ENGINE_TIMEOUT,
        fresh: bool = False,
    ) -> EngineRun:
        """Run an engine to its end, in the main server, or with ``fresh`` in a process of
        its own that ends with it; fail with its log's tail if it fails or overruns."""
        if not fresh:
            with self.open(kv_transfer_config, env=env, hooks=hooks, timeout=timeout) as engine:
                for phase in phases:
                    engine.phase(phase)
            return engine.run
        job = self.job(phases, kv_transfer_config, env=env, hooks=hooks)
        log_path = job.with_suffix(".log")
        with log_path.open("w") as log:
            try:
                done = subprocess.run(
                    [sys.executable, str(RUNNER), str(job)],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"engine {job.name} ran over {timeout:.0f} s:\n{tail(log_path)}")
        if done.returncode != 0:
            pytest.fail(f"engine {job.name} exited with {done.returncode}:\n{tail(log_path)}")
        run = _parse(done.stdout, log_path.read_text(errors="replace"))
        assert run.shutdown is not None, f"engine {job.name} did not shut down:\n{run.log}"
        return run

    def start(
        self, phases: Sequence[Phase], kv_transfer_config: dict[str, Any] | None
    ) -> subprocess.Popen[str]:
        """An engine in a process of its own, left running (the caller reads its stdout
        and ends it)."""
        job = self.job(phases, kv_transfer_config)
        return subprocess.Popen(
            [sys.executable, str(RUNNER), str(job)],
            stdout=subprocess.PIPE,
            stderr=job.with_suffix(".log").open("w"),
            text=True,
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
