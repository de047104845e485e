"""What the environment of the process says about a config: the person running the process has
the last word over what a config file asks for.

* ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` (or ``kv-offload --no-module-path``) forbids every
  ``module_path`` import, whatever the config's ``allow_module_path`` says.
* Hook plugin selection: ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` (a boolean) wins over
  ``[hooks] autoload`` and ``enable``; ``KV_OFFLOAD_PLUGINS=a,b`` replaces ``[hooks] enable``
  (it never widens it); ``KV_OFFLOAD_BLOCK_PLUGINS`` adds to ``[hooks] block`` (blocking only
  ever narrows what loads, and a blocked name wins over an enabled one). Each override of
  something the config set is reported with an :class:`EnvironmentOverrideWarning`.

The variables are read by :mod:`kv_offload.plugins.env`, the same way for a stack built
without a config (:func:`~kv_offload.plugins.create_plugin_manager`, ``cache_policy_module_path``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ..plugins.env import (
    ALLOW_MODULE_PATH_ENV,
    EnvironmentOverrideWarning,
    env_flag,
    hook_env,
    module_path_forbidden_by_env,
)
from ..plugins.loading import HOOK_ENTRY_POINT_GROUP, KVOffloadPluginManager

__all__ = [
    "ALLOW_MODULE_PATH_ENV",
    "EnvironmentOverrideWarning",
    "HookSelection",
    "env_flag",
    "module_path_forbidden_by_env",
    "select_hooks",
]


@dataclass(frozen=True)
class HookSelection:
    """Which hook plugins a stack loads once the environment has had its say.

    ``allow`` is ``None`` for "every installed plugin not blocked"; ``overrides`` describes
    each setting of the config the environment replaced.
    """

    autoload: bool
    allow: frozenset[str] | None
    block: frozenset[str]
    overrides: tuple[str, ...] = ()

    def will_load(self) -> list[str]:
        """The installed hook plugins that will load, read from metadata (nothing imported)."""
        if not self.autoload:
            return []
        names = {ep.name for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP)}
        if self.allow is not None:
            names &= self.allow
        return sorted(names - self.block)

    def plugin_manager(
        self, settings: Mapping[str, Mapping[str, Any]] | None = None
    ) -> KVOffloadPluginManager:
        """A plugin manager holding exactly the selected plugins (``settings``: the
        ``[hooks.<name>]`` tables of those that take settings)."""
        pm = KVOffloadPluginManager()  # not create_plugin_manager: the environment had its say
        for name in self.block:
            pm.set_blocked(name)
        if self.autoload:
            pm.load_entry_points(self.allow, self.block, settings)
        return pm

    def warn(self, stacklevel: int = 2) -> None:
        for override in self.overrides:
            warnings.warn(override, EnvironmentOverrideWarning, stacklevel=stacklevel + 1)


def select_hooks(
    autoload: bool,
    enable: Iterable[str],
    block: Iterable[str],
    environ: Mapping[str, str] | None = None,
) -> HookSelection:
    """The hook selection of a config's ``[hooks]`` table under the environment's precedence."""
    env = hook_env(autoload, enable, block, environ=environ)
    return HookSelection(env.autoload, env.allow, env.block, env.overrides)
