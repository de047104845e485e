"""What the environment of the process says about a config: the person running the process has
the last word over what a config file asks for.

* ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` (or ``kv-offload --no-module-path``) forbids every
  ``module_path`` import, whatever the config's ``allow_module_path`` says.
* Hook plugin selection: ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` (a boolean) wins over
  ``[hooks] autoload`` and ``enable``; ``KV_OFFLOAD_PLUGINS=a,b`` replaces ``[hooks] enable``
  (it never widens it); ``KV_OFFLOAD_BLOCK_PLUGINS`` adds to ``[hooks] block`` (blocking only
  ever narrows what loads, and a blocked name wins over an enabled one). Each override of
  something the config set is reported with an :class:`EnvironmentOverrideWarning`.

Booleans read ``1 true yes on`` and ``0 false no off`` (any case; empty counts as unset);
anything else is a :class:`~kv_offload.ConfigError` naming the variable.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from .errors import ConfigError
from .hooks import (
    ALLOW_ENV,
    AUTOLOAD_DISABLE_ENV,
    BLOCK_ENV,
    HOOK_ENTRY_POINT_GROUP,
    KVOffloadPluginManager,
    create_plugin_manager,
)

__all__ = [
    "ALLOW_MODULE_PATH_ENV",
    "EnvironmentOverrideWarning",
    "HookSelection",
    "env_flag",
    "module_path_forbidden_by_env",
    "select_hooks",
]

ALLOW_MODULE_PATH_ENV = "KV_OFFLOAD_ALLOW_MODULE_PATH"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EnvironmentOverrideWarning(UserWarning):
    """An environment variable overrode what the config file asked for."""


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """The boolean environment variable ``name``, or ``None`` when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return None
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigError(
        f"environment variable {name}={raw!r}: must be one of "
        f"{', '.join(sorted(_TRUE | _FALSE))} (or unset)",
        key=name,
    )


def module_path_forbidden_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KV_OFFLOAD_ALLOW_MODULE_PATH`` forbids ``module_path`` imports."""
    return env_flag(ALLOW_MODULE_PATH_ENV, environ) is False


def _names(raw: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in (raw or "").split(",") if n.strip())


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
        pm = create_plugin_manager(autoload=False, block=self.block)
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
    env = os.environ if environ is None else environ
    enable = frozenset(enable)
    overrides: list[str] = []
    disabled = env_flag(AUTOLOAD_DISABLE_ENV, env)
    if disabled is not None:
        if disabled and (autoload or enable):
            what = f"[hooks] enable = {sorted(enable)}" if enable else "[hooks] autoload = true"
            overrides.append(f"{AUTOLOAD_DISABLE_ENV}={env[AUTOLOAD_DISABLE_ENV]} overrides {what}")
        elif not disabled and not autoload:
            overrides.append(
                f"{AUTOLOAD_DISABLE_ENV}={env[AUTOLOAD_DISABLE_ENV]} overrides "
                "[hooks] autoload = false"
            )
        autoload = not disabled
    allow: frozenset[str] | None = enable or None
    env_allow = _names(env.get(ALLOW_ENV))
    if env_allow:
        if enable and enable != env_allow:
            overrides.append(
                f"{ALLOW_ENV}={env[ALLOW_ENV]} overrides [hooks] enable = {sorted(enable)}"
            )
        allow = env_allow
    env_block = _names(env.get(BLOCK_ENV))
    blocked = frozenset(block) | env_block
    if enable & env_block and not env_allow:
        overrides.append(
            f"{BLOCK_ENV}={env[BLOCK_ENV]} blocks {sorted(enable & env_block)} "
            "that [hooks] enable names"
        )
    return HookSelection(autoload, allow, blocked, tuple(overrides))
