"""vLLM 0.33's real scheduler, configured as a user configures it, with a stand-in GPU worker.

What runs is vLLM's own code from the command line down: ``vllm serve``'s argument parser
(``EngineArgs.add_cli_args``) reads the same flags a user passes (``--kv-transfer-config`` with
``OffloadingConnector`` and its ``kv_connector_extra_config``), ``create_engine_config`` makes
the ``VllmConfig``, the KV cache config is planned by vLLM's own functions the way its engine
core plans it, and the scheduler class the config names (``Scheduler``) is built from them. The
scheduler builds the ``OffloadingConnector``, which builds the spec, the manager, the bridged
kv-offload policy and tiers. The model is a directory with a tiny Llama ``config.json`` (no
weights, no tokenizer: ``--skip-tokenizer-init``), enough for vLLM's model inspection.

Only the GPU worker is stood in for (:class:`Engine` ``.step``): each step it reports every
load and store job of the step's connector metadata as done (an async load's request in
``finished_recving``, as vLLM's worker does) and samples one token for every request whose
prompt is complete. With ``check_bytes`` it also moves bytes as the worker would: the
"forward pass" writes each finished block's bytes (derived from vLLM's block hash) into a GPU
array, a store job copies GPU rows to the CPU tier's rows (vLLM's shared memory region when
the spec has one), a load job copies them back, and every block a request reads (the prefix
its computed tokens cover, served from the GPU prefix cache or loaded) is checked against its
hash. A wrong byte anywhere on the way GPU -> CPU -> secondary tier -> CPU -> GPU fails it.

vLLM picks its platform from ``VLLM_TARGET_DEVICE`` (``cpu`` here), set on import below if
unset: a CPU-only user sets it too.

Used by tests/vllm_bridge/test_vllm_scheduler_path.py and benchmarks/vllm_scheduler_trace.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

__all__ = [
    "BLOCK_BYTES",
    "Engine",
    "EngineTotals",
    "WrongBytes",
    "cli_args",
    "write_model_dir",
]

#: The tiny model's KV bytes per token: 2 layers x (K + V) x 2 heads x 32 x 2 bytes (bf16).
BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2
#: KV bytes of one 16-token GPU block of the tiny model (all layers).
BLOCK_BYTES = 16 * BYTES_PER_TOKEN
#: The token id the stand-in worker samples.
SAMPLED_TOKEN = 7


class WrongBytes(AssertionError):
    """A block a request reads does not hold the bytes its hash says it must."""


def write_model_dir(path: str | Path) -> Path:
    """A model directory vLLM accepts: a tiny Llama ``config.json``, no weights. Nothing
    is ever run on it; vLLM reads the layer count, KV heads, head size and dtype."""
    import transformers

    path = Path(path)
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1 << 20,
        architectures=["LlamaForCausalLM"],
    )
    config.save_pretrained(path)
    return path


def cli_args(
    model_dir: str | Path,
    kv_transfer_config: Mapping[str, Any],
    *,
    block_size: int = 16,
    gpu_blocks: int = 64,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    prefix_caching: bool = True,
) -> list[str]:
    """The ``vllm serve`` flags: the model, the GPU block size and block count (vLLM would
    measure the count on a GPU), and ``--kv-transfer-config`` as JSON, as a user writes it."""
    if max_model_len is None:  # the longest prompt the GPU blocks hold, less one block
        max_model_len = (gpu_blocks - 1) * block_size
    args = [
        *("--model", str(model_dir), "--skip-tokenizer-init"),
        *("--block-size", str(block_size), "--num-gpu-blocks-override", str(gpu_blocks)),
        *("--max-model-len", str(max_model_len)),
        *("--kv-transfer-config", json.dumps(dict(kv_transfer_config))),
    ]
    if max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if not prefix_caching:
        args.append("--no-enable-prefix-caching")
    return args


@dataclass
class EngineTotals:
    """What vLLM's own scheduler stats reported, summed over the steps (the numbers
    ``vllm:prefix_cache_*`` and ``vllm:external_prefix_cache_*`` metrics are made of)."""

    steps: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    #: tokens found in the GPU prefix cache
    gpu_hit_tokens: int = 0
    #: tokens asked of / found by the connector (the offloading tiers)
    connector_queries: int = 0
    connector_hit_tokens: int = 0
    #: connector hits by the tier that supplied them (``host`` = CPU tier, ``disk`` = storage)
    hits_by_source: dict[str, int] = field(default_factory=dict)
    #: steps that scheduled no token (waiting for a tier's promotion or a load)
    idle_steps: int = 0
    load_jobs: int = 0
    store_jobs: int = 0
    #: seconds inside ``schedule()`` + ``update_from_output()`` (wall, and this thread's CPU
    #: time: on a shared machine wall time is mostly waiting for a core), the worker's (wall)
    schedule_seconds: float = 0.0
    schedule_cpu_seconds: float = 0.0
    worker_seconds: float = 0.0
    #: vLLM's connector counters (``vllm:kv_offload_*`` metrics), summed: name -> labels -> value
    counters: dict[str, dict[tuple[str, ...], float]] = field(default_factory=dict)

    def counter(self, name: str, *labels: str) -> float:
        """A ``vllm:kv_offload_*`` counter's total (over every label set if none given)."""
        series = self.counters.get(name, {})
        if labels:
            return series.get(tuple(labels), 0)
        return sum(series.values())


