"""Plugins of every kind: name resolution (``registry``), the lifecycle hooks (``hookspecs``),
the plugin manager and how hook plugins are found (``loading``), and how managers fire hooks
(``dispatch``)."""

from __future__ import annotations

from . import hookspecs
from .dispatch import HookCallers, HookErrorLog
from .loading import (
    ALLOW_ENV,
    AUTOLOAD_DISABLE_ENV,
    BLOCK_ENV,
    HOOK_ENTRY_POINT_GROUP,
    HOOK_NAMES,
    BrokenPluginWarning,
    KVOffloadPluginManager,
    create_plugin_manager,
    get_plugin_manager,
    register_if_hookimpl,
)
from .registry import (
    KNOWN_DISTRIBUTIONS,
    ExperimentalPluginWarning,
    PluginInfo,
    PluginRegistry,
    dist_label,
)
from .settings import configure_plugin, parse_plugin_settings, takes_settings

__all__ = [
    "ALLOW_ENV",
    "AUTOLOAD_DISABLE_ENV",
    "BLOCK_ENV",
    "BrokenPluginWarning",
    "ExperimentalPluginWarning",
    "HOOK_ENTRY_POINT_GROUP",
    "HOOK_NAMES",
    "HookCallers",
    "HookErrorLog",
    "KNOWN_DISTRIBUTIONS",
    "KVOffloadPluginManager",
    "PluginInfo",
    "PluginRegistry",
    "configure_plugin",
    "create_plugin_manager",
    "dist_label",
    "get_plugin_manager",
    "hookspecs",
    "parse_plugin_settings",
    "register_if_hookimpl",
    "takes_settings",
]
