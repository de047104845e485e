"""Old import path of the hook plugin manager; it lives in :mod:`kv_offload.plugins.loading`
(kept for modules not yet moved to the new layout)."""

from __future__ import annotations

from .plugins.loading import (
    ALLOW_ENV,
    AUTOLOAD_DISABLE_ENV,
    BLOCK_ENV,
    HOOK_ENTRY_POINT_GROUP,
    KVOffloadPluginManager,
    create_plugin_manager,
    get_plugin_manager,
)
from .plugins.settings import configure_plugin, parse_plugin_settings, takes_settings

__all__ = [
    "ALLOW_ENV",
    "AUTOLOAD_DISABLE_ENV",
    "BLOCK_ENV",
    "HOOK_ENTRY_POINT_GROUP",
    "KVOffloadPluginManager",
    "configure_plugin",
    "create_plugin_manager",
    "parse_plugin_settings",
    "takes_settings",
    "get_plugin_manager",
]
