"""One config (a TOML file or a dict) that selects and builds the whole stack by name.

Every key, its type and its default (a TOML file may set any subset):

=====================  ============  =========  ==============================================
key                    type          default    meaning
=====================  ============  =========  ==============================================
``num_blocks``         int > 0       20000      CPU tier size in blocks (or use ``cpu_bytes``)
``cpu_bytes``          int > 0       unset      CPU tier size in bytes; needs
                                                ``block_size_bytes``; exclusive with
                                                ``num_blocks``
``block_size_bytes``   int > 0       unset      bytes per block; gives the CPU tier a KV
                                                buffer; required when ``tiers`` is non-empty
``policy``             str           "lru"      eviction policy plugin name
``policy_module_path`` str           unset      module defining the class named ``policy``
                                                (out-of-tree fallback)
``allow_module_path``  bool          true       false forbids every ``module_path`` import
``enable_events``      bool          false      record ``OffloadingEvent`` batches
``[hooks] autoload``   bool          true       load ``kv_offload.hooks`` entry points
``[hooks] enable``     list[str]     []         only these hook plugins load (empty: all)
``[hooks] block``      list[str]     []         these hook plugins never load
``[[tiers]] type``     str           required   secondary tier plugin name, in cascade order
``[[tiers]] module_``  str           unset      module defining the class named ``type``
``path``
``[[tiers]] <other>``  any                      the tier's own constructor arguments
=====================  ============  =========  ==============================================

Validation runs before anything is built and stops at the first problem, with a message that
names the key (and, for a TOML file, the file and line).
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, KVOffloadError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["StackConfig", "TierConfig", "HooksConfig", "load_config", "DEFAULT_CONFIG"]

_TOP_KEYS = {
    "num_blocks",
    "cpu_bytes",
    "block_size_bytes",
    "policy",
    "policy_module_path",
    "allow_module_path",
    "enable_events",
    "hooks",
    "tiers",
}
_HOOK_KEYS = {"autoload", "enable", "block"}

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

    def as_factory_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"type": self.type, **self.arguments}
        if self.module_path is not None:
            config["module_path"] = self.module_path
        return config


@dataclass(frozen=True)
class HooksConfig:
    autoload: bool = True
    enable: tuple[str, ...] = ()
    block: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackConfig:
    """A validated config; :func:`kv_offload.build_manager` turns it into a manager."""

    num_blocks: int = 20000
    block_size_bytes: int | None = None
    policy: str = "lru"
    policy_module_path: str | None = None
    allow_module_path: bool = True
    enable_events: bool = False
    hooks: HooksConfig = field(default_factory=HooksConfig)
    tiers: tuple[TierConfig, ...] = ()
    source: str = "<dict>"

    def describe(self) -> dict[str, Any]:
        """A plain-data view of the resolved stack (what ``kv-offload validate`` prints)."""
        return {
            "source": self.source,
            "cpu": {
                "num_blocks": self.num_blocks,
                "block_size_bytes": self.block_size_bytes,
                "policy": self.policy,
                "policy_module_path": self.policy_module_path,
                "enable_events": self.enable_events,
            },
            "tiers": [t.as_factory_config() for t in self.tiers],
            "hooks": {
                "autoload": self.hooks.autoload,
                "enable": list(self.hooks.enable),
                "block": list(self.hooks.block),
            },
            "allow_module_path": self.allow_module_path,
        }


class _Locator:
    """Finds the line of a key in TOML text, so errors can say ``file:line``."""

    def __init__(self, source: str, text: str | None) -> None:
        self.source = source
        self.lines = text.splitlines() if text is not None else None

    def where(self, path: tuple[str | int, ...]) -> str:
        line = self._line(path)
        return f"{self.source}:{line}" if line else self.source

    def _line(self, path: tuple[str | int, ...]) -> int | None:
        if not self.lines or not path:
            return None
        table: tuple[str | int, ...] = ()
        tier_index = -1
        target_table = path[:-1] if len(path) > 1 else ()
        key = path[-1]
        first_match = None
        for number, raw in enumerate(self.lines, start=1):
            line = raw.strip()
            if line.startswith("[["):
                name = line.strip("[] ")
                if name == "tiers":
                    tier_index += 1
                    table = ("tiers", tier_index)
                else:
                    table = (name,)
                if table == path:
                    return number
                continue
            if line.startswith("["):
                table = (line.strip("[] "),)
                if table == path:
                    return number
                continue
            match = re.match(r"([A-Za-z0-9_\-\"']+)\s*=", line)
            if match and isinstance(key, str) and match.group(1).strip("\"'") == key:
                if table == target_table:
                    return number
                first_match = first_match or number
        return first_match


_Path = tuple[str | int, ...]


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Validator:
    def __init__(self, locator: _Locator) -> None:
        self.loc = locator

    def fail(self, path: tuple[str | int, ...], message: str) -> ConfigError:
        dotted = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
        return ConfigError(f"{self.loc.where(path)}: {dotted}: {message}")

    def unknown(self, data: Mapping[str, Any], known: set[str], prefix: _Path) -> None:
        for key in data:
            if key not in known:
                raise self.fail(
                    (*prefix, key),
                    f"unknown key{_did_you_mean(key, known)} (known: {', '.join(sorted(known))})",
                )

    def positive_int(self, data: Mapping[str, Any], key: str, prefix: _Path = ()) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(
                (*prefix, key), f"must be an integer, got {type(value).__name__} {value!r}"
            )
        if value <= 0:
            raise self.fail((*prefix, key), f"must be > 0, got {value}")
        return value

    def string(self, data: Mapping[str, Any], key: str, prefix: _Path = ()) -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail((*prefix, key), f"must be a non-empty string, got {value!r}")
        return value

    def boolean(self, data: Mapping[str, Any], key: str, default: bool, prefix: _Path = ()) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail((*prefix, key), f"must be true or false, got {value!r}")
        return value

    def names(self, data: Mapping[str, Any], key: str, prefix: _Path = ()) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail((*prefix, key), f"must be a list of plugin names, got {value!r}")
        return tuple(value)


def parse_config(
    data: Mapping[str, Any], source: str = "<dict>", text: str | None = None
) -> StackConfig:
    """Validate ``data`` (shape, types, ranges) and return a :class:`StackConfig`.

    Plugin names are checked by :func:`resolve_config` (it needs the installed plugins).
    """
    v = _Validator(_Locator(source, text))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a config must be a table/dict, got {type(data).__name__}")
    v.unknown(data, _TOP_KEYS, ())
    num_blocks = v.positive_int(data, "num_blocks")
    cpu_bytes = v.positive_int(data, "cpu_bytes")
    block_size = v.positive_int(data, "block_size_bytes")
    if num_blocks is not None and cpu_bytes is not None:
        raise v.fail(("cpu_bytes",), "set either num_blocks or cpu_bytes, not both")
    if cpu_bytes is not None:
        if block_size is None:
            raise v.fail(("cpu_bytes",), "needs block_size_bytes to turn bytes into blocks")
        num_blocks = cpu_bytes // block_size
        if num_blocks <= 0:
            raise v.fail(("cpu_bytes",), f"{cpu_bytes} bytes hold no block of {block_size} bytes")
    policy = v.string(data, "policy") or "lru"
    policy_module_path = v.string(data, "policy_module_path")
    allow_module_path = v.boolean(data, "allow_module_path", True)
    enable_events = v.boolean(data, "enable_events", False)

    hooks_data = data.get("hooks", {})
    if not isinstance(hooks_data, Mapping):
        raise v.fail(("hooks",), f"must be a table, got {hooks_data!r}")
    v.unknown(hooks_data, _HOOK_KEYS, ("hooks",))
    hooks = HooksConfig(
        autoload=v.boolean(hooks_data, "autoload", True, ("hooks",)),
        enable=v.names(hooks_data, "enable", ("hooks",)),
        block=v.names(hooks_data, "block", ("hooks",)),
    )
    overlap = set(hooks.enable) & set(hooks.block)
    if overlap:
        raise v.fail(("hooks", "block"), f"{sorted(overlap)} are both enabled and blocked")

    tiers_data = data.get("tiers", [])
    if not isinstance(tiers_data, list):
        raise v.fail(("tiers",), "must be a list of tables ([[tiers]] in TOML)")
    tiers = []
    for index, tier in enumerate(tiers_data):
        prefix: tuple[str | int, ...] = ("tiers", index)
        if not isinstance(tier, Mapping):
            raise v.fail(prefix, f"must be a table, got {tier!r}")
        tier_type = v.string(tier, "type", prefix)
        if tier_type is None:
            raise v.fail(prefix, "needs a 'type' naming a tier plugin (e.g. type = \"example\")")
        module_path = v.string(tier, "module_path", prefix)
        arguments = {k: val for k, val in tier.items() if k not in ("type", "module_path")}
        tiers.append(TierConfig(tier_type, module_path, arguments))
    if tiers and block_size is None:
        raise v.fail(
            ("block_size_bytes",), "is required when tiers are configured (tiers copy real bytes)"
        )
    if not allow_module_path:
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
    return StackConfig(
        num_blocks=num_blocks if num_blocks is not None else 20000,
        block_size_bytes=block_size,
        policy=policy,
        policy_module_path=policy_module_path,
        allow_module_path=allow_module_path,
        enable_events=enable_events,
        hooks=hooks,
        tiers=tuple(tiers),
        source=source,
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
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        parsed = parse_config(data, str(path), text)
    else:
        parsed = parse_config(config)
    resolve_config(parsed)
    return parsed


def resolve_config(config: StackConfig) -> None:
    """Check that every plugin the config names resolves (imports the selected ones only)."""
    from .policy_factory import CachePolicyFactory
    from .tier_factory import SecondaryTierFactory, check_tier_arguments

    locator = _Locator(config.source, _read_text(config.source))
    v = _Validator(locator)
    try:
        CachePolicyFactory.get_cache_policy_cls(config.policy, config.policy_module_path)
    except KVOffloadError as exc:
        raise v.fail(("policy",), str(exc)) from exc
    for index, tier in enumerate(config.tiers):
        try:
            tier_cls = SecondaryTierFactory.get_tier_class(tier.as_factory_config())
        except KVOffloadError as exc:
            raise v.fail(("tiers", index, "type"), str(exc)) from exc
        try:
            check_tier_arguments(tier.type, tier_cls, tier.arguments)
        except ConfigError as exc:
            bad = next((k for k in tier.arguments if repr(k) in str(exc)), "type")
            raise v.fail(("tiers", index, bad), str(exc)) from exc


def _read_text(source: str) -> str | None:
    path = Path(source)
    if source.startswith("<") or not path.is_file():
        return None
    return path.read_text(encoding="utf-8")
