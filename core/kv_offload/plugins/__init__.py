"""Plugins of every kind: name resolution (``registry``), the lifecycle hooks (``hookspecs``),
the plugin manager and how hook plugins are found (``loading``), and how managers fire hooks
(``dispatch``)."""

from __future__ import annotations

from . import hookspecs
from .hookspecs import hookimpl, hookspec
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
)
from .registry import ExperimentalPluginWarning, PluginInfo
from .settings import parse_plugin_settings, takes_settings

#: The hook author's API (docs/plugin-guide.md, "Plugin-author API"). The other names this
#: package defines (registries, dispatch) serve the core and are not promised to plugins.
__all__ = [
    "ALLOW_ENV",
    "AUTOLOAD_DISABLE_ENV",
    "BLOCK_ENV",
    "BrokenPluginWarning",
    "ExperimentalPluginWarning",
    "HOOK_ENTRY_POINT_GROUP",
    "HOOK_NAMES",
    "KVOffloadPluginManager",
    "PluginInfo",
    "create_plugin_manager",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "hookspecs",
    "parse_plugin_settings",
    "takes_settings",
]
