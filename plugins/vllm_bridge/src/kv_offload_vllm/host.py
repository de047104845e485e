"""KV offloading on vLLM's CPU platform: ``spec_module_path`` ``kv_offload_vllm.host``.

vLLM's ``OffloadingConnector`` refuses its own CPU platform: ``CPUOffloadingSpec.get_worker``
raises there, and its worker copies with CUDA streams. The two specs here are vLLM's
``CPUOffloadingSpec`` and ``TieringOffloadingSpec`` with one difference: on the CPU platform
their worker is :mod:`kv_offload_vllm.host_worker`'s, which copies between vLLM's cache and
the offload buffer in host memory. On CUDA-alike and XPU platforms they are vLLM's specs,
worker included. Everything scheduler-side (``eviction_policy`` and
``cache_policy_module_path``, ``secondary_tiers``, ``store_threshold``, ``cpu_bytes_to_use``,
``block_size``, ...) is vLLM's own code, so every key means what it means for vLLM's specs,
bridged kv-offload policies and tiers included. In ``kv_connector_extra_config``::

    "spec_module_path": "kv_offload_vllm.host",
    "spec_name": "HostOffloadingSpec",         # or "HostTieringOffloadingSpec"

The names ``HostOffloadingSpec`` and ``HostTieringOffloadingSpec`` are a stable interface.
Importing this module does not import vLLM; asking for a spec class does.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from kv_offload.errors import ConfigError

from .compat import vllm_api
from .host_worker import host_worker

__all__ = ["HOST_SPEC_MODULE_PATH", "HostOffloadingSpec", "HostTieringOffloadingSpec"]

#: ``spec_module_path`` of the host specs.
HOST_SPEC_MODULE_PATH = "kv_offload_vllm.host"
_SPEC_NAMES = ("HostOffloadingSpec", "HostTieringOffloadingSpec")

if TYPE_CHECKING:  # built on first access by __getattr__ (they subclass vLLM's specs)
    HostOffloadingSpec: type
    HostTieringOffloadingSpec: type


def __getattr__(attribute: str) -> Any:
    if attribute in _SPEC_NAMES:
        return _host_specs()[attribute]
    raise AttributeError(
        f"module {__name__!r} has no attribute {attribute!r}; its offloading specs are "
        f"{', '.join(_SPEC_NAMES)}"
    )


def _on_device() -> bool:
    """Whether vLLM runs on a platform its own offload worker serves (CUDA-alike, XPU)."""
    platform = importlib.import_module("vllm.platforms").current_platform
    return bool(platform.is_cuda_alike() or platform.is_xpu())


@functools.cache
def _host_specs() -> dict[str, type]:
    """Build the spec classes on first use (they subclass vLLM's)."""
    vllm_api()  # refuses an unsupported vLLM with the releases to install
    cpu_spec: Any = importlib.import_module("vllm.v1.kv_offload.cpu.spec").CPUOffloadingSpec
    tiering_spec: Any = importlib.import_module(
        "vllm.v1.kv_offload.tiering.spec"
    ).TieringOffloadingSpec
    region: Any = importlib.import_module("vllm.v1.kv_offload.cpu.shared_offload_region")

    class HostOffloadingSpec(cpu_spec):  # type: ignore[misc]
        """vLLM's ``CPUOffloadingSpec`` (a CPU tier only), also on vLLM's CPU platform,
        where the offload buffer is a private tensor of ``cpu_bytes_to_use`` bytes."""

        _worker: Any

        def get_worker(self, kv_caches: Any) -> Any:
            if _on_device():
                return super().get_worker(kv_caches)
            if self._worker is None:
                self._worker = host_worker(kv_caches, self.blocks_per_chunk, self.num_chunks)
            return self._worker

    class HostTieringOffloadingSpec(tiering_spec):  # type: ignore[misc]
        """vLLM's ``TieringOffloadingSpec`` (a CPU tier with ``secondary_tiers`` behind it),
        also on vLLM's CPU platform. The offload buffer is this worker's share of vLLM's
        shared offload region, which the scheduler's tiers read stores from and write
        promotions into, made as vLLM's tiering worker makes it."""

        _worker: Any

        def get_worker(self, kv_caches: Any) -> Any:
            if _on_device():
                return super().get_worker(kv_caches)
            if self._worker is None:
                if self.config.canonical_layout:
                    raise ConfigError(
                        "canonical_layout is not supported by HostTieringOffloadingSpec on "
                        "vLLM's CPU platform; remove it from kv_connector_extra_config"
                    )
                shared = region.SharedOffloadRegion(
                    engine_id=self._engine_id,
                    num_chunks=self.num_chunks,
                    rank=0 if self.replicated_layout else self.config.parallel.rank,
                    kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                    cpu_page_size=self.cpu_page_size_per_worker,
                )
                self._worker = host_worker(
                    kv_caches, self.blocks_per_chunk, self.num_chunks, shared
                )
            return self._worker

    return {
        "HostOffloadingSpec": HostOffloadingSpec,
        "HostTieringOffloadingSpec": HostTieringOffloadingSpec,
    }
