"""Build secondary tiers from config dicts (vLLM's ``SecondaryTierFactory`` interface).

``config["type"]`` names the tier and resolves like a policy name (runtime registration, then
``kv_offload.tiers`` entry points, then ``config["module_path"]``); ``module_path`` is only a
loading hint. Every key but the stack's settings is a constructor argument of the tier.

The stack's settings for a tier (``name``: :mod:`kv_offload.tiering.names`; ``locality``;
``backpressure``, its cascade gate: :mod:`kv_offload.tiering.cascade_gate`; ``write_policy``
and ``admission*``: :mod:`kv_offload.tiering.writes`) are the tiered manager's: they go into
the :class:`~kv_offload.tiering.TierEntry` that :meth:`SecondaryTierFactory.create_tier_entry`
returns, never onto the tier. They become objects in one place, :func:`tier_settings`, once
per stack: config validation builds them and ``build_manager`` hands those to
:meth:`~SecondaryTierFactory.create_tier_entry`.
:meth:`SecondaryTierFactory.create_secondary_tier` (vLLM's call) constructs the tier alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..admission import AdmissionPolicy, check_admission_keys, configured_admission
from ..errors import (
    ConfigError,
    InvalidArgumentError,
)
from ..plugins.construct import construct
from ..plugins.registry import PluginInfo, PluginRegistry
from ..tier_types import Locality
from .base import OffloadingConfig, SecondaryTierManager
from .cascade_gate import CascadeGate, build_gate
from .record import TierEntry
from .writes import WritePolicy, parse_write_policy

__all__ = [
    "SecondaryTierFactory",
    "TIER_ENTRY_POINT_GROUP",
    "TierSettings",
    "check_tier_arguments",
    "tier_settings",
]

TIER_ENTRY_POINT_GROUP = "kv_offload.tiers"
_RESERVED = ("config", "primary_kv_view", "tier_type")
#: A tier config's keys that are the stack's settings for the tier (the tiered manager's
#: record of it), not constructor arguments; ``name`` is one too.
_SETTINGS = (
    "locality",
    "backpressure",
    "write_policy",
    "admission",
    "admission_options",
    "admission_module_path",
)
#: Keys of a tier config that are kv-offload's, not constructor arguments.
_STACK_KEYS = frozenset(("name", *_SETTINGS))
_NOT_ARGUMENTS = frozenset(("type", "module_path", *_STACK_KEYS))

_registry: PluginRegistry[SecondaryTierManager] = PluginRegistry(
    "tier",
    TIER_ENTRY_POINT_GROUP,
    SecondaryTierManager,  # type: ignore[type-abstract]  # only used for issubclass checks
    'the tier config\'s "module_path"',
)


def _tier_type(config: Mapping[str, Any]) -> str:
    if not isinstance(config, Mapping):
        raise ConfigError(f"a tier config must be a mapping with a 'type' key, got {config!r}")
    tier_type = config.get("type")
    if not tier_type:
        raise ConfigError(
            f"tier config {dict(config)!r} has no 'type': name an installed tier "
            f"(see `kv-offload plugins`), e.g. {{'type': 'example'}}"
        )
    if not isinstance(tier_type, str):
        raise ConfigError(f"tier 'type' must be a string, got {tier_type!r}")
    return tier_type


class SecondaryTierFactory:
    """Tiers by ``type``: runtime registrations, installed entry points, ``module_path``."""

    registry = _registry

    @classmethod
    def register_tier(cls, tier_type: str, module_path: str, class_name: str) -> None:
        _registry.register(tier_type, module_path, class_name)

    @classmethod
    def unregister_tier(cls, tier_type: str) -> None:
        _registry.unregister(tier_type)

    @classmethod
    def get_tier_class(cls, config: Mapping[str, Any]) -> type[SecondaryTierManager]:
        """The tier class ``config["type"]`` names; its ``module_path`` is refused with
        :class:`~kv_offload.ConfigError` under ``KV_OFFLOAD_ALLOW_MODULE_PATH=0``."""
        return _registry.resolve(_tier_type(config), config.get("module_path"))

    @classmethod
    def available_tiers(cls) -> list[PluginInfo]:
        return _registry.available()

    @classmethod
    def create_secondary_tier(
        cls,
        config: Mapping[str, Any],
        primary_kv_view: memoryview,
        offloading_config: OffloadingConfig,
    ) -> SecondaryTierManager:
        """The tier ``config["type"]`` names, constructed with the config's other keys (vLLM's
        call). The stack's settings (``name``, ``locality``, ``backpressure``,
        ``write_policy``, ``admission*``) are the tiered manager's, not the tier's: a config
        holding one is refused; build it with :meth:`create_tier_entry`."""
        tier_type = _tier_type(config)
        settings = sorted(k for k in config if k in _STACK_KEYS)
        if settings:
            raise ConfigError(
                f"tier {tier_type!r}: {', '.join(map(repr, settings))} "
                f"{'is a setting' if len(settings) == 1 else 'are settings'} of the stack, "
                f"kept by the tiered manager, not constructor arguments; build the tier with "
                f"SecondaryTierFactory.create_tier_entry (or build_manager)",
                key=settings[0],
            )
        return cls._construct(tier_type, config, primary_kv_view, offloading_config)

    @classmethod
    def create_tier_entry(
        cls,
        config: Mapping[str, Any],
        primary_kv_view: memoryview,
        offloading_config: OffloadingConfig,
        settings: TierSettings | None = None,
    ) -> TierEntry:
        """A ``[[tiers]]`` entry as a config dict -> the tier and the stack's settings for it,
        for :class:`~kv_offload.tiering.TieringOffloadingManager`. ``settings``: the entry's
        settings as config validation built them (:func:`check_tier_arguments`), so each
        gate and admission is built once; ``None``: built here from ``config``, checked
        before the tier is constructed, so a bad one allocates nothing."""
        tier_type = _tier_type(config)
        name = config.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(
                f"tier {tier_type!r}: 'name' must be a non-empty string, got {name!r}",
                key="name",
            )
        if settings is None:
            settings = tier_settings(name or tier_type, config)
        tier = cls._construct(tier_type, config, primary_kv_view, offloading_config)
        return TierEntry(
            tier,
            name,
            settings.locality,
            settings.cascade_gate,
            settings.write_policy,
            settings.admission,
        )

    @classmethod
    def _construct(
        cls,
        tier_type: str,
        config: Mapping[str, Any],
        primary_kv_view: memoryview,
        offloading_config: OffloadingConfig,
    ) -> SecondaryTierManager:
        tier_cls = cls.get_tier_class(config)
        arguments = {k: v for k, v in config.items() if k not in _NOT_ARGUMENTS}
        _check_constructor_arguments(tier_type, tier_cls, arguments)
        return construct(
            "tier", tier_type, tier_cls, offloading_config, primary_kv_view, tier_type, **arguments
        )


@dataclass(frozen=True)
class TierSettings:
    """The stack's settings of one ``[[tiers]]`` entry, built from its keys: where the tier's
    storage lives, its cascade gate, its write policy and its admission (the fields of a
    :class:`~kv_offload.tiering.TierEntry` besides the tier and its name).

    A gate and an admission keep state (jobs in flight, blocks seen), so one
    ``TierSettings`` serves one stack: config validation builds it
    (:func:`check_tier_arguments`) and ``build_manager`` hands that one to
    :meth:`SecondaryTierFactory.create_tier_entry`, so nothing is built twice."""

    locality: Locality | None = None
    cascade_gate: CascadeGate | None = None
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH
    admission: AdmissionPolicy | None = None


def tier_settings(tier: str, config: Mapping[str, Any]) -> TierSettings:
    """The one place a tier config's stack settings become objects: its ``locality``, its
    ``backpressure`` gate and its ``write_policy`` / ``admission*`` keys, errors naming
    ``tier`` and the key. An admission sized by the tier's capacity gets the config's
    ``capacity_blocks`` argument (never read back from the tier)."""
    locality = None
    if config.get("locality") is not None:
        locality = _locality(tier, config["locality"])
    gate = build_gate(config.get("backpressure"), tier, locality or Locality.LOCAL)
    capacity = config.get("capacity_blocks")
    policy, admission = _writes(tier, config, capacity if type(capacity) is int else None)
    return TierSettings(locality, gate, policy, admission)


def _writes(
    tier: str, config: Mapping[str, Any], capacity_blocks: int | None
) -> tuple[WritePolicy, AdmissionPolicy | None]:
    """The tier's write policy and admission from its ``write_policy`` and ``admission*``
    keys (:mod:`kv_offload.tiering.writes`); bad values are a ``ConfigError`` naming the key.
    An admission sized by the tier's capacity gets the tier's ``capacity_blocks`` argument."""
    name = config.get("admission")
    options = config.get("admission_options")
    if "write_policy" not in config and name is None and options is None:
        return WritePolicy.WRITE_THROUGH, None  # the default: every block, when stored
    policy = parse_write_policy(config.get("write_policy", "write-through"), tier)
    check_admission_keys(f"tier {tier!r}", name, options)
    if name is None and policy is WritePolicy.WRITE_THROUGH_SELECTIVE:
        name = "store-threshold"  # a block the CPU tier stored twice: evicted, then reused
    if name is None:
        return policy, None
    admission = configured_admission(
        name,
        options,
        config.get("admission_module_path"),
        capacity_blocks=capacity_blocks,
        where=f"tier {tier!r}",
    )
    return policy, admission


def _locality(tier: str, value: object) -> Locality:
    try:
        return Locality.parse(value, f"tier {tier!r}")
    except InvalidArgumentError as exc:
        raise ConfigError(str(exc)) from None


def check_tier_arguments(
    tier_type: str, tier_cls: type[SecondaryTierManager], arguments: Mapping[str, Any]
) -> TierSettings:
    """Config validation of a ``[[tiers]]`` entry's keys (its stack settings and its
    constructor arguments), naming tier and key. Returns the settings it built, for
    :meth:`SecondaryTierFactory.create_tier_entry` to use rather than build them again."""
    settings = tier_settings(tier_type, arguments)
    _check_constructor_arguments(
        tier_type, tier_cls, {k: v for k, v in arguments.items() if k not in _STACK_KEYS}
    )
    return settings


def _check_constructor_arguments(
    tier_type: str, tier_cls: type[SecondaryTierManager], arguments: Mapping[str, Any]
) -> None:
    """Reject config keys the tier's constructor does not take, naming tier and key."""
    parameters = inspect.signature(tier_cls.__init__).parameters
    for key in arguments:
        if key in _RESERVED:
            raise ConfigError(
                f"tier {tier_type!r}: {key!r} is set by kv-offload, not in config", key=key
            )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [
        name
        for name, p in parameters.items()
        if name not in ("self", *_RESERVED)
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for key in arguments:
        if key not in accepted:
            raise ConfigError(
                f"tier {tier_type!r} ({tier_cls.__module__}.{tier_cls.__qualname__}) has no "
                f"argument {key!r}; it accepts: {', '.join(accepted) or 'no arguments'}",
                key=key,
            )
    required = [
        name
        for name, p in parameters.items()
        if name not in ("self", *_RESERVED)
        and p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    missing = [name for name in required if name not in arguments]
    if missing:
        raise ConfigError(f"tier {tier_type!r} needs argument(s): {', '.join(missing)}")
