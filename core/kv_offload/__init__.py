"""kv-offload: KV-cache block offloading from GPU to CPU and slower tiers, with pluggable
eviction policies, storage tiers and lifecycle hooks.

``__all__`` is what an engine integrator imports: building a stack, calling it, reading its
statistics, and the errors worth catching. Plugin authors import from the module of their
kind (``kv_offload.policies``, ``kv_offload.tiering``, ``kv_offload.admission``,
``kv_offload.plugins`` for hooks, ``kv_offload.errors``); each of those modules' ``__all__``
is documented in docs/plugin-guide.md ("Plugin-author API"). Names this package exported
before that split no longer import from here: importing one is an ``ImportError`` naming the
module that exports it (CHANGELOG.md).
"""

from __future__ import annotations

from typing import Any

from .base import OffloadingManager
from .buffer import CPUKVBuffer
from .build import build_manager
from .config import StackConfig, load_config
from .cpu import CPUOffloadingManager
from .errors import ConcurrentUseError, ConfigError, KVOffloadError, ManagerError, PluginError
from .keys import OffloadKey, get_offload_block_hash, get_offload_group_idx, make_offload_key
from .synchronized import SynchronizedManager, synchronized
from .tier_types import OffloadPolicy, RequestOffloadingContext, TierFilter
from .tiering import TieringOffloadingManager, TieringStats, TierStats
from .types import (
    CPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
)

__all__ = [
    # building a stack
    "build_manager",
    "load_config",
    "StackConfig",
    # the managers
    "OffloadingManager",
    "CPUOffloadingManager",
    "TieringOffloadingManager",
    "synchronized",
    "SynchronizedManager",
    "CPUKVBuffer",
    # calling them
    "ReqContext",
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "LookupResult",
    "LoadStoreSpec",
    "CPULoadStoreSpec",
    "PrepareStoreOutput",
    "RequestOffloadingContext",
    "OffloadPolicy",
    "TierFilter",
    # what they report
    "OffloadingEvent",
    "OffloadingStats",
    "TieringStats",
    "TierStats",
    # errors worth catching (every one: kv_offload.errors)
    "KVOffloadError",
    "ConfigError",
    "ManagerError",
    "PluginError",
    "ConcurrentUseError",
]

#: Names exported here before the integrator / plugin-author split -> the module that
#: exports them now (the error for an old import says where to import it from).
_MOVED_TO: dict[str, str] = {
    **dict.fromkeys(
        (
            "DuplicateRegistrationError",
            "HookError",
            "InvalidArgumentError",
            "InvalidKeyError",
            "KeyStateError",
            "PluginConflictError",
            "PluginImportError",
            "PluginNotFoundError",
            "PluginSettingsError",
            "PluginTypeError",
            "PluginValidationError",
        ),
        "kv_offload.errors",
    ),
    **dict.fromkeys(("BlockStatus", "CachePolicy", "CachePolicyFactory"), "kv_offload.policies"),
    **dict.fromkeys(
        (
            "AsyncLookup",
            "AsyncLookupStats",
            "JobDirection",
            "JobMetadata",
            "JobResult",
            "Locality",
            "Medium",
            "OffloadingConfig",
            "SecondaryTierFactory",
            "SecondaryTierManager",
            "TierMatcher",
        ),
        "kv_offload.tiering",
    ),
    **dict.fromkeys(("BackpressureDetector", "DropPolicy"), "kv_offload.tiering.backpressure"),
    **dict.fromkeys(
        (
            "ExperimentalPluginWarning",
            "KVOffloadPluginManager",
            "PluginInfo",
            "create_plugin_manager",
            "get_plugin_manager",
            "hookimpl",
            "hookspec",
            "hookspecs",
        ),
        "kv_offload.plugins",
    ),
    "SizeHistogram": "kv_offload.types",
}


def __getattr__(name: str) -> Any:
    module = _MOVED_TO.get(name)
    if module is None:
        raise AttributeError(f"module 'kv_offload' has no attribute {name!r}")
    # An ImportError, not an AttributeError: ``from kv_offload import NAME`` turns the latter
    # into a bare "cannot import name", and the user would not learn where NAME went.
    raise ImportError(
        f"kv_offload.{name} moved: import it from {module} (from {module} import {name}); "
        f"kv_offload no longer exports it (CHANGELOG.md)",
        name="kv_offload",
    )
