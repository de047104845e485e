"""Run installed kv-offload policies and tiers inside vLLM's own offloading managers, on every
release in :data:`SUPPORTED_VLLM` (their differences: :mod:`kv_offload_vllm.compat`).

In ``kv_connector_extra_config``::

    "eviction_policy": "kvo_arc",
    "cache_policy_module_path": "kv_offload_vllm.policies",
    "secondary_tiers": [{"type": "kvo_example", "module_path": "kv_offload_vllm.tiers"}],

``kvo_<name>`` is the kv-offload plugin ``<name>`` (the prefix keeps vLLM's factories, which
check their own registry first, from picking their built-in ``arc`` or ``example``). Importing
this package does not import vLLM; asking for a bridged class does.
"""

from __future__ import annotations

from ._common import PREFIX
from .compat import SUPPORTED_VLLM
from .policy_adapter import policy_adapter
from .tier_adapter import tier_adapter

__all__ = [
    "POLICY_MODULE_PATH",
    "PREFIX",
    "SUPPORTED_VLLM",
    "TIER_MODULE_PATH",
    "policy_adapter",
    "tier_adapter",
]

#: ``cache_policy_module_path`` for bridged policies.
POLICY_MODULE_PATH = "kv_offload_vllm.policies"
#: ``module_path`` of a bridged secondary tier's config.
TIER_MODULE_PATH = "kv_offload_vllm.tiers"
