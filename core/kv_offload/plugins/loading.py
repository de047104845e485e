"""The plugin manager that carries lifecycle hooks, and how hook plugins are found.

Hook plugins come from three places:

* the ``kv_offload.hooks`` entry-point group, loaded when a plugin manager is created with
  ``autoload=True`` (the default manager is). The environment has the last word over the
  arguments (:mod:`.env`): ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` (a boolean) decides
  autoload; ``KV_OFFLOAD_PLUGINS=a,b`` loads only the named plugins, replacing ``allow=``;
  ``KV_OFFLOAD_BLOCK_PLUGINS=a,b`` never loads (never imports) the named ones;
* :meth:`KVOffloadPluginManager.register` at run time;
* the policy and tier instances of a manager, when they carry hookimpls.

A hook plugin can take ``[hooks.<name>]`` settings (see :mod:`.settings`).

Pass a plugin manager to a manager with ``plugin_manager=``; without one, managers share the
process-wide :func:`get_plugin_manager`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

import pluggy

from ..errors import PluginConflictError, PluginImportError, PluginValidationError
from . import hookspecs
from .env import ALLOW_ENV, API_LABELS, AUTOLOAD_DISABLE_ENV, BLOCK_ENV, hook_env
from .env import EnvironmentOverrideWarning as EnvironmentOverrideWarning
from .registry import dist_label
from .settings import configure_plugin

__all__ = [
    "AUTOLOAD_DISABLE_ENV",
    "ALLOW_ENV",
    "BLOCK_ENV",
    "BrokenPluginWarning",
    "HOOK_ENTRY_POINT_GROUP",
    "HOOK_NAMES",
    "KVOffloadPluginManager",
    "register_if_hookimpl",
    "create_plugin_manager",
    "get_plugin_manager",
]

HOOK_ENTRY_POINT_GROUP = "kv_offload.hooks"

#: Hook names without the ``kv_offload_`` prefix, as :class:`~.dispatch.HookCallers` attributes.
HOOK_NAMES = tuple(
    name.removeprefix("kv_offload_") for name in dir(hookspecs) if name.startswith("kv_offload_")
)


class BrokenPluginWarning(RuntimeWarning):
    """An autoloaded hook plugin failed to import and was skipped; the message names its
    distribution. A plugin the config enables by name fails instead."""


class KVOffloadPluginManager(pluggy.PluginManager):
    """pluggy's manager for project ``kv_offload`` that tells subscribers when plugins change
    or hook-call monitoring is switched on or off, so managers can cache "nobody implements
    this hook" and skip it at no cost, and go through pluggy's own caller while a monitor
    (``add_hookcall_monitoring``, ``enable_tracing``) is watching."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self._subscribers: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._monitors = 0
        #: Autoloaded hook plugins that failed to import, by name: the error (skipped).
        self.skipped: dict[str, str] = {}

    @property
    def monitored(self) -> bool:
        """Whether hook-call monitoring or tracing is on (hooks then go through pluggy)."""
        return self._monitors > 0

    def add_hookcall_monitoring(
        self,
        before: Callable[[str, Sequence[pluggy.HookImpl], Mapping[str, Any]], None],
        after: Callable[
            [pluggy.Result[Any], str, Sequence[pluggy.HookImpl], Mapping[str, Any]], None
        ],
    ) -> Callable[[], None]:
        """pluggy's monitoring; also makes every manager route its hooks through pluggy's
        caller until the returned undo function runs (``enable_tracing`` uses this too)."""
        undo_monitoring = super().add_hookcall_monitoring(before, after)
        self._monitors += 1
        self._changed()
        undone = False

        def undo() -> None:
            nonlocal undone
            undo_monitoring()
            if not undone:
                undone = True
                self._monitors -= 1
                self._changed()

        return undo

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

    def get_canonical_name(self, plugin: Any) -> str:
        """The name of a plugin registered without one: a module's or class's ``__name__``,
        an instance's class name (pluggy's default is ``str(id(plugin))``, which says nothing
        in a :class:`~kv_offload.errors.HookError`); ``Name#2``, ``Name#3``... for later instances
        of one class, since names are unique."""
        base = getattr(plugin, "__name__", None) or type(plugin).__name__
        name, number = base, 1
        while self.get_plugin(name) is not None or self.is_blocked(name):
            number += 1
            name = f"{base}#{number}"
        return name

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
                f"{', '.join('kv_offload_' + n for n in HOOK_NAMES)} "
                f"(see kv_offload.plugins.hookspecs)",
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
        # Named by the config's ``enable``/``[hooks.<name>]`` or KV_OFFLOAD_PLUGINS: a
        # failure to import is the user's to fix now. Any other installed plugin that fails
        # is skipped with a warning, so one broken distribution cannot stop every manager.
        explicit = (allowed or set()) | set(settings or ())
        loaded = []
        for name, candidates in _hook_entry_points().items():
            if name in blocked or (allowed is not None and name not in allowed):
                continue
            if self.get_plugin(name) is not None or self.is_blocked(name):
                continue
            if len(candidates) > 1:
                raise PluginConflictError(
                    f"hook plugin {name!r} is provided by more than one installed "
                    f"distribution ({', '.join(sorted(map(dist_label, candidates)))}); "
                    f"uninstall all but one of them, or skip it with {BLOCK_ENV}={name}",
                    kind="hook",
                    plugin=name,
                )
            (ep,) = candidates
            try:
                plugin = ep.load()
            except Exception as exc:
                error = PluginImportError(
                    f"hook plugin {name!r} from distribution {dist_label(ep)} failed to import "
                    f"({ep.value}): {type(exc).__name__}: {exc}; fix or uninstall it, or "
                    f"skip it with {BLOCK_ENV}={name}",
                    kind="hook",
                    plugin=name,
                )
                if name in explicit:
                    raise error from exc
                warnings.warn(f"{error} (skipped)", BrokenPluginWarning, stacklevel=2)
                self.skipped[name] = str(error)
                continue
            plugin = configure_plugin(name, plugin, (settings or {}).get(name))
            self.register(plugin, name=name)
            loaded.append(name)
        return loaded


