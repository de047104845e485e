"""Resolve a cache-policy name to its class (vLLM's ``CachePolicyFactory`` interface)."""

from __future__ import annotations

from ..plugins.registry import PluginInfo, PluginRegistry
from .base import CachePolicy

__all__ = ["CachePolicyFactory", "POLICY_ENTRY_POINT_GROUP"]

POLICY_ENTRY_POINT_GROUP = "kv_offload.policies"

_registry: PluginRegistry[CachePolicy] = PluginRegistry(
    "policy",
    POLICY_ENTRY_POINT_GROUP,
    CachePolicy,  # type: ignore[type-abstract]  # only used for issubclass checks
    "cache_policy_module_path",
)


class CachePolicyFactory:
    """Policies by name: runtime registrations, then installed ``kv_offload.policies`` entry
    points, then ``module_path``. Built-in policies are ordinary installed plugins."""

    registry = _registry

    @classmethod
    def register_cache_policy(cls, name: str, module_path: str, class_name: str) -> None:
        """Register ``name`` -> ``module_path:class_name`` (imported on first use)."""
        _registry.register(name, module_path, class_name)

    @classmethod
    def unregister_cache_policy(cls, name: str) -> None:
        _registry.unregister(name)

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type[CachePolicy]:
        """The policy class called ``name``; ``module_path`` is the out-of-tree fallback,
        refused with :class:`~kv_offload.ConfigError` under ``KV_OFFLOAD_ALLOW_MODULE_PATH=0``
        (``CPUOffloadingManager(..., cache_policy_module_path=...)`` comes here)."""
        return _registry.resolve(name, module_path)

    @classmethod
    def available_policies(cls) -> list[PluginInfo]:
        """Registered and installed policies with distribution and version (nothing imported)."""
        return _registry.available()
