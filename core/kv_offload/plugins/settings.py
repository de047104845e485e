"""``[hooks.<name>]`` settings of hook plugins.

A hook plugin with settings gives its entry-point object two functions, found by name:
``parse_settings(table) -> settings`` checks the table without side effects
(``kv-offload validate`` runs it) and ``create_plugin(settings) -> plugin`` builds the object
that is registered under the entry-point name, once per plugin manager, so two stacks get two
instances. Both raise :class:`~kv_offload.errors.ConfigError` naming the setting. Without a
table, ``parse_settings({})`` gives the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, KVOffloadError, PluginError, PluginSettingsError

__all__ = ["configure_plugin", "parse_plugin_settings", "takes_settings"]

#: What a hook plugin's entry-point object defines to take ``[hooks.<name>]`` settings.
SETTINGS_PARSER = "parse_settings"
PLUGIN_FACTORY = "create_plugin"


def takes_settings(plugin: Any) -> bool:
    """Whether a loaded entry-point object follows the settings convention."""
    return callable(getattr(plugin, SETTINGS_PARSER, None)) and callable(
        getattr(plugin, PLUGIN_FACTORY, None)
    )


def _settings_call(name: str, function: Any, argument: Any) -> Any:
    """Call a plugin's settings function; its ConfigError becomes a
    :class:`PluginSettingsError` that names the plugin (config.py locates it file:line)."""
    try:
        return function(argument)
    except ConfigError as exc:
        raise PluginSettingsError(str(exc), kind="hook", plugin=name) from exc
    except KVOffloadError:
        raise
    except Exception as exc:
        raise PluginError(
            f"hook plugin {name!r}: {function.__name__}() raised {type(exc).__name__}: {exc}",
            kind="hook",
            plugin=name,
        ) from exc


def parse_plugin_settings(name: str, plugin: Any, table: Mapping[str, Any] | None) -> Any:
    """The settings ``plugin`` (an entry-point object) parses from ``table`` (``None``: no
    table, the defaults); raises :class:`PluginSettingsError` for a bad table, or for a table
    given to a plugin that takes no settings."""
    if not takes_settings(plugin):
        if table is None:
            return None
        raise PluginSettingsError(
            f"hook plugin {name!r} takes no settings (its entry point defines no "
            f"{SETTINGS_PARSER}/{PLUGIN_FACTORY}); remove the [hooks.{name}] table",
            kind="hook",
            plugin=name,
        )
    return _settings_call(name, getattr(plugin, SETTINGS_PARSER), dict(table or {}))


def configure_plugin(name: str, plugin: Any, table: Mapping[str, Any] | None) -> Any:
    """What to register for the entry point ``name``: the entry-point object itself, or,
    for a plugin that takes settings, the instance its ``create_plugin`` builds."""
    if not takes_settings(plugin):
        parse_plugin_settings(name, plugin, table)  # a table for it is an error
        return plugin
    settings = parse_plugin_settings(name, plugin, table)
    return _settings_call(name, getattr(plugin, PLUGIN_FACTORY), settings)
