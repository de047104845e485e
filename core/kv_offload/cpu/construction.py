"""What a CPU manager is built from: the checked size, the policy plugin, its callbacks, and
the hook plugin manager. Kept apart from the manager so its class holds only the block state
and what changes it."""

from __future__ import annotations

from typing import Any

from ..buffer import CPUKVBuffer
from ..errors import ConfigError, InvalidArgumentError
from ..plugins.construct import construct
from ..plugins.dispatch import HookCallers
from ..plugins.loading import KVOffloadPluginManager, get_plugin_manager, register_if_hookimpl
from ..policies import CachePolicy, CachePolicyFactory

__all__ = ["build_policy", "check_num_blocks", "overridden", "plugin_setup"]


def check_num_blocks(num_blocks: Any, kv_buffer: CPUKVBuffer | None) -> None:
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
        raise ConfigError(
            f"num_blocks must be an int, got {type(num_blocks).__name__} {num_blocks!r}"
        )
    if num_blocks <= 0:
        raise ConfigError(f"num_blocks must be > 0 (CPU cache size in blocks), got {num_blocks}")
    # Rows past num_blocks are not the cache's: an owner may use them (cpu/handover.py).
    if kv_buffer is not None and kv_buffer.num_blocks < num_blocks:
        raise ConfigError(
            f"kv_buffer has {kv_buffer.num_blocks} rows but num_blocks is {num_blocks}"
        )


def build_policy(name: str, module_path: str | None, num_blocks: int) -> CachePolicy:
    """The policy plugin called ``name``, sized for ``num_blocks``."""
    policy_cls = CachePolicyFactory.get_cache_policy_cls(name, module_path)
    return construct("policy", name, policy_cls, cache_capacity=num_blocks)


def overridden(policy: CachePolicy, name: str) -> Any:
    """The policy's bound method ``name``, or ``None`` if it is the base class's no-op (the
    manager then skips the call altogether)."""
    if getattr(type(policy), name) is getattr(CachePolicy, name):
        return None
    return getattr(policy, name)


def plugin_setup(
    plugin_manager: KVOffloadPluginManager | None, policy: CachePolicy
) -> tuple[KVOffloadPluginManager, HookCallers, list[Any]]:
    """The plugin manager (the process-wide one by default), its hook callers, and the
    policy registered as a hook plugin if it carries hookimpls."""
    if plugin_manager is not None and not isinstance(plugin_manager, KVOffloadPluginManager):
        raise InvalidArgumentError(
            f"plugin_manager must be a KVOffloadPluginManager "
            f"(kv_offload.plugins.create_plugin_manager()), got {type(plugin_manager).__name__}"
        )
    pm = plugin_manager if plugin_manager is not None else get_plugin_manager()
    return pm, HookCallers(pm), register_if_hookimpl(pm, policy)
