"""Step 2 of the config flow: a mapping (a TOML file's tables, or a dict) validated key by key
into a :class:`~kv_offload.config.model.StackConfig`.

The keys are declared once, in :mod:`.schema` (this module derives its known keys and
defaults from there), and documented in ``docs/configuration.md``, a table generated from the
same declarations so that the documentation cannot drift from the parser. Validation stops at
the first problem, with a message that names the key (and, for a TOML file, the file and
line); the :class:`~kv_offload.ConfigError` carries that key as ``key``. Plugin names are
checked in the next step, :mod:`.resolve` (it needs the installed plugins).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..tiering.cascade_gate import merged_table
from ..tiering.names import TierNameError, tier_names
from .locate import KeyPath, Locator, Validator
from .model import HooksConfig, StackConfig, TierConfig
from .rules import REQUIRED
from .schema import HOOK_FIELDS, TABLES, TIER_FIELDS, TOP_FIELDS, Field

__all__ = ["parse_config"]

_TOP = {f.name: f for f in TOP_FIELDS}
_HOOKS = {f.name: f for f in HOOK_FIELDS}
#: ``[backpressure]``: the default of every tier's ``backpressure`` table (a tier's own keys
#: win, key by key); checked by the tier factory with the tier's own table.
_TOP_KEYS = {*_TOP, *TABLES, "backpressure"}
_HOOK_KEYS = set(_HOOKS)
_TIER_KEYS = {f.name for f in TIER_FIELDS}


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

    if top["admission"] is not None and top["store_threshold"] >= 2:
        raise v.fail(
            ("admission",),
            f"both admission {top['admission']!r} and store_threshold = "
            f"{top['store_threshold']} choose what the CPU tier stores; keep one "
            f'(store_threshold = n is admission = "store-threshold" with '
            f"admission_options = {{threshold = n}})",
        )
    for key in ("admission_options", "admission_module_path"):
        if top[key] is not None and top["admission"] is None:
            raise v.fail((key,), f'{key} without admission; name the plugin (admission = "NAME")')

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
        _forbid_module_paths(v, top, tiers, data)
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
            arguments["backpressure"] = merged_table(backpressure, own)
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
    v: Validator, top: Mapping[str, Any], tiers: list[TierConfig], data: Mapping[str, Any]
) -> None:
    for key, what in (("policy_module_path", "policy"), ("admission_module_path", "admission")):
        if top[key] is not None:
            raise v.fail(
                (key,),
                "module_path imports are forbidden by "
                f"allow_module_path = false; install the {what} as a distribution",
            )
    for index, tier_cfg in enumerate(tiers):
        imports = {
            "module_path": tier_cfg.module_path,
            "admission_module_path": tier_cfg.arguments.get("admission_module_path"),
        }
        for key, value in imports.items():
            if value is not None:
                raise v.fail(
                    ("tiers", index, key),
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
