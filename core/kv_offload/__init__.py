"""kv-offload: KV-cache block offloading from GPU to CPU and slower tiers, with pluggable
eviction policies, storage tiers and lifecycle hooks."""

from __future__ import annotations

from .async_lookup import AsyncLookup, AsyncLookupStats
from .base import OffloadingManager
from .block_status import BlockStatus
from .buffer import CPUKVBuffer
from .build import build_manager
from .config import StackConfig, load_config
from .cpu import CPUOffloadingManager
from .errors import (
    ConcurrentUseError,
    ConfigError,
    DuplicateRegistrationError,
    HookError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyStateError,
    KVOffloadError,
    ManagerError,
    PluginConflictError,
    PluginError,
    PluginImportError,
    PluginNotFoundError,
    PluginSettingsError,
    PluginTypeError,
    PluginValidationError,
)
from .keys import OffloadKey, get_offload_block_hash, get_offload_group_idx, make_offload_key
from .plugins import (
    ExperimentalPluginWarning,
    KVOffloadPluginManager,
    PluginInfo,
    create_plugin_manager,
    get_plugin_manager,
)
from .plugins import hookspecs as hookspecs
from .plugins.hookspecs import hookimpl, hookspec
from .policies import CachePolicy, CachePolicyFactory
from .synchronized import SynchronizedManager, synchronized
from .tier_types import (
    Locality,
    Medium,
    OffloadPolicy,
    RequestOffloadingContext,
    TierFilter,
    TierMatcher,
)
from .tiering import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierFactory,
    SecondaryTierManager,
    TieringOffloadingManager,
    TieringStats,
    TierStats,
)
from .tiering.backpressure import BackpressureDetector, DropPolicy
from .types import (
    CPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
    SizeHistogram,
)

__all__ = [
    "AsyncLookup",
    "AsyncLookupStats",
    "build_manager",
    "load_config",
    "OffloadingManager",
    "StackConfig",
    "BlockStatus",
    "CPUKVBuffer",
    "JobDirection",
    "JobMetadata",
    "JobResult",
    "OffloadingConfig",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TieringOffloadingManager",
    "TieringStats",
    "TierStats",
    "CachePolicy",
    "CachePolicyFactory",
    "ConcurrentUseError",
    "ConfigError",
    "create_plugin_manager",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "DuplicateRegistrationError",
    "ExperimentalPluginWarning",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "get_plugin_manager",
    "HookError",
    "hookimpl",
    "hookspec",
    "InvalidArgumentError",
    "InvalidKeyError",
    "KeyStateError",
    "KVOffloadError",
    "KVOffloadPluginManager",
    "LoadStoreSpec",
    "LookupResult",
    "make_offload_key",
    "ManagerError",
    "OffloadingEvent",
    "OffloadingStats",
    "SizeHistogram",
    "OffloadKey",
    "PluginConflictError",
    "PluginError",
    "PluginImportError",
    "PluginInfo",
    "PluginNotFoundError",
    "PluginSettingsError",
    "PluginTypeError",
    "PluginValidationError",
    "PrepareStoreOutput",
    "ReqContext",
    "synchronized",
    "SynchronizedManager",
    "BackpressureDetector",
    "DropPolicy",
    "Locality",
    "Medium",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "TierFilter",
    "TierMatcher",
]
