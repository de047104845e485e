"""kv-offload: KV-cache block offloading from GPU to CPU and slower tiers, with pluggable
eviction policies, storage tiers and lifecycle hooks."""

from __future__ import annotations

from .block_status import BlockStatus
from .buffer import CPUKVBuffer
from .build import build_manager
from .config import StackConfig, load_config
from .errors import (
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
from .events import OffloadingEvent
from .hooks import KVOffloadPluginManager, create_plugin_manager, get_plugin_manager
from .hookspecs import hookimpl, hookspec
from .keys import OffloadKey, get_offload_block_hash, get_offload_group_idx, make_offload_key
from .lookup import LookupResult
from .manager import CPUOffloadingManager
from .plugins import ExperimentalPluginWarning, PluginInfo
from .policy import CachePolicy
from .policy_factory import CachePolicyFactory
from .request import ReqContext
from .spec import CPULoadStoreSpec, LoadStoreSpec, PrepareStoreOutput
from .stats import OffloadingStats
from .tier import JobDirection, JobMetadata, JobResult, OffloadingConfig, SecondaryTierManager
from .tier_factory import SecondaryTierFactory
from .tiering import TieringOffloadingManager, TieringStats, TierStats

__all__ = [
    "build_manager",
    "load_config",
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
]
