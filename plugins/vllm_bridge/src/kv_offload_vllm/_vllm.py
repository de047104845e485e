"""The few vLLM 0.33 names the adapters need, imported on first use only.

kv-offload-vllm installs and imports without vLLM; this module is the one place that imports
it, through :func:`importlib.import_module` so type checkers of projects without vLLM see no
missing import. A vLLM outside the supported series is refused with the pin to install.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kv_offload import ConfigError

__all__ = ["SUPPORTED_VLLM", "VLLMApi", "vllm_api"]

#: The vLLM release series whose interfaces the adapters implement (the extra's pin).
SUPPORTED_VLLM = "0.33"


@dataclass(frozen=True)
class VLLMApi:
    """vLLM's classes the adapters subclass or build, as one bundle."""

    version: str
    CachePolicy: Any
    SecondaryTierManager: Any
    TransferJob: Any
    JobResult: Any
    LookupResult: Any
    Medium: Any
    Locality: Any
    RequestOffloadingContext: Any
    CacheHitSource: Any


def _installed_version() -> str | None:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def vllm_api() -> VLLMApi:
    """Import vLLM's offloading interfaces, or raise a :class:`ConfigError` saying what to
    install."""
    version = _installed_version()
    if version is not None and not (
        version == SUPPORTED_VLLM or version.startswith(SUPPORTED_VLLM + ".")
    ):
        raise ConfigError(
            f"kv-offload-vllm supports vLLM {SUPPORTED_VLLM}.x, but vLLM {version} is "
            f"installed; install 'kv-offload-vllm[vllm]' (vllm=={SUPPORTED_VLLM}.*)"
        )
    try:
        base = importlib.import_module("vllm.v1.kv_offload.base")
        policies = importlib.import_module("vllm.v1.kv_offload.cpu.policies.base")
        tiering = importlib.import_module("vllm.v1.kv_offload.tiering.base")
        hit_source = importlib.import_module("vllm.v1.metrics.cache_hit_source")
    except ImportError as exc:
        raise ConfigError(
            f"kv-offload-vllm needs vLLM {SUPPORTED_VLLM}.x to bridge kv-offload plugins into "
            f"vLLM, and importing it failed ({type(exc).__name__}: {exc}); install "
            f"'kv-offload-vllm[vllm]'"
        ) from exc
    return VLLMApi(
        version=version or "unknown",
        CachePolicy=policies.CachePolicy,
        SecondaryTierManager=tiering.SecondaryTierManager,
        TransferJob=tiering.TransferJob,
        JobResult=tiering.JobResult,
        LookupResult=base.LookupResult,
        Medium=base.Medium,
        Locality=base.Locality,
        RequestOffloadingContext=base.RequestOffloadingContext,
        CacheHitSource=hit_source.CacheHitSource,
    )
