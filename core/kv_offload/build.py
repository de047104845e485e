"""Turn a config into a ready manager: the one call an engine or the CLI needs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import OffloadingManager
from .buffer import CPUKVBuffer
from .config import StackConfig, hook_settings_error, tier_error
from .config.load import load_checked
from .config.resolve import BuiltSettings, memory_error
from .cpu import CPUOffloadingManager
from .errors import ConfigError, PluginSettingsError
from .plugins import KVOffloadPluginManager
from .tiering import (
    OffloadingConfig,
    SecondaryTierFactory,
    TierEntry,
    TieringOffloadingManager,
)
from .tiering.names import tier_names
from .tiering.promotions import PromotionLimits

__all__ = ["build_manager"]


def build_manager(
    config: Mapping[str, Any] | str | Path | StackConfig,
    *,
    plugin_manager: KVOffloadPluginManager | None = None,
) -> OffloadingManager:
    """Validate ``config`` (a dict, a TOML path or a :class:`StackConfig`) and build the stack.

    Without tiers the result is a :class:`CPUOffloadingManager`; with tiers, a
    :class:`TieringOffloadingManager` whose CPU tier owns a KV buffer of
    ``num_blocks x block_size_bytes``. Hook plugins load per the config's ``[hooks]`` table,
    under the environment's precedence (:mod:`kv_offload.config.env`), unless
    ``plugin_manager`` is given; a plugin's ``[hooks.<name>]`` settings go to its
    ``create_plugin``, whose errors (a port in use) are reported like validation errors.
    """
    stack, settings = load_checked(config)
    try:
        return _build(stack, settings, plugin_manager)
    except MemoryError:
        raise memory_error(stack) from None


def _build(
    stack: StackConfig, settings: BuiltSettings, plugin_manager: KVOffloadPluginManager | None
) -> CPUOffloadingManager | TieringOffloadingManager:
    """The stack ``stack`` describes, its admissions and gates the ones its checks built
    (``settings``: built once)."""
    if plugin_manager is None:
        selection = stack.hook_selection()
        selection.warn(stacklevel=4)
        try:
            plugin_manager = selection.plugin_manager(stack.hooks.settings)
        except PluginSettingsError as exc:
            raise hook_settings_error(stack, exc) from exc
    kv_buffer = None
    if stack.staging_rows and stack.block_size_bytes is not None:
        # Rows past num_blocks hold evicted blocks a write-back tier is still writing.
        kv_buffer = CPUKVBuffer(stack.num_blocks + stack.staging_rows, stack.block_size_bytes)
    primary = CPUOffloadingManager(
        stack.num_blocks,
        kv_buffer=kv_buffer,
        cache_policy=stack.policy,
        cache_policy_module_path=stack.policy_module_path,
        enable_events=stack.enable_events,
        store_threshold=stack.store_threshold,
        max_tracker_size=stack.max_tracker_size,
        admission=settings.cpu_admission,
        block_size_bytes=None if kv_buffer is not None else stack.block_size_bytes,
        plugin_manager=plugin_manager,
    )
    if not stack.tiers:
        return primary
    buffer = primary.kv_buffer
    if buffer is None:  # pragma: no cover - the config always sets block_size_bytes
        raise ConfigError("a stack with tiers needs block_size_bytes")
    offloading = OffloadingConfig(stack.num_blocks, buffer.block_size_bytes)
    names = tier_names([(tier.type, tier.name) for tier in stack.tiers])
    tiers: list[TierEntry] = []
    try:
        for index, tier in enumerate(stack.tiers):
            config = tier.as_factory_config()
            if names[index] != tier.type:
                config["name"] = names[index]
            try:
                tiers.append(
                    SecondaryTierFactory.create_tier_entry(
                        config, buffer.view, offloading, settings.tiers[index]
                    )
                )
            except ConfigError as exc:  # e.g. an argument value the tier rejects
                raise tier_error(stack, index, exc) from exc
    except BaseException:
        for built in tiers:
            built.tier.shutdown()
        primary.shutdown()
        raise
    limits = PromotionLimits(
        stack.promotion_timeout_s, stack.promotion_backoff_s, stack.promotion_max_failures
    )
    return TieringOffloadingManager(
        primary, tiers, drain_timeout=stack.drain_timeout_s, promotion_limits=limits
    )
