"""Configs: one TOML file or dict that selects and builds the whole stack by name.

The flow runs one way, each step a module that never calls back into an earlier one:

1. :mod:`.load` reads a TOML file (or takes a dict or a parsed config) and drives the steps;
2. :mod:`.parse` validates it key by key against :mod:`.schema` (the one declaration of every
   key, from which ``docs/configuration.md`` is generated), with :mod:`.locate` naming the
   file, line and key of a problem, into the dataclasses of :mod:`.model`;
3. :mod:`.resolve` checks every plugin name, and each plugin's own settings, against what is
   installed; the environment's switches (hook plugins, ``module_path``) are :mod:`.env`'s;
4. :mod:`.memory` estimates what the stack will allocate, before anything is;
5. :func:`kv_offload.build_manager` builds it.
"""

from __future__ import annotations

from .load import load_config
from .model import DEFAULT_CONFIG, HooksConfig, StackConfig, TierConfig
from .parse import parse_config
from .resolve import hook_settings_error, load_hook_entry_point, resolve_config, tier_error

__all__ = [
    "DEFAULT_CONFIG",
    "HooksConfig",
    "StackConfig",
    "TierConfig",
    "hook_settings_error",
    "load_config",
    "load_hook_entry_point",
    "parse_config",
    "resolve_config",
    "tier_error",
]
