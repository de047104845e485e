"""One real ``vllm.LLM`` engine kept running for the engine benchmarks, driven over stdin.

``python _engine_server.py JOB.json`` starts the engine the job describes (model directory,
optional ``kv_transfer_config``), prints ``{"ready": seconds}`` and then answers one JSON
line per command read from stdin:

* ``{"op": "run", "prompts": [[ids...], ...], "interval_s": S, "max_tokens": N}`` sends the
  token-id prompts at a fixed pace (prompt *i* arrives ``i * S`` seconds after the first)
  through the engine's own request loop (``LLMEngine.add_request`` / ``step``) and answers
  each prompt's time to first token (from its arrival to the step that returned its first
  token), its generated token ids, the prompt tokens vLLM did not prefill
  (``num_cached_tokens``: with prefix caching off, those loaded from offload), and vLLM's
  metrics afterwards (tests/engine/_engine_run's
  snapshot: counters summed over labels);
* ``{"op": "shutdown"}`` shuts the engine down and exits.

The engine is the one tests/engine runs (tests/engine/_engine_run's ``build_llm``: block
size 32, float32, eager, prefix caching off so that a prompt's reuse can only come from
offload; greedy sampling here) with the engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): several such servers can be kept alive side by side
and sent requests in turn, and one that sits idle costs no CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _engine_bench puts tests/engine on sys.path; _engine_run sets vLLM's environment on import
# (CPU platform, the engine core in this process).
from _engine_bench import REPLY
from _engine_run import build_llm, vllm_metrics

#: The longest one ``run`` may take before the server gives up on it (its requests aborted).
RUN_TIMEOUT_S = 1800.0


def reply(record: dict[str, Any]) -> None:
    sys.stdout.write(REPLY + json.dumps(record) + "\n")
    sys.stdout.flush()


def run(engine: Any, command: dict[str, Any], counter: list[int]) -> dict[str, Any]:
    """Send ``command``'s prompts at its pace; every prompt's TTFT and tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = SamplingParams(
        temperature=0.0, max_tokens=int(command.get("max_tokens", 1)), ignore_eos=True
    )
    prompts: list[list[int]] = command["prompts"]
    interval = float(command.get("interval_s", 0.0))
    ids = []
    for _ in prompts:
        counter[0] += 1
        ids.append(f"r{counter[0]}")
    index = {rid: i for i, rid in enumerate(ids)}
    ttft: list[float | None] = [None] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    cached: list[int] = [0] * len(prompts)
    begun = time.monotonic()
    arrivals = [begun + i * interval for i in range(len(prompts))]
    sent = 0
    finished = 0
    while finished < len(prompts):
        now = time.monotonic()
        if now - begun > RUN_TIMEOUT_S:
            engine.abort_request(ids[finished:])
            raise TimeoutError(f"a run of {len(prompts)} prompts took over {RUN_TIMEOUT_S} s")
        while sent < len(prompts) and arrivals[sent] <= now:
            engine.add_request(ids[sent], TokensPrompt(prompt_token_ids=prompts[sent]), sampling)
            sent += 1
        if not engine.has_unfinished_requests():
            if sent < len(prompts):
                time.sleep(max(0.0, min(arrivals[sent] - time.monotonic(), 1.0)))
            continue
        for out in engine.step():
            i = index[out.request_id]
            tokens = list(out.outputs[0].token_ids)
            if ttft[i] is None and tokens:
                ttft[i] = time.monotonic() - arrivals[i]
            outputs[i] = tokens
            cached[i] = int(out.num_cached_tokens or 0)
            if out.finished:
                finished += 1
    return {
        "ttft": ttft,
        "outputs": outputs,
        "cached_tokens": cached,
        "seconds": time.monotonic() - begun,
        "metrics": vllm_metrics(),
    }


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    started = time.monotonic()
    llm = build_llm(
        job["model"],
        job.get("kv_transfer_config"),
        max_model_len=int(job.get("max_model_len", 4096)),
    )
    engine = llm.llm_engine
    reply({"ready": time.monotonic() - started, "pid": os.getpid()})
    counter = [0]
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "run":
            reply(run(engine, command, counter))
        elif command["op"] == "shutdown":
            break
        else:
            reply({"error": f"unknown op {command['op']!r}"})
    begun = time.monotonic()
    engine.engine_core.shutdown()
    reply({"shutdown": time.monotonic() - begun})


if __name__ == "__main__":
    main(sys.argv[1])
