"""One config (a TOML file or a dict) that selects and builds the whole stack by name.

The keys are declared once, in :mod:`kv_offload.config_schema` (this module derives its known
keys and defaults from there), and documented in ``docs/configuration.md``, a table generated
from the same declarations so that the documentation cannot drift from the parser.

Validation runs before anything is built and stops at the first problem, with a message that
names the key (and, for a TOML file, the file and line); the :class:`~kv_offload.ConfigError`
carries that key as ``key``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_env import HookSelection, select_hooks
from .config_locate import KeyPath, Locator, Validator
from .config_resolve import hook_settings_error, load_hook_entry_point, resolve_config, tier_error
from .config_schema import HOOK_FIELDS, REQUIRED, TABLES, TIER_FIELDS, TOP_FIELDS, Field
from .errors import ConfigError
from .redact import redact_secrets
from .tiering.names import TierNameError, tier_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "StackConfig",
    "TierConfig",
    "HooksConfig",
    "load_config",
    "parse_config",
    "resolve_config",
    "tier_error",
    "hook_settings_error",
    "load_hook_entry_point",
    "DEFAULT_CONFIG",
]

_TOP = {f.name: f for f in TOP_FIELDS}
_HOOKS = {f.name: f for f in HOOK_FIELDS}
#: ``[backpressure]``: the default of every tier's ``backpressure`` table (a tier's own keys
#: win, key by key); checked by the tier factory with the tier's own table.
_TOP_KEYS = {*_TOP, *TABLES, "backpressure"}
_HOOK_KEYS = set(_HOOKS)
_TIER_KEYS = {f.name for f in TIER_FIELDS}

#: The embedded default: a CPU tier in front of the in-memory example tier, no external service.
DEFAULT_CONFIG: dict[str, Any] = {
    "num_blocks": 5000,
    "block_size_bytes": 4096,
    "policy": "lru",
    "tiers": [{"type": "example", "capacity_blocks": 20000}],
}


@dataclass(frozen=True)
class TierConfig:
    type: str
    module_path: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    name: str | None = None

    def as_factory_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"type": self.type, **self.arguments}
        if self.module_path is not None:
            config["module_path"] = self.module_path
        if self.name is not None:
            config["name"] = self.name
        return config


@dataclass(frozen=True)
class HooksConfig:
    autoload: bool = _HOOKS["autoload"].default
    enable: tuple[str, ...] = _HOOKS["enable"].default
    block: tuple[str, ...] = _HOOKS["block"].default
    #: plugin name -> its ``[hooks.<name>]`` table, as written (checked by the plugin)
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class StackConfig:
    """A validated config; :func:`kv_offload.build_manager` turns it into a manager."""

    num_blocks: int = _TOP["num_blocks"].default
    block_size_bytes: int | None = _TOP["block_size_bytes"].default
    policy: str = _TOP["policy"].default
    policy_module_path: str | None = _TOP["policy_module_path"].default
    allow_module_path: bool = _TOP["allow_module_path"].default
    enable_events: bool = _TOP["enable_events"].default
    store_threshold: int = _TOP["store_threshold"].default
    max_tracker_size: int = _TOP["max_tracker_size"].default
    drain_timeout_s: float = _TOP["drain_timeout_s"].default
    promotion_timeout_s: float = _TOP["promotion_timeout_s"].default
    promotion_backoff_s: float = _TOP["promotion_backoff_s"].default
    promotion_max_failures: int = _TOP["promotion_max_failures"].default
    hooks: HooksConfig = field(default_factory=HooksConfig)
    tiers: tuple[TierConfig, ...] = ()
    source: str = "<dict>"

    def describe(self) -> dict[str, Any]:
        """A plain-data view of the resolved stack (what ``kv-offload validate`` prints)."""
        shown = [f for f in TOP_FIELDS if f.shown is not None]
        return {
            "source": self.source,
            "cpu": {f.name: getattr(self, f.name) for f in shown if f.shown == "cpu"},
            # Printed by `kv-offload validate`: credentials in tier arguments are masked.
            "tiers": [redact_secrets(t.as_factory_config()) for t in self.tiers],
            "hooks": {
                **{f.name: _plain(getattr(self.hooks, f.name)) for f in HOOK_FIELDS},
                **({"settings": dict(self.hooks.settings)} if self.hooks.settings else {}),
            },
            **{f.name: getattr(self, f.name) for f in shown if f.shown == ""},
        }

    def hook_selection(self) -> HookSelection:
        """The hook plugins this stack loads: its ``[hooks]`` table under the environment's
        precedence (:mod:`kv_offload.config_env`)."""
        return select_hooks(self.hooks.autoload, self.hooks.enable, self.hooks.block)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _with_defaults(values: dict[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    return {f.name: values.get(f.name, f.default) for f in fields if f.default is not REQUIRED}


def parse_config(
    data: Mapping[str, Any], source: str = "<dict>", text: str | None = None
) -> StackConfig:
    """Validate ``data`` (shape, types, ranges) and return a :class:`StackConfig`.

    Plugin names are checked by :func:`resolve_config` (it needs the installed plugins).
    """
    v = Validator(Locator(source, text))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a config must be a table/dict, got {type(data).__name__}")
    v.unknown(data, _TOP_KEYS, ())
    given = v.fields(data, TOP_FIELDS)
    top = _with_defaults(given, TOP_FIELDS)
    cpu_bytes = top.pop("cpu_bytes")
    block_size = top["block_size_bytes"]
    if cpu_bytes is not None:
        if given.get("num_blocks") is not None:
            raise v.fail(("cpu_bytes",), "set either num_blocks or cpu_bytes, not both")
        if block_size is None:
            raise v.fail(("cpu_bytes",), "needs block_size_bytes to turn bytes into blocks")
        top["num_blocks"] = cpu_bytes // block_size
        if top["num_blocks"] <= 0:
            raise v.fail(("cpu_bytes",), f"{cpu_bytes} bytes hold no block of {block_size} bytes")

    hooks_data = v.table(data, "hooks")
    # A table under [hooks] holds one plugin's settings; any other unknown key is a typo.
    settings = {k: dict(t) for k, t in hooks_data.items() if isinstance(t, Mapping)}
    v.unknown(hooks_data, _HOOK_KEYS | set(settings), ("hooks",))
    hooks = HooksConfig(
        **_with_defaults(v.fields(hooks_data, HOOK_FIELDS, ("hooks",)), HOOK_FIELDS),
        settings=settings,
    )
    overlap = set(hooks.enable) & set(hooks.block)
    if overlap:
        raise v.fail(("hooks", "block"), f"{sorted(overlap)} are both enabled and blocked")
    for name in settings:  # settings for a plugin that never loads would be ignored silently
        unloaded = (
            "[hooks] autoload = false"
            if not hooks.autoload
            else "it is blocked"
            if name in hooks.block
            else f"it is not in [hooks] enable {list(hooks.enable)}"
            if hooks.enable and name not in hooks.enable
            else None
        )
        if unloaded is not None:
            raise v.fail(
                ("hooks", name),
                f"settings for hook plugin {name!r}, which does not load ({unloaded}); "
                "load it or remove the table",
            )

    backpressure = data.get("backpressure")
    if backpressure is not None and not isinstance(backpressure, Mapping):
        raise v.fail(("backpressure",), f"must be a table, got {backpressure!r}")
    tiers = _parse_tiers(v, data.get("tiers", []), backpressure)
    if tiers and block_size is None:
        raise v.fail(
            ("block_size_bytes",),
            "is required when tiers are configured (tiers copy real bytes)",
            at=("tiers", 0),
        )
    if not top["allow_module_path"]:
        _forbid_module_paths(v, top["policy_module_path"], tiers, data)
    return StackConfig(**top, hooks=hooks, tiers=tuple(tiers), source=source)


def _parse_tiers(
    v: Validator, tiers_data: Any, backpressure: Mapping[str, Any] | None = None
) -> list[TierConfig]:
    if not isinstance(tiers_data, list):
        raise v.fail(("tiers",), "must be a list of tables ([[tiers]] in TOML)")
    tiers: list[TierConfig] = []
    for index, tier in enumerate(tiers_data):
        prefix: KeyPath = ("tiers", index)
        if not isinstance(tier, Mapping):
            raise v.fail(prefix, f"must be a table, got {tier!r}")
        values = v.fields(tier, TIER_FIELDS, prefix)
        tier_type = values.get("type")
        if tier_type is None:
            raise v.fail(prefix, "needs a 'type' naming a tier plugin (e.g. type = \"example\")")
        arguments = {k: val for k, val in tier.items() if k not in _TIER_KEYS}
        if backpressure is not None:  # the global table under the tier's own keys
            own = arguments.get("backpressure")
            if own is not None and not isinstance(own, Mapping):
                raise v.fail((*prefix, "backpressure"), f"must be a table, got {own!r}")
            arguments["backpressure"] = {**backpressure, **(own or {})}
        tiers.append(
            TierConfig(tier_type, values.get("module_path"), arguments, values.get("name"))
        )
    try:
        tier_names([(t.type, t.name) for t in tiers])
    except TierNameError as exc:
        key = "name" if tiers[exc.index].name is not None else "type"
        raise v.fail(("tiers", exc.index, key), str(exc)) from exc
    return tiers


def _forbid_module_paths(
    v: Validator, policy_module_path: str | None, tiers: list[TierConfig], data: Mapping[str, Any]
) -> None:
    if policy_module_path is not None:
        raise v.fail(
            ("policy_module_path",),
            "module_path imports are forbidden by "
            "allow_module_path = false; install the policy as a distribution",
        )
    for index, tier_cfg in enumerate(tiers):
        if tier_cfg.module_path is not None:
            raise v.fail(
                ("tiers", index, "module_path"),
                "module_path imports are forbidden by allow_module_path = false",
            )
    # The backpressure tables name detector and drop-policy classes the same way.
    raw_tiers = data.get("tiers")
    tables: list[tuple[tuple[Any, ...], Any]] = [(("backpressure",), data.get("backpressure"))]
    if isinstance(raw_tiers, list):
        tables += [
            (("tiers", i, "backpressure"), t.get("backpressure"))
            for i, t in enumerate(raw_tiers)
            if isinstance(t, Mapping)
        ]
    for path, table in tables:
        for key in ("detector_module_path", "drop_policy_module_path"):
            if isinstance(table, Mapping) and table.get(key) is not None:
                raise v.fail(
                    (*path, key), "module_path imports are forbidden by allow_module_path = false"
                )


def load_config(config: Mapping[str, Any] | str | Path | StackConfig) -> StackConfig:
    """A validated config from a dict, a TOML file path, or an existing :class:`StackConfig`,
    with every plugin name resolved against what is installed."""
    if isinstance(config, StackConfig):
        parsed = config
    elif isinstance(config, (str, Path)):
        path = Path(config)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (TOML): {exc.reason}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            # tomllib says "... (at line 3, column 9)"; say it the way every other error does.
            found = re.search(r"at line (\d+)", str(exc))
            where = f"{path}:{found.group(1)}" if found else str(path)
            raise ConfigError(f"{where}: invalid TOML: {exc}") from None
        parsed = parse_config(data, str(path), text)
    else:
        parsed = parse_config(config)
    resolve_config(parsed)
    return parsed
