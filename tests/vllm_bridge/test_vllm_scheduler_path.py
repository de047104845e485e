"""The path users configure: ``--kv-transfer-config`` into vLLM 0.33's real scheduler.

The other bridge tests drive vLLM's managers directly; users never build a manager. Here
vLLM's own ``vllm serve`` argument parser reads ``--kv-transfer-config`` with the JSON blocks
of plugins/vllm_bridge/README.md (read from the README, so the documented configuration is
the tested one), vLLM makes its ``VllmConfig`` and builds its real
``vllm.v1.core.sched.scheduler.Scheduler``, whose ``OffloadingConnector`` builds the spec,
the manager and the bridged kv-offload policy and tiers. Only the GPU worker is stood in for
(benchmarks/vllm_engine.py): it completes every transfer job vLLM hands it and moves real
bytes GPU -> CPU tier -> secondary tier and back, checking every block a request reads.

What the test replaces in a README block: ``cpu_bytes_to_use`` (a small CPU tier), the fs
tier's ``root_dir`` (a temporary directory) and the Redis tier's ``url`` (a redis-server the
test starts); the policy block runs once per shipped policy (``eviction_policy``). Every other
key is used as the README writes it.
"""

from __future__ import annotations

import glob
import json
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _vllm import require_release, require_vllm
from kv_offload.plugins import get_plugin_manager, hookimpl

require_vllm("vllm.v1.core.sched.scheduler", needs_torch=True)
# vLLM 0.34's CPU platform refuses to build an engine configuration on x86 without triton-cpu
# ("vLLM on x86 CPUs requires Triton"), which the vllm session does not install.
require_release("0.32", "0.33", claim="the scheduler path on vLLM's CPU platform without Triton")

from benchmarks.vllm_engine import BLOCK_BYTES, Engine, WrongBytes, cli_args, write_model_dir  # noqa: E402

README = Path(__file__).resolve().parents[2] / "plugins" / "vllm_bridge" / "README.md"
POLICIES = ["kvo_lru", "kvo_prefix-lru", "kvo_arc", "kvo_vllm-arc", "kvo_reuse", "kvo_sae"]
GPU_BLOCK_TOKENS = 16  # --block-size, vLLM's default on a GPU


def readme_configs() -> list[dict[str, Any]]:
    """Every ``--kv-transfer-config`` JSON block of the bridge's README, in order."""
    blocks = re.findall(r"```json\n(.*?)```", README.read_text(), re.S)
    configs = [json.loads(block) for block in blocks]
    return [c for c in configs if c.get("kv_connector") == "OffloadingConnector"]


def readme_config(*, tier: str | None) -> dict[str, Any]:
    """The README's block for ``tier`` (``None``: the policy block, no secondary tiers)."""
    for config in readme_configs():
        tiers = config["kv_connector_extra_config"].get("secondary_tiers")
        if tier is None and not tiers:
            return config
        if tier is not None and tiers and tiers[0]["type"] == tier:
            return config
    raise LookupError(f"README.md has no --kv-transfer-config block for tier {tier!r}")


def test_the_readme_documents_every_shipped_policy_and_tier() -> None:
    configs = readme_configs()
    assert len(configs) == 4, configs
    text = README.read_text()
    for policy in POLICIES:
        assert f"`{policy}`" in text, policy
    for tier in ("kvo_example", "kvo_fs", "kvo_redis"):
        readme_config(tier=tier)
    fs = readme_config(tier="kvo_fs")["kv_connector_extra_config"]["secondary_tiers"][0]
    assert "root_dir" in fs and ("capacity_blocks" in fs or "capacity_bytes" in fs)
    redis_tier = readme_config(tier="kvo_redis")["kv_connector_extra_config"]
    assert redis_tier["secondary_tiers"][0]["url"].startswith("redis://")


class Recorder:
    """A kv-offload hook plugin, registered like any other: what the bridge reports."""

    def __init__(self) -> None:
        self.stored: dict[str, int] = {}
        self.evicted: dict[str, int] = {}
        self.loaded: dict[str, int] = {}
        self.jobs: list[tuple[str, str, bool, int]] = []
        self.finished_requests = 0

    @hookimpl
    def kv_offload_blocks_stored(self, keys: list[bytes], medium: str) -> None:
        self.stored[medium] = self.stored.get(medium, 0) + len(keys)

    @hookimpl
    def kv_offload_blocks_evicted(self, keys: list[bytes], medium: str) -> None:
        self.evicted[medium] = self.evicted.get(medium, 0) + len(keys)

    @hookimpl
    def kv_offload_blocks_loaded(self, keys: list[bytes], medium: str) -> None:
        self.loaded[medium] = self.loaded.get(medium, 0) + len(keys)

    @hookimpl
    def kv_offload_tier_job_finished(
        self, tier: str, direction: str, success: bool, nbytes: int
    ) -> None:
        self.jobs.append((tier, direction, success, nbytes))

    @hookimpl
    def kv_offload_request_finished(self) -> None:
        self.finished_requests += 1

    def job_bytes(self, tier: str, direction: str) -> int:
        return sum(n for t, d, ok, n in self.jobs if (t, d, ok) == (tier, direction, True))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    plugin = Recorder()
    get_plugin_manager().register(plugin)
    yield plugin
    get_plugin_manager().unregister(plugin)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny-llama"))


