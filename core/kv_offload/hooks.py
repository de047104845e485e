"""The plugin manager that carries lifecycle hooks, and how hook plugins are found.

Hook plugins come from three places:

* the ``kv_offload.hooks`` entry-point group, loaded when a plugin manager is created with
  ``autoload=True`` (the default manager is). ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD=1`` turns
  autoload off; ``KV_OFFLOAD_PLUGINS=a,b`` loads only the named plugins;
  ``KV_OFFLOAD_BLOCK_PLUGINS=a,b`` never loads (never imports) the named ones;
* :meth:`KVOffloadPluginManager.register` at run time;
* the policy and tier instances of a manager, when they carry hookimpls.

A hook plugin with settings (a ``[hooks.<name>]`` config table) gives its entry-point object
two functions, found by name: ``parse_settings(table) -> settings`` checks the table without
side effects (``kv-offload validate`` runs it) and ``create_plugin(settings) -> plugin`` builds
the object that is registered under the entry-point name, once per plugin manager, so two
stacks get two instances. Both raise :class:`~kv_offload.errors.ConfigError` naming the
setting. Without a table, ``parse_settings({})`` gives the defaults.

Pass a plugin manager to a manager with ``plugin_manager=``; without one, managers share the
process-wide :func:`get_plugin_manager`.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import (
    ConfigError,
    HookError,
    KVOffloadError,
    PluginError,
    PluginImportError,
    PluginSettingsError,
    PluginValidationError,
)
from .plugins import dist_label

__all__ = [
    "AUTOLOAD_DISABLE_ENV",
    "ALLOW_ENV",
    "BLOCK_ENV",
    "HOOK_ENTRY_POINT_GROUP",
    "HookCallers",
    "KVOffloadPluginManager",
    "configure_plugin",
    "parse_plugin_settings",
    "takes_settings",
    "register_if_hookimpl",
    "create_plugin_manager",
    "get_plugin_manager",
]

HOOK_ENTRY_POINT_GROUP = "kv_offload.hooks"
AUTOLOAD_DISABLE_ENV = "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_ENV = "KV_OFFLOAD_PLUGINS"
BLOCK_ENV = "KV_OFFLOAD_BLOCK_PLUGINS"

#: Hook names without the ``kv_offload_`` prefix, as :class:`HookCallers` attributes.
HOOK_NAMES = tuple(
    name.removeprefix("kv_offload_") for name in dir(hookspecs) if name.startswith("kv_offload_")
)


def _names(value: str | None) -> set[str]:
    return {part for part in re.split(r"[,\s]+", value or "") if part}


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


class KVOffloadPluginManager(pluggy.PluginManager):
    """pluggy's manager for project ``kv_offload`` that tells subscribers when plugins change,
    so managers can cache "nobody implements this hook" and skip it at no cost."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self._subscribers: list[weakref.WeakMethod[Callable[[], None]]] = []

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call the bound method ``callback`` after every (un)registration (weakly held)."""
        self._subscribers.append(weakref.WeakMethod(callback))

    def _changed(self) -> None:
        alive = []
        for ref in self._subscribers:
            callback = ref()
            if callback is not None:
                alive.append(ref)
                callback()
        self._subscribers = alive

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register a hook plugin; unknown hook names or arguments are rejected here."""
        try:
            registered = super().register(plugin, name)
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            if self.is_registered(plugin):
                super().unregister(plugin)
            label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
            raise PluginValidationError(
                f"hook plugin {label!r} is invalid: {exc}; hook names are "
                f"{', '.join('kv_offload_' + n for n in HOOK_NAMES)} (see kv_offload.hookspecs)",
                kind="hook",
                plugin=label,
            ) from exc
        self._changed()
        return registered

    def unregister(self, plugin: Any | None = None, name: str | None = None) -> Any | None:
        removed = super().unregister(plugin, name)
        self._changed()
        return removed

    def set_blocked(self, name: str) -> None:
        super().set_blocked(name)
        self._changed()

    def load_entry_points(
        self,
        allow: Iterable[str] | None = None,
        block: Iterable[str] = (),
        settings: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Register the ``kv_offload.hooks`` plugins; returns the names loaded.

        ``allow`` (if given) limits which names load; ``block`` names are never imported;
        ``settings`` maps a plugin name to its ``[hooks.<name>]`` table.
        """
        allowed = set(allow) if allow is not None else None
        blocked = set(block)
        loaded = []
        for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP):
            if ep.name in blocked or (allowed is not None and ep.name not in allowed):
                continue
            if self.get_plugin(ep.name) is not None or self.is_blocked(ep.name):
                continue
            dist = dist_label(ep)
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginImportError(
                    f"hook plugin {ep.name!r} from distribution {dist} failed to import "
                    f"({ep.value}): {type(exc).__name__}: {exc}; fix or uninstall it, or "
                    f"skip it with {BLOCK_ENV}={ep.name}",
                    kind="hook",
                    plugin=ep.name,
                ) from exc
            plugin = configure_plugin(ep.name, plugin, (settings or {}).get(ep.name))
            self.register(plugin, name=ep.name)
            loaded.append(ep.name)
        return loaded


def create_plugin_manager(
    autoload: bool = True,
    allow: Iterable[str] | None = None,
    block: Iterable[str] = (),
    plugins: Iterable[Any] = (),
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> KVOffloadPluginManager:
    """A new plugin manager; entry points load unless ``autoload`` is false or the
    ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` environment variable is set. ``allow``/``block``
    add to ``KV_OFFLOAD_PLUGINS``/``KV_OFFLOAD_BLOCK_PLUGINS``; ``settings`` holds the
    ``[hooks.<name>]`` tables of plugins that take settings."""
    pm = KVOffloadPluginManager()
    blocked = set(block) | _names(os.environ.get(BLOCK_ENV))
    for name in blocked:
        pm.set_blocked(name)
    env_allow = _names(os.environ.get(ALLOW_ENV))
    allowed: set[str] | None = None
    if allow is not None or env_allow:
        allowed = set(allow or ()) | env_allow
    if autoload and not os.environ.get(AUTOLOAD_DISABLE_ENV):
        pm.load_entry_points(allowed, blocked, settings)
    for plugin in plugins:
        pm.register(plugin)
    return pm


_default: KVOffloadPluginManager | None = None


def get_plugin_manager() -> KVOffloadPluginManager:
    """The process-wide plugin manager (created with autoload on first use)."""
    global _default
    if _default is None:
        _default = create_plugin_manager()
    return _default


def register_if_hookimpl(pm: KVOffloadPluginManager, plugin: Any) -> list[Any]:
    """Register a policy or tier instance that carries hookimpls; returns what was registered.

    The instance then sees every event of the plugin manager it joins; its ``manager``
    argument tells which manager fired.
    """
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    if any(hasattr(getattr(type(plugin), name, None), marker) for name in dir(type(plugin))):
        pm.register(plugin, name=f"{type(plugin).__qualname__}@{id(plugin):x}")
        return [plugin]
    return []


def _plugin_of(pm: pluggy.PluginManager, caller: Any, exc: BaseException) -> str:
    """The name of the plugin whose hookimpl raised ``exc`` (found in its traceback).

    Instances of one class share their methods' code, so a method's frame must also have the
    plugin instance as its first argument.
    """
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for impl in caller.get_hookimpls():
        code = getattr(impl.function, "__code__", None)
        owner = getattr(impl.function, "__self__", None)
        for frame in frames:
            if frame.f_code is not code:
                continue
            if owner is None or (
                code.co_argcount and frame.f_locals.get(code.co_varnames[0]) is owner
            ):
                return str(impl.plugin_name)
    return "<unknown plugin>"


def _hook_error(pm: pluggy.PluginManager, caller: Any, exc: Exception) -> HookError:
    plugin = _plugin_of(pm, caller, exc)
    return HookError(
        f"hook plugin {plugin!r} raised in {caller.name}: {type(exc).__name__}: {exc}",
        kind="hook",
        plugin=plugin,
    )


def _dispatcher(pm: pluggy.PluginManager, caller: Any) -> Any:
    """A function that runs every hookimpl of ``caller`` and turns a plugin's exception into
    :class:`HookError` naming it; compiled whenever the plugin set changes.

    It calls the impls directly, in pluggy's order and with pluggy's semantics (each impl gets
    only the arguments it names; ``firstresult`` stops at the first non-``None``). pluggy's
    generic ``HookCaller.__call__`` re-checks and repacks arguments and runs a general loop on
    every event, about ten times the cost of the plugin call itself, and events fire several
    times per request. Wrappers (``hookwrapper``/``wrapper``) need pluggy's loop, so a hook
    with one keeps pluggy's caller inside the error handling.
    """
    impls = caller.get_hookimpls()
    argnames = ", ".join(caller.spec.argnames)
    namespace: dict[str, Any] = {"_caller": caller, "_error": _hook_error, "_pm": pm}
    lines = [f"def dispatch(*, {argnames}):", "    try:"]
    if any(impl.hookwrapper or getattr(impl, "wrapper", False) for impl in impls):
        keywords = ", ".join(f"{name}={name}" for name in caller.spec.argnames)
        lines.append(f"        return _caller({keywords})")
    else:
        firstresult = bool(caller.spec.opts.get("firstresult"))
        for index, impl in enumerate(reversed(impls)):  # pluggy calls the last registered first
            namespace[f"_impl{index}"] = impl.function
            call = f"_impl{index}({', '.join(impl.argnames)})"
            if firstresult:
                lines += [
                    f"        result = {call}",
                    "        if result is not None:",
                    "            return result",
                ]
            else:
                lines.append(f"        {call}")
        lines.append("        return None")
    lines += ["    except Exception as exc:", "        raise _error(_pm, _caller, exc) from exc"]
    exec("\n".join(lines), namespace)  # the source is built from identifiers only
    dispatch = namespace["dispatch"]
    dispatch.caller = caller
    return dispatch


class HookCallers:
    """One manager's view of the hooks: ``callers.blocks_stored`` is a function firing
    ``kv_offload_blocks_stored`` (keyword arguments; raises :class:`HookError`) when a plugin
    implements it, else ``None``. Managers test for ``None`` on the hot path, so hooks nobody
    implements cost one attribute read."""

    request_started: Any
    request_finished: Any
    blocks_stored: Any
    blocks_loaded: Any
    blocks_evicted: Any
    store_failed: Any
    tier_job_finished: Any
    cache_reset: Any
    shutdown: Any
    store_admission: Any

    def __init__(self, pm: KVOffloadPluginManager) -> None:
        self.plugin_manager = pm
        self.refresh()
        pm.subscribe(self.refresh)

    def refresh(self) -> None:
        hook = self.plugin_manager.hook
        for name in HOOK_NAMES:
            caller = getattr(hook, "kv_offload_" + name)
            dispatch = _dispatcher(self.plugin_manager, caller) if caller.get_hookimpls() else None
            setattr(self, name, dispatch)
