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
``drain_timeout_s``    float > 0     30.0       how long shutdown/drain waits for tier jobs
``enable_events``      bool          false      record ``OffloadingEvent`` batches
``[hooks] autoload``   bool          true       load ``kv_offload.hooks`` entry points
``[hooks] enable``     list[str]     []         only these hook plugins load (empty: all)
``[hooks] block``      list[str]     []         these hook plugins never load
``[hooks.<name>]``     table         unset      settings of hook plugin ``<name>``, checked
                                                by the plugin's ``parse_settings`` (see
                                                ``kv_offload.hooks``)
``[[tiers]] type``     str           required   secondary tier plugin name, in cascade order
``[[tiers]] name``     str           the type   what stats, events and hooks call the tier;
                                                unique; unnamed repeats of a type are
                                                ``<position>:<type>`` (``1:fs``, ``2:fs``)
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
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import (
    ConfigError,
    KVOffloadError,
    PluginImportError,
    PluginNotFoundError,
    PluginSettingsError,
)
from .plugins import PluginInfo, dist_label, parse_plugin_settings
from .plugins.loading import HOOK_ENTRY_POINT_GROUP
from .redact import redact_secrets
from .tiering.names import TierNameError, tier_names

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
    "drain_timeout_s",
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
    autoload: bool = True
    enable: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    #: plugin name -> its ``[hooks.<name>]`` table, as written
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class StackConfig:
    """A validated config; :func:`kv_offload.build_manager` turns it into a manager."""

    num_blocks: int = 20000
    block_size_bytes: int | None = None
    policy: str = "lru"
    policy_module_path: str | None = None
    allow_module_path: bool = True
    enable_events: bool = False
    drain_timeout_s: float = 30.0
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
            # Printed by `kv-offload validate`: credentials in tier arguments are masked.
            "tiers": [redact_secrets(t.as_factory_config()) for t in self.tiers],
            "hooks": {
                "autoload": self.hooks.autoload,
                "enable": list(self.hooks.enable),
                "block": list(self.hooks.block),
                **({"settings": dict(self.hooks.settings)} if self.hooks.settings else {}),
            },
            "allow_module_path": self.allow_module_path,
        }


#: One part of a TOML key: bare, "double-quoted" or 'single-quoted'.
_KEY_PART = r"[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'"