def start(model_dir: Path, config: dict[str, Any], *, gpu_blocks: int) -> Engine:
    return Engine(cli_args(model_dir, config, block_size=GPU_BLOCK_TOKENS, gpu_blocks=gpu_blocks))


def shut_down(engine: Engine) -> None:
    """vLLM's shutdown leaves nothing of this engine in /dev/shm."""
    engine_id = engine.vllm_config.kv_transfer_config.engine_id
    engine.shutdown()
    assert not glob.glob(f"/dev/shm/vllm_offload_{engine_id}*")


def prompts(seed: int, count: int, tokens: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 32000) for _ in range(tokens)] for _ in range(count)]


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_serves_a_prefix_from_the_cpu_tier(
    policy: str, model_dir: Path, recorder: Recorder
) -> None:
    """The README's policy block (offloaded blocks of ``block_size`` tokens) with each shipped
    policy: a prefix pushed out of the GPU prefix cache comes back from the CPU tier, with its
    bytes; overflowing the CPU tier evicts through the policy."""
    config = readme_config(tier=None)
    extra = config["kv_connector_extra_config"]
    extra["eviction_policy"] = policy
    chunk_tokens = extra["block_size"]
    chunk_bytes = chunk_tokens // GPU_BLOCK_TOKENS * BLOCK_BYTES
    extra["cpu_bytes_to_use"] = 16 * chunk_bytes  # 16 offloaded blocks
    engine = start(model_dir, config, gpu_blocks=8 * chunk_tokens // GPU_BLOCK_TOKENS)
    # vLLM's own manager, running the kv-offload policy
    assert type(engine.manager).__name__ == "CPUOffloadingManager"
    assert engine.manager._policy.cache_policy_name == policy
    try:
        (shared,) = prompts(0, 1, 2 * chunk_tokens)
        engine.serve("a", [*shared, 1, 2, 3])
        for i, filler in enumerate(prompts(1, 5, 2 * chunk_tokens + 3)):
            engine.serve(f"fill-{i}", filler)  # 5 x 2 blocks: "a" leaves the GPU, not the CPU
        assert engine.totals.connector_hit_tokens == 0
        checked, idle = engine.checked_blocks, engine.totals.idle_steps
        engine.serve("b", [*shared, 4, 5])
        t = engine.totals
        assert t.idle_steps - idle == 2  # an async load: vLLM waits for it, then its report
        assert t.connector_hit_tokens == 2 * chunk_tokens
        assert t.hits_by_source == {"host": 2 * chunk_tokens}  # vLLM's hit-source metric
        # every GPU block of the prefix was loaded and read with the right bytes
        assert engine.checked_blocks - checked == 2 * chunk_tokens // GPU_BLOCK_TOKENS
        assert recorder.stored["CPU"] == 12 and not recorder.evicted

        for i, filler in enumerate(prompts(2, 6, 2 * chunk_tokens + 3)):
            engine.serve(f"more-{i}", filler)  # 12 more blocks into 16: 8 evicted
        assert recorder.stored["CPU"] == 24
        assert recorder.evicted == {"CPU": 8}
        assert recorder.finished_requests == 13
        assert t.finished == 13
    finally:
        shut_down(engine)


def test_a_corrupted_block_is_caught(model_dir: Path) -> None:
    """The byte check above can fail: a CPU-tier row changed after its store is found when
    the prefix is loaded back."""
    config = readme_config(tier=None)
    extra = config["kv_connector_extra_config"]
    chunk_tokens = extra["block_size"]
    extra["cpu_bytes_to_use"] = 16 * chunk_tokens // GPU_BLOCK_TOKENS * BLOCK_BYTES
    engine = start(model_dir, config, gpu_blocks=8 * chunk_tokens // GPU_BLOCK_TOKENS)
    try:
        (shared,) = prompts(0, 1, 2 * chunk_tokens)
        engine.serve("a", [*shared, 1])
        for i, filler in enumerate(prompts(1, 5, 2 * chunk_tokens + 3)):
            engine.serve(f"fill-{i}", filler)
        assert engine._cpu is not None
        for row in engine._cpu.own.values():
            row[100] ^= 0xFF
        with pytest.raises(WrongBytes, match=r"request b: block 0 .* does not hold"):
            engine.serve("b", [*shared, 2])
    finally:
        shut_down(engine)


def tier_engine(model_dir: Path, tier: str, **replace: Any) -> Engine:
    """The README's block for ``tier`` with a 32-block CPU tier and a 64-block GPU."""
    config = readme_config(tier=tier)
    extra = config["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = 32 * BLOCK_BYTES
    extra["secondary_tiers"][0].update(replace)
    return start(model_dir, config, gpu_blocks=64)


def push_out_and_return(engine: Engine, tier: str, recorder: Recorder) -> None:
    """A 20-block prefix pushed out of the GPU and the 32-block CPU tier comes back from
    ``tier``, byte for byte; the hook plugin saw the cascades and the promotion, with the
    bytes vLLM's own tier metrics count."""
    (shared,) = prompts(10, 1, 20 * GPU_BLOCK_TOKENS)
    engine.serve("a", [*shared, 1, 2, 3, 4, 5])
    for i, filler in enumerate(prompts(11, 4, 20 * GPU_BLOCK_TOKENS + 3)):
        engine.serve(f"fill-{i}", filler)  # 80 blocks more: "a" leaves the GPU and the CPU
    t = engine.totals
    assert t.connector_hit_tokens == 0
    assert recorder.evicted["CPU"] >= 20
    checked, idle = engine.checked_blocks, t.idle_steps
    engine.serve("b", [*shared, 6, 7])
    # vLLM held "b" back while the promotion ran (lookup: not yet), then for the async load
    # of the hit from the CPU tier (two steps, as in the policy test)
    assert t.idle_steps - idle >= 3
    assert t.connector_hit_tokens == 20 * GPU_BLOCK_TOKENS
    assert t.hits_by_source == {"disk": 20 * GPU_BLOCK_TOKENS}  # a storage tier's hit
    assert engine.checked_blocks - checked == 20  # the prefix, promoted and loaded, read back
    assert recorder.loaded[tier] == 20
    # the hook plugin and vLLM's metrics agree on the bytes each way
    label = f"1:{tier}"
    assert recorder.job_bytes(tier, "load") == 20 * BLOCK_BYTES
    assert t.counter("vllm:kv_offload_tiering_read_bytes", label) == 20 * BLOCK_BYTES
    assert recorder.job_bytes(tier, "store") >= 100 * BLOCK_BYTES
    assert recorder.job_bytes(tier, "store") == t.counter(
        "vllm:kv_offload_tiering_write_bytes", label
    )
    assert t.counter("vllm:kv_offload_tiering_chunk_hits", label) == 20
    assert not [job for job in recorder.jobs if not job[2]]


def test_example_tier_serves_a_prefix_pushed_out_of_the_cpu_tier(
    model_dir: Path, recorder: Recorder
) -> None:
    engine = tier_engine(model_dir, "kvo_example")
    try:
        push_out_and_return(engine, "kvo_example", recorder)
    finally:
        shut_down(engine)


def test_fs_tier_serves_a_prefix_and_a_restarted_engine_serves_it_again(
    model_dir: Path, tmp_path: Path, recorder: Recorder
) -> None:
    pytest.importorskip("kv_offload_fs_tier")
    root = tmp_path / "kv-cache"
    engine = tier_engine(model_dir, "kvo_fs", root_dir=str(root))
    try:
        push_out_and_return(engine, "kvo_fs", recorder)
    finally:
        shut_down(engine)
    assert len([p for p in root.rglob("*") if p.is_file()]) >= 100  # the blocks, on disk

    # A new engine over the same directory: the prefix comes from disk at once.
    again = tier_engine(model_dir, "kvo_fs", root_dir=str(root))
    try:
        (shared,) = prompts(10, 1, 20 * GPU_BLOCK_TOKENS)
        again.serve("c", [*shared, 8])
        assert again.totals.hits_by_source == {"disk": 20 * GPU_BLOCK_TOKENS}
        assert again.checked_blocks == 20
    finally:
        shut_down(again)


def test_redis_tier_serves_a_prefix_pushed_out_of_the_cpu_tier(
    model_dir: Path, tmp_path: Path, recorder: Recorder
) -> None:
    pytest.importorskip("kv_offload_redis_tier")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "redis_tier"))
    try:
        from _redis_servers import RedisServer
    finally:
        sys.path.pop(0)
    server = RedisServer(tmp_path / "redis")
    try:
        engine = tier_engine(model_dir, "kvo_redis", url=server.url())
        try:
            push_out_and_return(engine, "kvo_redis", recorder)
        finally:
            shut_down(engine)
        client = server.client()
        try:
            assert client.dbsize() >= 100  # the cascaded blocks are in the server
        finally:
            client.close()
    finally:
        server.stop()