class _Rows:
    """The CPU tier's rows as the worker sees them: vLLM's shared memory region when the
    manager has one (the tiering spec: secondary tiers read and write it), else the worker's
    own buffer, grown on demand (vLLM's CPU-only spec keeps the buffer in the worker)."""

    def __init__(self, manager: Any) -> None:
        primary = getattr(manager, "primary_tier", None)
        self.shared: np.ndarray | None = None
        if primary is not None and hasattr(primary, "get_kv_memoryview"):
            self.shared = np.asarray(primary.get_kv_memoryview()).view(np.uint8)
        self.own: dict[int, np.ndarray] = {}

    def write(self, chunk: int, data: np.ndarray) -> None:
        if self.shared is not None:
            self.shared[chunk, : data.size] = data
        else:
            self.own[chunk] = data.copy()

    def read(self, chunk: int, nbytes: int) -> np.ndarray:
        if self.shared is not None:
            return self.shared[chunk, :nbytes]
        return self.own[chunk][:nbytes]

    def release(self) -> None:
        self.shared = None  # vLLM unmaps its region at shutdown: no view may outlive it


class Engine:
    """vLLM's scheduler built from ``args`` (``vllm serve`` flags), stepped like vLLM's engine
    core steps it (``schedule`` -> worker -> ``update_from_output``)."""

    def __init__(self, args: list[str], *, check_bytes: bool = True, log_stats: bool = True):
        from vllm.engine.arg_utils import EngineArgs
        from vllm.sampling_params import SamplingParams
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.structured_output import StructuredOutputManager

        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        config = EngineArgs.from_cli_args(parser.parse_args(args)).create_engine_config()
        self.vllm_config = config
        kv_cache_config, block_size, hash_block_size = _plan_kv_cache(config)
        self.kv_cache_config = kv_cache_config
        self.block_size = block_size
        self.scheduler: Any = config.scheduler_config.get_scheduler_cls()(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=block_size,
            hash_block_size=hash_block_size,
            log_stats=log_stats,
        )
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        # Speculative lookahead tokens are hashed from vLLM 0.33 on (0.32 has no such setting).
        lookahead = getattr(config, "num_hash_lookahead_tokens", 0)
        self._hasher = (
            get_request_block_hasher(hash_block_size, hash_fn, lookahead)
            if lookahead
            else get_request_block_hasher(hash_block_size, hash_fn)
        )
        self._sampling = SamplingParams(max_tokens=1, ignore_eos=True)
        self.connector: Any = self.scheduler.connector
        self.manager: Any = self.connector.scheduler.manager
        self.totals = EngineTotals()
        self.finished: list[str] = []
        self.gpu_block_bytes = (
            kv_cache_config.kv_cache_tensors[0].size // kv_cache_config.num_blocks
        )
        self.blocks_per_chunk: int = self.connector.scheduler.config.blocks_per_chunk
        self.check_bytes = check_bytes
        self._gpu: np.ndarray | None = None
        self._cpu: _Rows | None = None
        if check_bytes:
            self._gpu = np.zeros((kv_cache_config.num_blocks, self.gpu_block_bytes), np.uint8)
            self._cpu = _Rows(self.manager)
        self.checked_blocks = 0
        #: tokens the last step scheduled (0: it only waited for transfers)
        self.last_step_tokens = 0
        self._closed = False

    # -- requests ------------------------------------------------------------------------

    def add(self, req_id: str, token_ids: list[int]) -> None:
        """A prompt arriving (one output token, then the request finishes)."""
        from vllm.v1.request import Request

        request = Request(req_id, token_ids, self._sampling, None, block_hasher=self._hasher)
        self.scheduler.add_request(request)
        self.totals.prompt_tokens += len(token_ids)

    def busy(self) -> bool:
        """vLLM's engine keeps stepping while this holds (requests, or connector work)."""
        return bool(self.scheduler.has_requests())

    # -- one engine step ------------------------------------------------------------------

    def step(self) -> list[str]:
        """One engine-core step; the ids of the requests it finished."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        cpu_started = time.thread_time()
        started = time.perf_counter()
        output = self.scheduler.schedule()
        scheduled = time.perf_counter()
        cpu_scheduled = time.thread_time()
        self.last_step_tokens = output.total_num_scheduled_tokens
        meta = output.kv_connector_metadata
        done = OffloadingWorkerMetadata()
        recving: set[str] = set()
        load_jobs = dict(getattr(meta, "load_jobs", None) or {})
        store_jobs = dict(getattr(meta, "store_jobs", None) or {})
        for job_id, job in load_jobs.items():
            if self.check_bytes:
                self._copy(job.src_spec.block_ids, job.dst_spec.block_ids, to_gpu=True)
            done.mark_completed(job_id)
            if not getattr(job, "sync", False):  # sync loads: vLLM 0.33 on
                recving.add(job.req_id)
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = self.scheduler.requests[req_id]
            if self.check_bytes:
                self._forward(request, output.num_scheduled_tokens[req_id])
            sampled.append([] if request.is_prefill_chunk else [SAMPLED_TOKEN])
        for job_id, job in store_jobs.items():
            if self.check_bytes:
                self._copy(job.src_spec.block_ids, job.dst_spec.block_ids, to_gpu=False)
            done.mark_completed(job_id)
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_recving=recving or None, kv_connector_worker_meta=done
            ),
        )
        worked = time.perf_counter()
        cpu_worked = time.thread_time()
        outputs = self.scheduler.update_from_output(output, runner_output)
        ended = time.perf_counter()
        cpu_ended = time.thread_time()
        t = self.totals
        t.steps += 1
        t.idle_steps += not output.total_num_scheduled_tokens
        t.load_jobs += len(load_jobs)
        t.store_jobs += len(store_jobs)
        t.schedule_seconds += (scheduled - started) + (ended - worked)
        t.schedule_cpu_seconds += (cpu_scheduled - cpu_started) + (cpu_ended - cpu_worked)
        t.worker_seconds += worked - scheduled
        finished: list[str] = []
        for engine_outputs in outputs.values():
            finished += [o.request_id for o in engine_outputs.outputs if o.finished]
            self._count(engine_outputs.scheduler_stats)
        t.finished += len(finished)
        self.finished += finished
        return finished

    def run(self, *, timeout: float = 60.0, idle_sleep: float = 0.002) -> None:
        """Step until nothing is left to do (requests, or jobs of threaded tiers), sleeping
        briefly on steps that scheduled nothing; raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.busy():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the engine still had work after {timeout} s "
                    f"({len(self.scheduler.requests)} requests, "
                    f"pending connector work: {self.connector.has_pending_push_work()})"
                )
            self.step()
            if not self.last_step_tokens:
                time.sleep(idle_sleep)  # waiting for tier jobs: let their threads run

    def serve(self, req_id: str, token_ids: list[int], *, timeout: float = 60.0) -> None:
        """One request, run to completion."""
        self.add(req_id, token_ids)
        self.run(timeout=timeout)

    def shutdown(self) -> None:
        """vLLM's shutdown: the connector's manager and tiers, and its shared memory."""
        if self._closed:
            return
        self._closed = True
        if self._cpu is not None:
            self._cpu.release()
        self.scheduler.shutdown()

    # -- the stand-in worker ---------------------------------------------------------------

    def _count(self, stats: Any) -> None:
        if stats is None:
            return
        t = self.totals
        if stats.prefix_cache_stats is not None:
            t.gpu_hit_tokens += stats.prefix_cache_stats.hits
        connector = stats.connector_prefix_cache_stats
        if connector is not None:
            t.connector_queries += connector.queries
            t.connector_hit_tokens += connector.hits
            for source, tokens in connector.hits_by_source.items():
                name = getattr(source, "value", str(source))
                t.hits_by_source[name] = t.hits_by_source.get(name, 0) + tokens
        payload = stats.kv_connector_stats or {}
        types = payload.get("types") or {}
        for name, series in (payload.get("data") or {}).items():
            if types.get(name) == "counter":
                total = t.counters.setdefault(name, {})
                for labels, value in series.items():
                    total[tuple(labels)] = total.get(tuple(labels), 0) + value

    def _copy(self, src: Iterable[int], dst: Iterable[int], *, to_gpu: bool) -> None:
        """A job's copy: CPU chunks -> GPU blocks (load) or GPU blocks -> CPU chunks (store).
        A CPU chunk holds ``blocks_per_chunk`` GPU blocks, in order."""
        assert self._gpu is not None and self._cpu is not None
        per = self.blocks_per_chunk
        nbytes = self.gpu_block_bytes
        gpu_ids = [int(b) for b in (dst if to_gpu else src)]
        cpu_ids = [int(c) for c in (src if to_gpu else dst)]
        if len(gpu_ids) != len(cpu_ids) * per:
            raise WrongBytes(f"{len(gpu_ids)} GPU blocks for {len(cpu_ids)} CPU chunks")
        for i, chunk in enumerate(cpu_ids):
            blocks = gpu_ids[i * per : (i + 1) * per]
            if to_gpu:
                data = self._cpu.read(chunk, nbytes * per)
                self._gpu[blocks] = data.reshape(per, nbytes)
            else:
                self._cpu.write(chunk, self._gpu[blocks].reshape(-1))

    def _forward(self, request: Any, num_scheduled: int) -> None:
        """What the model would read and write: the blocks before this step's tokens must hold
        their bytes; the blocks this step completes get theirs."""
        assert self._gpu is not None
        computed = request.num_computed_tokens  # already advanced by schedule()
        before = computed - num_scheduled
        block_ids = self.scheduler.kv_cache_manager.get_block_ids(request.request_id)[0]
        hashes = request.block_hashes
        size = self.block_size
        for index in range(before // size):
            expected = _block_bytes(hashes[index], self.gpu_block_bytes)
            if not np.array_equal(self._gpu[block_ids[index]], expected):
                raise WrongBytes(
                    f"request {request.request_id}: block {index} (GPU block "
                    f"{block_ids[index]}) does not hold its KV bytes"
                )
            self.checked_blocks += 1
        for index in range(before // size, min(computed // size, len(hashes))):
            self._gpu[block_ids[index]] = _block_bytes(hashes[index], self.gpu_block_bytes)


def _block_bytes(block_hash: bytes, nbytes: int) -> np.ndarray:
    """A block's KV bytes: its hash repeated (distinct blocks, distinct bytes)."""
    raw = bytes(block_hash)
    return np.frombuffer((raw * (nbytes // len(raw) + 1))[:nbytes], np.uint8)


def _kv_cache_configs(config: Any, specs: list[Any], memory: list[int]) -> list[Any]:
    """``get_kv_cache_configs`` as the engine core calls it: vLLM 0.33 on plans the KV cache
    groups of the whole model first (``kv_cache_planning``), vLLM 0.32 inside the call."""
    try:
        from vllm.v1.core.kv_cache_planning import (
            get_global_kv_cache_groups,
            get_kv_cache_configs,
        )
    except ImportError:  # vLLM 0.32
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs as configs_032

        configs: list[Any] = configs_032(config, specs, memory)
        return configs
    groups = get_global_kv_cache_groups(config, specs)
    configs = get_kv_cache_configs(config, specs, memory, groups)
    return configs


def _plan_kv_cache(config: Any) -> tuple[Any, int, int]:
    """The scheduler's KV cache config, planned as vLLM's engine core plans it
    (``EngineCore._initialize_kv_caches``) from the layers the model has; the memory a GPU
    would report is replaced by ``--num-gpu-blocks-override``."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = config.model_config
    parallel = config.parallel_config
    spec = FullAttentionSpec(
        block_size=config.cache_config.block_size,
        num_kv_heads=model.get_num_kv_heads(parallel),
        head_size=model.get_head_size(),
        dtype=model.dtype,
    )
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(model.get_num_layers(parallel))]
    specs = [dict.fromkeys(layers, spec)]
    layouts = [
        layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(config))
    ]
    resolve_kv_cache_layout(config, [layouts], [spec])
    worker_configs = _kv_cache_configs(config, specs, [1 << 40])
    for worker_config in worker_configs:
        worker_config.kv_cache_layout = config.cache_config.kv_cache_layout
    kv_cache_config = generate_scheduler_kv_cache_config(worker_configs)
    config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, config)
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_cache_config, config, block_size, hash_block_size
    )
    return kv_cache_config, block_size, hash_block_size
