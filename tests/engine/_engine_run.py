"""One real ``vllm.LLM`` engine in its own process, driven by a JSON job file.

``python _engine_run.py JOB.json`` starts the engine the job describes (the tiny model, an
optional ``kv_transfer_config``), sends each phase's token-id prompts with greedy sampling
and prints one JSON line per phase: the generated token ids, the seconds the phase took and
a snapshot of vLLM's Prometheus metrics (counters summed over their labels, and per ``tier``
label for vLLM's tiering metrics) with, when the job asks, the kv-offload Prometheus hook plugin's
counters. The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a
``SIGKILL`` of it kills the whole engine, and the hook plugin's registry is readable here.
A last line ``{"shutdown": seconds}`` says the engine shut down.
"""

from __future__ import annotations

import json
import os
import sys
import time
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


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {}
    if job.get("kv_transfer_config") is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv_transfer_config"])
    started = time.monotonic()
    llm = LLM(
        model=job["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=32,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=4096,
        max_num_seqs=8,
        seed=0,
        disable_log_stats=False,
        **kwargs,
    )
    emit({"started": time.monotonic() - started})
    sampling = SamplingParams(temperature=0.0, max_tokens=job.get("max_tokens", 8), ignore_eos=True)
    for phase in job["phases"]:
        begun = time.monotonic()
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in phase["prompts"]]
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
        record: dict[str, Any] = {
            "phase": phase["name"],
            "outputs": [list(out.outputs[0].token_ids) for out in outputs],
            "seconds": time.monotonic() - begun,
            "metrics": vllm_metrics(),
        }
        if job.get("hooks"):
            record["hooks"] = hook_metrics()
        emit(record)
    begun = time.monotonic()
    llm.llm_engine.engine_core.shutdown()
    emit({"shutdown": time.monotonic() - begun})


if __name__ == "__main__":
    main(sys.argv[1])
