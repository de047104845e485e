"""Real ``vllm.LLM`` engines in this process, one after another, driven by JSON lines.

``python _engine_run.py`` is an engine server: it reads one command per line from stdin and
answers each with one JSON line on stdout:

* ``{"op": "start", "model": DIR, "kv_transfer_config": {...} | null, "env": {...},
  "hooks": bool}`` builds the engine (:func:`build_llm`: the tiny model, the optional
  ``kv_transfer_config``, ``env`` set in this process while it runs) and answers
  ``{"started": seconds}``;
* ``{"op": "phase", "name": N, "prompts": [[ids...], ...]}`` sends the phase's token-id
  prompts with greedy sampling and answers the generated token ids, the seconds the phase
  took and a snapshot of vLLM's Prometheus metrics (counters summed over their labels, and
  per ``tier`` label for vLLM's tiering metrics) with, when ``start`` asked for ``hooks``,
  the kv-offload Prometheus hook plugin's counters; both counted since the engine started,
  so an earlier engine of this process does not show;
* ``{"op": "stop"}`` shuts the engine down (its ``env`` unset) and answers
  ``{"shutdown": seconds}``.

Importing vLLM and torch is most of what starting an engine costs (14-17 CPU-seconds here,
against 3-4 for another engine in a process that has them), so the tests run every engine
that needs no process of its own in one server. ``python _engine_run.py JOB.json`` runs the
one engine a job file describes (``start``'s keys and ``"phases": [{"name", "prompts"}]``)
from start to shutdown and exits: an engine whose process must end, or be killed.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a ``SIGKILL``
of it kills the whole engine, and the hook plugin's registry is readable here. An engine that
fails to start or to run is answered ``{"error": traceback}`` and the process exits (vLLM's
state after a failure is not worth trusting for the next engine).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little

#: vLLM metrics the tests read (``vllm:`` prefix left out).
METRICS = (
    "external_prefix_cache_hits",
    "external_prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens",
    "kv_offload_load_bytes",
    "kv_offload_load_time",
    "kv_offload_store_bytes",
    "kv_offload_store_time",
    "kv_offload_tiering_chunk_hits",
    "kv_offload_tiering_chunk_queries",
    "kv_offload_tiering_promotion_job_failures",
    "kv_offload_tiering_read_bytes",
    "kv_offload_tiering_write_bytes",
)


def build_llm(
    model: str, kv_transfer_config: dict[str, Any] | None, *, max_model_len: int = 4096
) -> Any:
    """The engine every real-engine test and benchmark runs: block size 32 (vLLM's CPU
    attention takes multiples of 32 only), float32, eager, token-id prompts (no tokenizer),
    prefix caching off so that a prompt's reuse can only come from offload, seed 0, and
    vLLM's statistics on (its metrics are what the tests read)."""
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if kv_transfer_config is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**kv_transfer_config)
    return LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=32,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=max_model_len,
        max_num_seqs=8,
        seed=0,
        disable_log_stats=False,
        **kwargs,
    )


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def vllm_metrics() -> dict[str, float]:
    """vLLM's counters (histograms: their sums) by name, summed over labels; those with a
    ``tier`` label also per tier, as ``name{tier}``. Read from prometheus_client's registry,
    where vLLM's frontend keeps them: ``LLM.get_metrics`` rounds counters to integers, and
    seconds of transfer time would read 0."""
    from prometheus_client import REGISTRY

    values: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            name = sample.name.removeprefix("vllm:")
            for suffix in ("_total", "_sum"):
                name = name.removesuffix(suffix)
            if name not in METRICS or sample.name.endswith(("_created", "_count", "_bucket")):
                continue
            values[name] = values.get(name, 0.0) + float(sample.value)
            tier = sample.labels.get("tier")
            if tier is not None:  # vLLM's label is "<position>:<type>", e.g. "1:kvo_fs"
                key = f"{name}{{{tier.split(':', 1)[-1]}}}"
                values[key] = values.get(key, 0.0) + float(sample.value)
    return values


def hook_metrics() -> dict[str, float]:
    """The kv-offload Prometheus exporter's samples in this process, summed over labels."""
    from kv_offload.plugins import get_plugin_manager

    exporter = get_plugin_manager().get_plugin("prometheus")
    if exporter is None:
        return {}
    values: dict[str, float] = {}
    for family in exporter.registry.collect():
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def since(now: dict[str, float], start: dict[str, float]) -> dict[str, float]:
    """Each value's growth since ``start`` (an engine's counters, not its process's)."""
    return {name: value - start.get(name, 0.0) for name, value in now.items()}


class Engine:
    """One running engine, and the metrics its process showed when it started."""

    def __init__(self, command: dict[str, Any]) -> None:
        self.env = {str(k): str(v) for k, v in (command.get("env") or {}).items()}
        self.hooks = bool(command.get("hooks"))
        self.replaced = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        self.llm = build_llm(command["model"], command.get("kv_transfer_config"))
        self.vllm_start = vllm_metrics()
        self.hooks_start = hook_metrics() if self.hooks else {}

    def phase(self, command: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling = SamplingParams(
            temperature=0.0, max_tokens=int(command.get("max_tokens", 8)), ignore_eos=True
        )
        begun = time.monotonic()
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in command["prompts"]]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        record: dict[str, Any] = {
            "phase": command["name"],
            "outputs": [list(out.outputs[0].token_ids) for out in outputs],
            "seconds": time.monotonic() - begun,
            "metrics": since(vllm_metrics(), self.vllm_start),
        }
        if self.hooks:
            record["hooks"] = since(hook_metrics(), self.hooks_start)
        return record

    def stop(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()  # the engine's KV cache (VLLM_CPU_KVCACHE_SPACE) goes before the next
        for name, value in self.replaced.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def reported_failure() -> Iterator[None]:
    """A failure is answered as ``{"error": traceback}``, then this process ends."""
    try:
        yield
    except BaseException:
        emit({"error": traceback.format_exc()})
        raise


def serve(commands: Iterable[dict[str, Any]]) -> None:
    """Answer each command (the module docstring lists them) in turn."""
    engine: Engine | None = None
    for command in commands:
        op = command.get("op")
        with reported_failure():
            if op == "start":
                if engine is not None:
                    raise RuntimeError("start while an engine runs: stop it first")
                begun = time.monotonic()
                engine = Engine(command)
                emit({"started": time.monotonic() - begun})
            elif op == "phase" and engine is not None:
                emit(engine.phase(command))
            elif op == "stop" and engine is not None:
                begun = time.monotonic()
                engine.stop()
                engine = None
                emit({"shutdown": time.monotonic() - begun})
            else:
                raise RuntimeError(f"unknown command, or no engine running: {command}")


def job_commands(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A job file's engine as the commands that run it from start to shutdown."""
    yield {"op": "start", **{k: v for k, v in job.items() if k != "phases"}}
    for phase in job["phases"]:
        yield {"op": "phase", **phase}
    yield {"op": "stop"}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        serve(job_commands(json.loads(Path(sys.argv[1]).read_text())))
    else:
        serve(json.loads(line) for line in sys.stdin if line.strip())
