"""The environment variables that decide which plugins load, read one way everywhere.

The person running the process has the last word, over a config file
(:mod:`kv_offload.config.env`) and over the arguments a program passes
(:func:`~kv_offload.plugins.create_plugin_manager`, ``cache_policy_module_path``, a tier config's
``module_path``) alike:

* ``KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD`` (a boolean) decides whether hook plugins autoload;
* ``KV_OFFLOAD_PLUGINS=a,b`` replaces the names a config's ``enable`` or an ``allow=``
  argument asks for (it never widens them);
* ``KV_OFFLOAD_BLOCK_PLUGINS=a,b`` adds to what is blocked (a blocked name wins);
* ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` forbids every ``module_path`` import.

Each override of something the config or the caller set explicitly is reported with an
:class:`EnvironmentOverrideWarning`. Booleans read ``1 true yes on`` and ``0 false no off``
(any case; empty counts as unset); anything else is a :class:`~kv_offload.ConfigError` naming
the variable. Name lists are separated by commas or white space.

This module imports nothing of kv-offload but the errors, so the plugin loader and the config
layer can both use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "ALLOW_ENV",
    "ALLOW_MODULE_PATH_ENV",
    "AUTOLOAD_DISABLE_ENV",
    "BLOCK_ENV",
    "EnvironmentOverrideWarning",
    "HookEnv",
    "Labels",
    "env_flag",
    "env_names",
    "forbid_module_paths",
    "hook_env",
    "module_path_forbidden_by_env",
    "module_path_forbidder",
    "module_path_unforbid_hint",
]

AUTOLOAD_DISABLE_ENV = "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_ENV = "KV_OFFLOAD_PLUGINS"
BLOCK_ENV = "KV_OFFLOAD_BLOCK_PLUGINS"
ALLOW_MODULE_PATH_ENV = "KV_OFFLOAD_ALLOW_MODULE_PATH"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EnvironmentOverrideWarning(UserWarning):
    """An environment variable overrode what a config file or an explicit argument asked."""


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


def env_names(name: str, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The plugin names listed in the environment variable ``name`` (empty if unset)."""
    raw = (os.environ if environ is None else environ).get(name, "")
    return frozenset(part for part in re.split(r"[,\s]+", raw) if part)


def module_path_forbidden_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KV_OFFLOAD_ALLOW_MODULE_PATH`` forbids ``module_path`` imports."""
    return env_flag(ALLOW_MODULE_PATH_ENV, environ) is False


#: What forbade ``module_path`` imports in this process when a program did it for its user
#: (``kv-offload --no-module-path``), for the errors to name; ``None``: the environment.
_forbidden_by: str | None = None


def forbid_module_paths(by: str) -> None:
    """Forbid every ``module_path`` import in this process and the processes it starts (the
    variable is set), and name ``by`` (e.g. ``"--no-module-path"``) in the errors it causes."""
    global _forbidden_by
    os.environ[ALLOW_MODULE_PATH_ENV] = "0"
    _forbidden_by = by


def module_path_forbidder() -> str:
    """What an error about a forbidden ``module_path`` names: the flag that forbade it, or
    ``KV_OFFLOAD_ALLOW_MODULE_PATH=0 in the environment``."""
    if _forbidden_by is not None and module_path_forbidden_by_env():
        return _forbidden_by
    return f"{ALLOW_MODULE_PATH_ENV}=0 in the environment"


def module_path_unforbid_hint() -> str:
    """How to lift the ban, for the same errors."""
    if _forbidden_by is not None and module_path_forbidden_by_env():
        return f"drop {_forbidden_by}"
    return f"unset {ALLOW_MODULE_PATH_ENV}"


@dataclass(frozen=True)
class Labels:
    """How override warnings name what the environment overrode: a config's ``[hooks]``
    keys, or :func:`~kv_offload.plugins.create_plugin_manager`'s arguments."""

    autoload: str  # formatted with the value: "[hooks] autoload = {}"
    enable: str  # formatted with the sorted names: "[hooks] enable = {}"
    enable_names: str  # "[hooks] enable names"
    report_default_autoload: bool  # whether autoload=True is the caller's own choice


CONFIG_LABELS = Labels("[hooks] autoload = {}", "[hooks] enable = {}", "[hooks] enable names", True)
API_LABELS = Labels(
    "create_plugin_manager(autoload={})",
    "create_plugin_manager(allow={})",
    "allow= names",
    False,
)


@dataclass(frozen=True)
class HookEnv:
    """Which hook plugins load once the environment has had its say: ``allow`` is ``None``
    for "every installed plugin not blocked"; ``overrides`` describes each explicit setting
    the environment replaced."""

    autoload: bool
    allow: frozenset[str] | None
    block: frozenset[str]
    overrides: tuple[str, ...] = ()


def hook_env(
    autoload: bool,
    enable: Iterable[str] | None,
    block: Iterable[str],
    labels: Labels = CONFIG_LABELS,
    environ: Mapping[str, str] | None = None,
) -> HookEnv:
    """The hook selection under the environment's precedence (``enable``: the names asked
    for, ``None`` or empty for all)."""
    env = os.environ if environ is None else environ
    wanted = frozenset(enable or ())
    overrides: list[str] = []
    disabled = env_flag(AUTOLOAD_DISABLE_ENV, env)
    if disabled is not None:
        setting = f"{AUTOLOAD_DISABLE_ENV}={env[AUTOLOAD_DISABLE_ENV]}"
        if disabled and wanted:
            overrides.append(f"{setting} overrides {labels.enable.format(sorted(wanted))}")
        elif disabled and autoload and labels.report_default_autoload:
            overrides.append(f"{setting} overrides {labels.autoload.format('true')}")
        elif not disabled and not autoload:
            value = "false" if labels.report_default_autoload else "False"
            overrides.append(f"{setting} overrides {labels.autoload.format(value)}")
        autoload = not disabled
    allow: frozenset[str] | None = wanted or None
    env_allow = env_names(ALLOW_ENV, env)
    if env_allow:
        if wanted and wanted != env_allow:
            overrides.append(
                f"{ALLOW_ENV}={env[ALLOW_ENV]} overrides {labels.enable.format(sorted(wanted))}"
            )
        allow = env_allow
    env_block = env_names(BLOCK_ENV, env)
    if wanted & env_block and not env_allow:
        overrides.append(
            f"{BLOCK_ENV}={env[BLOCK_ENV]} blocks {sorted(wanted & env_block)} "
            f"that {labels.enable_names}"
        )
    return HookEnv(autoload, allow, frozenset(block) | env_block, tuple(overrides))