def _hook_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Installed hook entry points by name, one per distribution (a distribution seen twice
    on ``sys.path`` is one candidate; two distributions are a conflict)."""
    found: dict[str, dict[str, metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP):
        dist = ep.dist.name.lower().replace("_", "-") if ep.dist is not None else "<unknown>"
        found.setdefault(ep.name, {}).setdefault(dist, ep)
    return {name: list(by_dist.values()) for name, by_dist in found.items()}


def create_plugin_manager(
    autoload: bool = True,
    allow: Iterable[str] | None = None,
    block: Iterable[str] = (),
    plugins: Iterable[Any] = (),
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> KVOffloadPluginManager:
    """A new plugin manager: the ``kv_offload.hooks`` entry points named by ``allow`` (all if
    ``None``) unless ``autoload`` is false or ``block`` names them, then ``plugins``
    (instances, always registered); ``settings`` holds the ``[hooks.<name>]`` tables of
    plugins that take settings.

    The environment has the last word, as over a config file:
    ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` (``1``/``0``, ``true``/``false``, ...) decides
    ``autoload``; ``KV_OFFLOAD_PLUGINS`` replaces ``allow`` (never widens it);
    ``KV_OFFLOAD_BLOCK_PLUGINS`` adds to ``block``. Overriding an explicit argument warns
    with :class:`~kv_offload.config.env.EnvironmentOverrideWarning`.
    """
    env = hook_env(autoload, allow, block, API_LABELS)
    for override in env.overrides:
        warnings.warn(override, EnvironmentOverrideWarning, stacklevel=2)
    pm = KVOffloadPluginManager()
    for name in env.block:
        pm.set_blocked(name)
    if env.autoload:
        # allow=[] asks for no entry point at all (a config's empty enable means "all")
        allowed = env.allow if env.allow is not None or allow is None else frozenset()
        pm.load_entry_points(allowed, env.block, settings)
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