class _Locator:
    """Finds the line of a key in TOML text, so errors can say ``file:line``.

    Understands what configs use: ``[table]`` and ``[[tiers]]`` headers (comments after them
    included), ``key = value`` and dotted ``table.key = value`` lines.
    """

    _HEADER = re.compile(r"^(\[\[?)([^\]]+)\]\]?\s*(?:#.*)?$")
    _KEY = re.compile(rf"^((?:{_KEY_PART})(?:\s*\.\s*(?:{_KEY_PART}))*)\s*=")
    _PART = re.compile(_KEY_PART)

    def __init__(self, source: str, text: str | None) -> None:
        self.source = source
        self.lines = text.splitlines() if text is not None else None

    def where(self, path: tuple[str | int, ...]) -> str:
        line = self._line(path)
        return f"{self.source}:{line}" if line else self.source

    @classmethod
    def _parts(cls, dotted: str) -> tuple[str, ...]:
        return tuple(part.strip("\"'") for part in cls._PART.findall(dotted))

    def _line(self, path: tuple[str | int, ...]) -> int | None:
        if not self.lines or not path:
            return None
        table: tuple[str | int, ...] = ()
        array_index: dict[tuple[str, ...], int] = {}
        first_match = None
        for number, raw in enumerate(self.lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            header = self._HEADER.match(line) if line.startswith("[") else None
            if header:
                name = self._parts(header.group(2))
                if header.group(1) == "[[":
                    array_index[name] = array_index.get(name, -1) + 1
                    table = (*name, array_index[name])
                else:
                    table = name
                if table == path:
                    return number
                continue
            match = self._KEY.match(line)
            if match is None:
                continue
            full = (*table, *self._parts(match.group(1)))
            if full == path:
                return number
            if first_match is None and full[-1] == path[-1]:
                first_match = number
        return first_match


_Path = tuple[str | int, ...]


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Validator:
    def __init__(self, locator: _Locator) -> None:
        self.loc = locator

    def fail(self, path: _Path, message: str, at: _Path | None = None) -> ConfigError:
        """An error naming the key ``path``, located at ``path`` (or at ``at``: for a key that
        is missing from the file, the line that needs it)."""
        dotted = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
        return ConfigError(f"{self.loc.where(at or path)}: {dotted}: {message}")

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
    drain_timeout_s = data.get("drain_timeout_s", 30.0)
    if (
        isinstance(drain_timeout_s, bool)
        or not isinstance(drain_timeout_s, (int, float))
        or not 0 < drain_timeout_s < float("inf")
    ):
        raise v.fail(
            ("drain_timeout_s",), f"must be a number of seconds > 0, got {drain_timeout_s!r}"
        )

    hooks_data = data.get("hooks", {})
    if not isinstance(hooks_data, Mapping):
        raise v.fail(("hooks",), f"must be a table, got {hooks_data!r}")
    # A table under [hooks] holds one plugin's settings; any other unknown key is a typo.
    settings = {k: dict(t) for k, t in hooks_data.items() if isinstance(t, Mapping)}
    v.unknown(hooks_data, _HOOK_KEYS | set(settings), ("hooks",))
    hooks = HooksConfig(
        autoload=v.boolean(hooks_data, "autoload", True, ("hooks",)),
        enable=v.names(hooks_data, "enable", ("hooks",)),
        block=v.names(hooks_data, "block", ("hooks",)),
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

    tiers_data = data.get("tiers", [])
    if not isinstance(tiers_data, list):
        raise v.fail(("tiers",), "must be a list of tables ([[tiers]] in TOML)")
    tiers: list[TierConfig] = []
    for index, tier in enumerate(tiers_data):
        prefix: tuple[str | int, ...] = ("tiers", index)
        if not isinstance(tier, Mapping):
            raise v.fail(prefix, f"must be a table, got {tier!r}")
        tier_type = v.string(tier, "type", prefix)
        if tier_type is None:
            raise v.fail(prefix, "needs a 'type' naming a tier plugin (e.g. type = \"example\")")
        module_path = v.string(tier, "module_path", prefix)
        name = v.string(tier, "name", prefix)
        arguments = {k: val for k, val in tier.items() if k not in ("type", "module_path", "name")}
        tiers.append(TierConfig(tier_type, module_path, arguments, name))
    try:
        tier_names([(t.type, t.name) for t in tiers])
    except TierNameError as exc:
        key = "name" if tiers[exc.index].name is not None else "type"
        raise v.fail(("tiers", exc.index, key), str(exc)) from exc
    if tiers and block_size is None:
        raise v.fail(
            ("block_size_bytes",),
            "is required when tiers are configured (tiers copy real bytes)",
            at=("tiers", 0),
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
        drain_timeout_s=float(drain_timeout_s),
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


def resolve_config(config: StackConfig) -> None:
    """Check that every plugin the config names resolves (imports the selected ones only)."""
    from .policy_factory import CachePolicyFactory
    from .tier_factory import SecondaryTierFactory, check_tier_arguments

    locator = _Locator(config.source, _read_text(config.source))
    v = _Validator(locator)
    try:
        CachePolicyFactory.get_cache_policy_cls(config.policy, config.policy_module_path)
    except KVOffloadError as exc:
        message = _not_found_hint(exc, CachePolicyFactory.available_policies())
        # In a config the policy's module_path key is called policy_module_path.
        message = message.replace("set cache_policy_module_path ", "set policy_module_path ")
        raise v.fail(("policy",), message) from exc
    for index, tier in enumerate(config.tiers):
        try:
            tier_cls = SecondaryTierFactory.get_tier_class(tier.as_factory_config())
        except KVOffloadError as exc:
            message = _not_found_hint(exc, SecondaryTierFactory.available_tiers())
            raise v.fail(("tiers", index, "type"), message) from exc
        try:
            check_tier_arguments(tier.type, tier_cls, tier.arguments)
        except ConfigError as exc:
            bad = next((k for k in tier.arguments if repr(k) in str(exc)), "type")
            raise v.fail(("tiers", index, bad), str(exc)) from exc
    hook_eps = {ep.name: ep for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP)}
    for key, names in (("enable", config.hooks.enable), ("settings", config.hooks.settings)):
        for name in names:
            if name not in hook_eps:
                raise v.fail(
                    ("hooks", "enable") if key == "enable" else ("hooks", name),
                    f"no hook plugin {name!r} is installed{_did_you_mean(name, set(hook_eps))} "
                    f"(installed: {', '.join(sorted(hook_eps)) or 'none'}; "
                    "see `kv-offload plugins`)",
                )
    for name in config.hooks.enable:  # named: managers fail to import it too (not skip it)
        if name not in config.hooks.block and name not in config.hooks.settings:
            try:
                load_hook_entry_point(hook_eps[name])
            except PluginImportError as exc:
                raise v.fail(("hooks", "enable"), str(exc)) from exc
    for name, table in config.hooks.settings.items():
        try:
            parse_plugin_settings(name, load_hook_entry_point(hook_eps[name]), table)
        except PluginSettingsError as exc:
            raise hook_settings_error(config, exc) from exc


def load_hook_entry_point(ep: metadata.EntryPoint) -> Any:
    """Import a hook plugin's entry point, as plugin managers do (same error on failure)."""
    try:
        return ep.load()
    except Exception as exc:
        raise PluginImportError(
            f"hook plugin {ep.name!r} from distribution {dist_label(ep)} failed to import "
            f"({ep.value}): {type(exc).__name__}: {exc}",
            kind="hook",
            plugin=ep.name,
        ) from exc


def hook_settings_error(config: StackConfig, exc: PluginSettingsError) -> ConfigError:
    """A hook plugin's rejection of its settings, located at the setting its message names
    (else at its ``[hooks.<name>]`` table)."""
    v = _Validator(_Locator(config.source, _read_text(config.source)))
    table = config.hooks.settings.get(exc.plugin, {})
    named = [(m.start(), k) for k in table if (m := re.search(rf"\b{re.escape(k)}\b", str(exc)))]
    bad = min(named)[1] if named else None  # the setting the message names first
    path: _Path = ("hooks", exc.plugin, bad) if bad is not None else ("hooks", exc.plugin)
    return v.fail(path, str(exc))


def tier_error(config: StackConfig, index: int, exc: Exception) -> ConfigError:
    """A tier constructor's rejection of its arguments, located like a validation error (the
    tier's key it names, else its ``[[tiers]]`` table)."""
    v = _Validator(_Locator(config.source, _read_text(config.source)))
    arguments = config.tiers[index].arguments
    bad = next((k for k in arguments if re.search(rf"\b{re.escape(k)}\b", str(exc))), None)
    path: _Path = ("tiers", index, bad) if bad is not None else ("tiers", index)
    return v.fail(path, str(exc))


def _not_found_hint(exc: KVOffloadError, available: list[PluginInfo]) -> str:
    """``exc``'s message, plus "did you mean" when it is an unknown name close to one."""
    message = str(exc)
    if not isinstance(exc, PluginNotFoundError) or not exc.plugin:
        return message
    close = difflib.get_close_matches(exc.plugin, sorted({i.name for i in available}), n=1)
    if not close:
        return message
    head, sep, rest = message.partition("; ")
    return f"{head} (did you mean {close[0]!r}?){sep}{rest}"


def _read_text(source: str) -> str | None:
    path = Path(source)
    if source.startswith("<") or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
