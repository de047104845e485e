"""Build secondary tiers from config dicts (vLLM's ``SecondaryTierFactory`` interface).

``config["type"]`` names the tier and resolves like a policy name (runtime registration, then
``kv_offload.tiers`` entry points, then ``config["module_path"]``). ``module_path`` is only a
loading hint and ``name`` sets the tier's :attr:`~SecondaryTierManager.name` after
construction (see :mod:`kv_offload.tiering.names`); ``locality`` sets its
:attr:`~SecondaryTierManager.locality` and ``backpressure`` its cascade gate (see
:mod:`kv_offload.tiering.cascade_gate`). Every other key is a constructor argument of the tier.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
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
from .cascade_gate import build_gate
from .writes import WritePolicy, parse_write_policy

__all__ = ["SecondaryTierFactory", "TIER_ENTRY_POINT_GROUP", "check_tier_arguments"]

TIER_ENTRY_POINT_GROUP = "kv_offload.tiers"
_RESERVED = ("config", "primary_kv_view", "tier_type")
#: Of a tier config's kv-offload keys, the ones a config passes along with its arguments.
_CORE_ARGUMENTS = (
    "locality",
    "backpressure",
    "write_policy",
    "admission",
    "admission_options",
    "admission_module_path",
)
#: Keys of a tier config that are kv-offload's, not constructor arguments.
_NOT_ARGUMENTS = ("type", "module_path", "name", *_CORE_ARGUMENTS)

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
        """Resolve ``config["type"]`` and construct it with the remaining keys."""
        tier_type = _tier_type(config)
        tier_cls = cls.get_tier_class(config)
        arguments = {k: v for k, v in config.items() if k not in _NOT_ARGUMENTS}
        check_tier_arguments(tier_type, tier_cls, arguments)
        tier = construct(
            "tier", tier_type, tier_cls, offloading_config, primary_kv_view, tier_type, **arguments
        )
        name = config.get("name")
        if name is not None and name != tier.name:
            _set_name(tier, tier_type, name)
        try:
            _set_core_arguments(tier, config)
        except BaseException:
            tier.shutdown()
            raise
        return tier


def _set_core_arguments(tier: SecondaryTierManager, config: Mapping[str, Any]) -> None:
    if config.get("locality") is not None:
        tier.locality = _locality(tier.tier_type, config["locality"])
    tier.cascade_gate = build_gate(
        config.get("backpressure"), tier.name, tier.locality or Locality.LOCAL
    )
    tier.write_policy, tier.admission = _writes(
        tier.name, config, getattr(tier, "capacity_blocks", None)
    )


def _writes(
    tier: str, config: Mapping[str, Any], capacity_blocks: int | None
) -> tuple[WritePolicy, AdmissionPolicy | None]:
    """The tier's write policy and admission from its ``write_policy`` and ``admission*``
    keys (:mod:`kv_offload.tiering.writes`); bad values are a ``ConfigError`` naming the key."""
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


def _locality(tier_type: str, value: object) -> Locality:
    try:
        return Locality.parse(value, f"tier {tier_type!r}")
    except InvalidArgumentError as exc:
        raise ConfigError(str(exc)) from None


def _set_name(tier: SecondaryTierManager, tier_type: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"tier {tier_type!r}: 'name' must be a non-empty string, got {name!r}")
    try:
        tier.name = name
    except AttributeError:
        cls = type(tier)
        raise ConfigError(
            f"tier {tier_type!r} ({cls.__module__}.{cls.__qualname__}) defines a read-only "
            f"name {tier.name!r} and cannot be called {name!r}; drop its 'name' key (or do "
            f"not repeat the type)"
        ) from None


def check_tier_arguments(
    tier_type: str, tier_cls: type[SecondaryTierManager], arguments: Mapping[str, Any]
) -> None:
    """Reject config keys the tier's constructor does not take, naming tier and key."""
    parameters = inspect.signature(tier_cls.__init__).parameters
    locality = Locality.LOCAL
    if arguments.get("locality") is not None:
        locality = _locality(tier_type, arguments["locality"])
    build_gate(arguments.get("backpressure"), tier_type, locality)  # names and values
    # Write policy, admission name and options; an admission sized by the tier's capacity
    # is built with the capacity the tier is configured with, as the built stack does.
    capacity = arguments.get("capacity_blocks")
    _writes(tier_type, arguments, capacity if isinstance(capacity, int) else None)
    arguments = {k: v for k, v in arguments.items() if k not in _CORE_ARGUMENTS}
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
