"""``kv_transfer_config`` values of the real-engine tests, as a user writes them."""

from __future__ import annotations

from typing import Any

#: One offloaded chunk is 64 KiB per 32-token block (see _tiny_llama): 4 MiB is 64 blocks,
#: fewer than the workloads' prompts take, so the CPU tier evicts.
CPU_BYTES = 4 * 1024 * 1024


def host_spec(
    policy: str = "kvo_lru", *, cpu_bytes: int = CPU_BYTES, **extra: Any
) -> dict[str, Any]:
    """``HostOffloadingSpec``: a CPU tier only. ``policy`` is ``kvo_<name>`` (bridged) or
    one of vLLM's own (``lru``, ``arc``)."""
    config: dict[str, Any] = {
        "spec_module_path": "kv_offload_vllm.host",
        "spec_name": "HostOffloadingSpec",
        "cpu_bytes_to_use": cpu_bytes,
        "eviction_policy": policy,
        **extra,
    }
    if policy.startswith("kvo_"):
        config["cache_policy_module_path"] = "kv_offload_vllm.policies"
    return _connector(config)


def tiering_spec(
    *tiers: dict[str, Any],
    policy: str = "kvo_lru",
    cpu_bytes: int = CPU_BYTES,
    **extra: Any,
) -> dict[str, Any]:
    """``HostTieringOffloadingSpec``: a CPU tier with ``tiers`` (bridged: ``type`` is
    ``kvo_<name>``) behind it."""
    config = host_spec(policy, cpu_bytes=cpu_bytes, **extra)["kv_connector_extra_config"]
    config["spec_name"] = "HostTieringOffloadingSpec"
    config["secondary_tiers"] = [{"module_path": "kv_offload_vllm.tiers", **t} for t in tiers]
    return _connector(config)


def _connector(extra_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra_config,
    }
