"""Checks that need the installed plugins and the process: run after a config parses.

Every plugin the config names must resolve (only the selected ones are imported); each tier's
arguments must fit its constructor's signature and pass the tier's own
:meth:`~kv_offload.tiering.SecondaryTierManager.validate_arguments`; the environment's overrides
(:mod:`kv_offload.config.env`) must parse and are applied; and the stack must fit in the
machine's memory (:mod:`kv_offload.config.memory`). Errors are located through the key they
name, like every config error.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigError,
    KVOffloadError,
    PluginImportError,
    PluginNotFoundError,
    PluginSettingsError,
)
from ..plugins import ExperimentalPluginWarning, PluginInfo
from ..plugins.env import module_path_forbidder
from ..plugins.loading import HOOK_ENTRY_POINT_GROUP
from ..plugins.registry import dist_label
from ..plugins.settings import parse_plugin_settings
from ..tiering.base import OffloadingConfig, SecondaryTierManager
from .env import module_path_forbidden_by_env
from .locate import KeyPath, Validator, closest, did_you_mean
from .memory import (
    BOOKKEEPING_BYTES_PER_BLOCK,
    MemoryEstimate,
    human,
    physical_memory_bytes,
)

if TYPE_CHECKING:
    from ..admission import AdmissionPolicy
    from ..tiering.factory import TierSettings
    from .model import StackConfig, TierConfig

__all__ = [
    "BuiltSettings",
    "resolve_config",
    "tier_error",
    "estimate_memory",
    "memory_error",
    "hook_settings_error",
    "load_hook_entry_point",
]

_PYTHONPATH_HINT = (
    "; module_path is imported like any module: `kv-offload` does not put the working "
    "directory or the config file's directory on the import path, so run it with "
    "PYTHONPATH set (e.g. PYTHONPATH=. kv-offload ...)"
)


@dataclass(frozen=True)
class BuiltSettings:
    """The plugin objects checking a config built: the CPU tier's admission and each tier's
    :class:`~kv_offload.tiering.factory.TierSettings` (gate, write policy, admission), in
    order. They are checked by being built (a constructor rejects a bad option), and they
    keep state, so ``build_manager`` builds its stack from these, once, not from the config
    again."""

    cpu_admission: AdmissionPolicy | None
    tiers: tuple[TierSettings, ...]


def resolve_config(config: StackConfig) -> BuiltSettings:
    """Check what a config names against the installed plugins and this machine; the
    settings objects built on the way are returned (:class:`BuiltSettings`)."""
    v = Validator.for_source(config.source)
    _forbid_module_paths_by_env(v, config)
    _resolve_policy(v, config)
    cpu_admission = _resolve_admission(v, config)
    geometry = (
        OffloadingConfig(config.num_blocks, config.block_size_bytes)
        if config.block_size_bytes
        else None
    )
    resolved = [_resolve_tier(v, index, tier, geometry) for index, tier in enumerate(config.tiers)]
    config.hook_selection()  # the environment's hook settings must parse
    _check_hooks(v, config)
    _check_memory(v, config, _estimate(config, [tier_cls for tier_cls, _ in resolved]))
    return BuiltSettings(cpu_admission, tuple(settings for _, settings in resolved))


def _check_hooks(v: Validator, config: StackConfig) -> None:
    """Every hook plugin ``enable`` names or ``[hooks.<name>]`` configures is installed, and
    each plugin's own ``parse_settings`` accepts its table."""
    hook_eps = {ep.name: ep for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP)}
    for key, names in (("enable", config.hooks.enable), ("settings", config.hooks.settings)):
        for name in names:
            if name not in hook_eps:
                raise v.fail(
                    ("hooks", "enable") if key == "enable" else ("hooks", name),
                    f"no hook plugin {name!r} is installed{did_you_mean(name, set(hook_eps))} "
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
    """A hook plugin's rejection of its settings, located at the setting it names through
    ``ConfigError.key`` (else, for plugins that do not set it, the setting its message names
    first; else its ``[hooks.<name>]`` table)."""
    v = Validator.for_source(config.source)
    table = config.hooks.settings.get(exc.plugin, {})
    bad = exc.key if exc.key in table else None
    if bad is None:
        message = str(exc)
        named = [(m.start(), k) for k in table if (m := re.search(rf"\b{re.escape(k)}\b", message))]
        bad = min(named)[1] if named else None
    path: KeyPath = ("hooks", exc.plugin, bad) if bad is not None else ("hooks", exc.plugin)
    return v.fail(path, str(exc))


def estimate_memory(config: StackConfig) -> MemoryEstimate:
    """What ``config``'s stack will allocate (its plugins must resolve)."""
    from ..tiering.factory import SecondaryTierFactory

    classes = [SecondaryTierFactory.get_tier_class(t.as_factory_config()) for t in config.tiers]
    return _estimate(config, classes)


def tier_error(config: StackConfig, index: int, exc: Exception) -> ConfigError:
    """A tier constructor's rejection of its arguments, located like a validation error (the
    tier's key it names, else its ``[[tiers]]`` table)."""
    v = Validator.for_source(config.source)
    return v.fail(_tier_key(index, config.tiers[index], exc), str(exc))


def memory_error(config: StackConfig) -> ConfigError:
    """The error for a stack whose allocation failed although the estimate fit (the memory
    was in use by others): the figures instead of a bare ``MemoryError``."""
    physical = physical_memory_bytes()
    has = f" of the {human(physical)} this machine has" if physical else ""
    return ConfigError(
        f"{config.source}: not enough free memory to build the stack: it needs about "
        f"{estimate_memory(config).describe()}{has}; lower num_blocks, block_size_bytes or "
        "the in-memory tiers' capacities",
        key="num_blocks",
    )


def _forbid_module_paths_by_env(v: Validator, config: StackConfig) -> None:
    if not module_path_forbidden_by_env():
        return
    why = (
        f"module_path imports are forbidden by {module_path_forbidder()} "
        "(whatever allow_module_path says)"
    )
    if config.policy_module_path is not None:
        raise v.fail(("policy_module_path",), f"{why}; install the policy as a distribution")
    if config.admission_module_path is not None:
        raise v.fail(("admission_module_path",), f"{why}; install the admission instead")
    for index, tier in enumerate(config.tiers):
        if tier.module_path is not None:
            raise v.fail(("tiers", index, "module_path"), f"{why}; install the tier instead")
        if tier.arguments.get("admission_module_path") is not None:
            raise v.fail(
                ("tiers", index, "admission_module_path"), f"{why}; install the admission instead"
            )


@contextmanager
def _warnings_located_at(v: Validator, path: KeyPath) -> Iterator[None]:
    """Re-issue the ExperimentalPluginWarning of a module_path import at the config line that
    asked for it (other warnings pass through unchanged)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if issubclass(w.category, ExperimentalPluginWarning):
            where = v.loc.line(path)
            warnings.warn_explicit(w.message, w.category, v.loc.source, where or 0)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _resolve_policy(v: Validator, config: StackConfig) -> None:
    from ..policies.factory import CachePolicyFactory

    module_path = config.policy_module_path
    at: KeyPath = ("policy_module_path",) if module_path is not None else ("policy",)
    try:
        with _warnings_located_at(v, at):
            CachePolicyFactory.get_cache_policy_cls(config.policy, module_path)
    except KVOffloadError as exc:
        available = CachePolicyFactory.available_policies()
        message = _not_found_hint(exc, available)
        # In a config the policy's module_path key is called policy_module_path.
        message = message.replace("set cache_policy_module_path ", "set policy_module_path ")
        installed = config.policy in {i.name for i in available}
        raise v.fail(("policy",) if installed else at, message + _import_hint(exc)) from exc


def _resolve_admission(v: Validator, config: StackConfig) -> AdmissionPolicy | None:
    """The CPU tier's admission is built once here, so a bad name or option is reported at
    ``validate`` with its file and line (a tier's is checked with the tier's arguments)."""
    if config.admission is None:
        return None
    try:
        return config.cpu_admission()
    except ConfigError as exc:
        raise v.fail((exc.key or "admission",), str(exc)) from exc


def _resolve_tier(
    v: Validator, index: int, tier: TierConfig, geometry: OffloadingConfig | None
) -> tuple[type[SecondaryTierManager], TierSettings]:
    from ..tiering.factory import SecondaryTierFactory, check_tier_arguments

    at: KeyPath = ("tiers", index, "module_path" if tier.module_path is not None else "type")
    try:
        with _warnings_located_at(v, at):
            tier_cls = SecondaryTierFactory.get_tier_class(tier.as_factory_config())
    except KVOffloadError as exc:
        available = SecondaryTierFactory.available_tiers()
        message = _not_found_hint(exc, available)
        installed = tier.type in {i.name for i in available}
        path = ("tiers", index, "type") if installed else at
        raise v.fail(path, message + _import_hint(exc)) from exc
    try:
        settings = check_tier_arguments(tier.type, tier_cls, tier.arguments)
        tier_cls.validate_arguments(**tier.arguments)
        if geometry is not None:
            tier_cls.validate_for_stack(geometry, **tier.arguments)
    except ConfigError as exc:
        raise v.fail(_tier_key(index, tier, exc, "type"), str(exc)) from exc
    return tier_cls, settings


def _estimate(
    config: StackConfig, tier_classes: list[type[SecondaryTierManager]]
) -> MemoryEstimate:
    block_size = config.block_size_bytes or 0
    offloading = OffloadingConfig(config.num_blocks, block_size)
    tiers: list[tuple[str, int]] = []
    unbounded: list[str] = []
    for tier, cls in zip(config.tiers, tier_classes):
        held = cls.memory_bytes(offloading, **tier.arguments)
        if held is None:
            unbounded.append(tier.type)
        elif held:
            tiers.append((tier.type, held))
    return MemoryEstimate(
        cpu_buffer=(config.num_blocks + config.staging_rows) * block_size,
        bookkeeping=config.num_blocks * BOOKKEEPING_BYTES_PER_BLOCK,
        tiers=tuple(tiers),
        unbounded=tuple(unbounded),
    )


def _check_memory(v: Validator, config: StackConfig, estimate: MemoryEstimate) -> None:
    physical = physical_memory_bytes()
    if physical is None or estimate.total <= physical:
        return
    cpu = estimate.cpu_buffer + estimate.bookkeeping
    if cpu > physical or not estimate.tiers:
        path: KeyPath = ("num_blocks",) if v.loc.line(("num_blocks",)) else ("cpu_bytes",)
        fix = "lower num_blocks (or cpu_bytes) or block_size_bytes"
    else:
        largest = max(range(len(estimate.tiers)), key=lambda i: estimate.tiers[i][1])
        name = estimate.tiers[largest][0]
        index = next(i for i, t in enumerate(config.tiers) if t.type == name)
        path = ("tiers", index)
        fix = "lower the in-memory tiers' capacities, num_blocks or block_size_bytes"
    raise v.fail(
        path,
        f"the stack needs about {human(estimate.total)} of memory ({estimate.describe()}) but "
        f"this machine has {human(physical)}; {fix}",
    )


def _tier_key(index: int, tier: TierConfig, exc: Exception, fallback: str | None = None) -> KeyPath:
    """The tier key an error from the tier's checks names through ``ConfigError.key``: one of
    its arguments, else ``fallback`` (or the ``[[tiers]]`` table itself)."""
    key = exc.key if isinstance(exc, ConfigError) else None
    if key is not None and key in tier.arguments:
        return ("tiers", index, key)
    return ("tiers", index) if fallback is None else ("tiers", index, fallback)


def _import_hint(exc: KVOffloadError) -> str:
    """The import-path hint, for a module_path whose module was not found."""
    return _PYTHONPATH_HINT if isinstance(exc.__cause__, ModuleNotFoundError) else ""


def _not_found_hint(exc: KVOffloadError, available: list[PluginInfo]) -> str:
    """``exc``'s message, plus "did you mean" when it is an unknown name close to one."""
    message = str(exc)
    if not isinstance(exc, PluginNotFoundError) or not exc.plugin:
        return message
    close = closest(exc.plugin, {i.name for i in available})
    if close is None:
        return message
    head, sep, rest = message.partition("; ")
    return f"{head} (did you mean {close!r}?){sep}{rest}"
