"""A CPU manager's state and what is not the request flow: construction (the checked size,
the policy, the plugin wiring), the counters behind its stats, introspection, events, reset
and shutdown."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ..admission import AdmissionPolicy, overrides
from ..base import OffloadingManager
from ..block_status import BlockStatus
from ..buffer import CPUKVBuffer
from ..concurrency import entry_guarded, new_entry_token, unguarded
from ..errors import ConfigError, InvalidArgumentError, ManagerError
from ..events import EventLog
from ..keys import OffloadKey
from ..plugins.construct import construct
from ..plugins.dispatch import HookCallers, HookErrorLog
from ..plugins.loading import KVOffloadPluginManager, get_plugin_manager, register_if_hookimpl
from ..policies import CachePolicy, CachePolicyFactory
from ..types import ALLOCATION_SIZE_BOUNDS, OffloadingEvent, OffloadingStats, SizeHistogram
from .eviction import Eviction
from .reuse_filter import DEFAULT_MAX_TRACKER_SIZE, cpu_admission
from .slots import SlotTable

if TYPE_CHECKING:
    from ..tiering.stats import TierStats

__all__ = ["ALLOCATION_SIZE_BOUNDS", "CPUManagerState", "Counters", "MEDIUM_CPU"]

MEDIUM_CPU = "CPU"


def check_num_blocks(num_blocks: Any, kv_buffer: CPUKVBuffer | None) -> None:
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
        raise ConfigError(
            f"num_blocks must be an int, got {type(num_blocks).__name__} {num_blocks!r}"
        )
    if num_blocks <= 0:
        raise ConfigError(f"num_blocks must be > 0 (CPU tier size in blocks), got {num_blocks}")
    # Rows past num_blocks are not the CPU tier's: a tiered manager's write-back staging.
    if kv_buffer is not None and kv_buffer.num_blocks < num_blocks:
        raise ConfigError(
            f"kv_buffer has {kv_buffer.num_blocks} rows but num_blocks is {num_blocks}"
        )


def build_policy(name: str, module_path: str | None, num_blocks: int) -> CachePolicy:
    """The policy plugin called ``name``, sized for ``num_blocks``."""
    policy_cls = CachePolicyFactory.get_cache_policy_cls(name, module_path)
    return construct("policy", name, policy_cls, cache_capacity=num_blocks)


def overridden(policy: CachePolicy, name: str) -> Any:
    """The policy's bound method ``name``, or ``None`` if it is the base class's no-op (the
    manager then skips the call altogether)."""
    if getattr(type(policy), name) is getattr(CachePolicy, name):
        return None
    return getattr(policy, name)


def plugin_setup(
    plugin_manager: KVOffloadPluginManager | None, policy: CachePolicy
) -> tuple[KVOffloadPluginManager, HookCallers, list[Any]]:
    """The plugin manager (the process-wide one by default), its hook callers, and the
    policy registered as a hook plugin if it carries hookimpls."""
    if plugin_manager is not None and not isinstance(plugin_manager, KVOffloadPluginManager):
        raise InvalidArgumentError(
            f"plugin_manager must be a KVOffloadPluginManager "
            f"(kv_offload.plugins.create_plugin_manager()), got {type(plugin_manager).__name__}"
        )
    pm = plugin_manager if plugin_manager is not None else get_plugin_manager()
    return pm, HookCallers(pm), register_if_hookimpl(pm, policy)


class Counters:
    """The CPU manager's cumulative counters (restart at zero on ``reset_cache``)."""

    __slots__ = (
        "allocation_sizes",
        "allocation_total",
        "evictions",
        "failed_stores",
        "hits",
        "loaded",
        "misses",
        "pending_lookups",
        "rejected_stores",
        "stored",
        "stores_skipped",
    )

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.pending_lookups = 0
        self.stored = 0
        self.loaded = 0
        self.failed_stores = 0
        self.rejected_stores = 0
        self.evictions = 0
        self.stores_skipped = 0
        #: prepare_store calls per allocation-size bucket (ALLOCATION_SIZE_BOUNDS, then +Inf).
        self.allocation_sizes = [0] * (len(ALLOCATION_SIZE_BOUNDS) + 1)
        self.allocation_total = 0

    def observe_allocation(self, count: int) -> None:
        """One ``prepare_store`` that asked for ``count`` slots (vLLM's allocation size)."""
        self.allocation_sizes[bisect_left(ALLOCATION_SIZE_BOUNDS, count)] += 1
        self.allocation_total += count

    def snapshot(self, capacity: int, slots: SlotTable) -> OffloadingStats:
        return OffloadingStats(
            capacity=capacity,
            lookups=self.hits + self.misses + self.pending_lookups,
            hits=self.hits,
            misses=self.misses,
            pending=self.pending_lookups,
            stored_blocks=self.stored,
            loaded_blocks=self.loaded,
            failed_stores=self.failed_stores,
            rejected_stores=self.rejected_stores,
            evictions=self.evictions,
            resident_blocks=slots.num_resident,
            free_blocks=slots.num_free,
            pending_blocks=slots.num_pending,
            pinned_blocks=slots.num_pinned,
            evictable_blocks=slots.num_evictable,
            stores_skipped=self.stores_skipped,
            allocation_sizes=SizeHistogram(
                ALLOCATION_SIZE_BOUNDS, tuple(self.allocation_sizes), self.allocation_total
            ),
        )


class CPUManagerState(OffloadingManager):
    """A CPU manager's state and everything outside the request flow.

    ``cache_policy`` names an installed policy plugin (``"lru"`` by default, ``"arc"``, or any
    third-party name); ``cache_policy_module_path`` is the out-of-tree fallback. With
    ``enable_events`` the manager records :class:`~kv_offload.OffloadingEvent` batches in
    :attr:`event_log` for :meth:`take_events`. ``store_threshold`` (2 or more) stores a
    block from its ``store_threshold``-th offer on, offers counted for at most
    ``max_tracker_size`` keys, as vLLM does; ``admission`` (an
    :class:`~kv_offload.admission.AdmissionPolicy`, exclusive with ``store_threshold``) is
    any other rule for which offered blocks the tier stores (:mod:`~kv_offload.cpu.reuse_filter`).
    """

    medium = MEDIUM_CPU

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        block_size_bytes: int | None = None,
        kv_buffer: CPUKVBuffer | None = None,
        plugin_manager: KVOffloadPluginManager | None = None,
        store_threshold: int = 0,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        check_num_blocks(num_blocks, kv_buffer)
        chosen = cpu_admission(num_blocks, store_threshold, max_tracker_size, admission)
        policy = build_policy(cache_policy, cache_policy_module_path, num_blocks)
        if kv_buffer is None and block_size_bytes is not None:
            kv_buffer = CPUKVBuffer(num_blocks, block_size_bytes)
        self.kv_buffer = kv_buffer
        self.num_blocks = num_blocks
        self.cache_policy_name = cache_policy
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        #: What the tier asks before it stores (``store-threshold`` for ``store_threshold``
        #: 2 or more, or the ``admission`` given); ``None``: every offered block is stored.
        self.admission: AdmissionPolicy | None = chosen
        self._admission_finished = (
            overrides(chosen, "on_request_finished") if chosen is not None else None
        )
        self._policy: CachePolicy = policy
        self._get = policy.fast_get()  # bound once: the manager's hottest call
        self._slots = SlotTable(num_blocks)
        self._refs = self._slots.refs
        self._eviction = Eviction(policy, cache_policy, self._slots, self._fail_reads)
        # Policy callbacks left as the base class's no-ops are not called at all.
        self._mark_evictable = overridden(policy, "mark_evictable")
        self._mark_non_evictable = overridden(policy, "mark_non_evictable")
        self._on_request_finished = overridden(policy, "on_request_finished")
        self._on_request_access = overridden(policy, "on_request_access")
        self._on_store_miss = overridden(policy, "on_store_miss")
        #: The stack's ordered event log (``None`` unless ``enable_events``).
        self.event_log: EventLog | None = EventLog() if enable_events else None
        self._closed = False
        #: Set by a tiered manager built over this CPU tier: request tier filters are then
        #: that manager's to check (a CPU-only manager refuses a filter naming tiers).
        self.fronts_tiers = False
        #: Set by a tiered manager with a write-back tier: called with each eviction's keys
        #: and slots before the slots are freed, so it can take the victims' bytes.
        self.eviction_sink: Callable[[list[OffloadKey], list[BlockStatus]], None] | None = None
        self._entry = new_entry_token()  # taken by every request-flow call (concurrency.py)
        self.counters = Counters()
        self._errors = HookErrorLog()
        self.plugin_manager, self.hooks, self._own_plugins = plugin_setup(plugin_manager, policy)

    # -- introspection --------------------------------------------------------------------

    @property
    def policy(self) -> CachePolicy:
        return self._policy

    @property
    def num_free_blocks(self) -> int:
        return self._slots.num_free

    @property
    def num_resident_blocks(self) -> int:
        return self._slots.num_resident

    @property
    def num_storable_blocks(self) -> int:
        """Slots a ``prepare_store`` could have now: free ones plus idle (evictable) ones."""
        return self._slots.num_free + self._slots.num_evictable

    def ref_count(self, key: OffloadKey) -> int | None:
        """``ref_cnt`` of a resident block (-1 pending, 0 idle, n pinned), else ``None``."""
        block = self._get(key)
        return None if block is None else self._refs[block]

    def block_id(self, key: OffloadKey) -> int | None:
        """The CPU slot of a resident block, else ``None``."""
        block = self._get(key)
        return None if block is None else int(block)

    # -- whole-cache operations -----------------------------------------------------------

    @entry_guarded
    def take_events(self) -> list[OffloadingEvent]:
        """The events recorded since the last call (empty unless ``enable_events``); a failed
        store's metadata-only removal is left out for keys stored again since."""
        if self.event_log is None:
            return []
        return self.event_log.take(self._holds)

    def _holds(self, medium: str, key: OffloadKey) -> bool:
        """Whether ``medium`` holds ``key`` now (pending or loadable), for :meth:`take_events`:
        only the CPU tier's failed stores are metadata-only removals."""
        return medium == MEDIUM_CPU and self._policy.get(key) is not None

    @entry_guarded
    def reset_cache(self) -> None:
        """Drop every block, pinned and pending ones included; counters restart at zero.

        In-flight transfers are forgotten: completing them afterwards raises
        :class:`~kv_offload.errors.KeyStateError`, as for keys that were never prepared. The reuse
        filter's offer counts stay (they describe the engine's offers, not the cache; vLLM
        keeps them too); ``stores_skipped`` restarts with the other counters.
        """
        self._policy.clear()
        self._slots.clear()
        self._get = self._policy.fast_get()  # also recovers a failed manager (cpu/eviction.py)
        self.counters = Counters()
        if (hook := self.hooks.cache_reset) is not None:
            hook(manager=self)

    _reset_cache = unguarded(reset_cache)

    def _fail_reads(self, message: str) -> None:
        """Every later cache read raises ``message`` (a policy's ``evict()`` lost track of
        blocks: cpu/eviction.py), until ``reset_cache()`` binds the policy's lookup again."""

        def failed(key: Any) -> NoReturn:
            raise ManagerError(message)

        self._get = failed

    _held_take_events = unguarded(take_events)

    def get_stats(self) -> OffloadingStats:
        return self.counters.snapshot(self.num_blocks, self._slots)

    def cpu_stats(self) -> OffloadingStats:
        return self.get_stats()

    def tier_stats(self) -> list[TierStats]:
        return []

    @entry_guarded
    def shutdown(self) -> None:
        """Release everything; later lookups, new requests and stores raise
        :class:`~kv_offload.ManagerError`.

        Shutdown always completes; a hook plugin that raises on the way is reported after.
        """
        if self._closed:
            return
        self._closed = True
        errors = self._errors
        try:
            errors.call(self._reset_cache)  # this call holds the entry guard
            errors.fire(self.hooks.shutdown, manager=self)
        finally:
            for plugin in self._own_plugins:
                self.plugin_manager.unregister(plugin)
        errors.raise_pending()

    _held_shutdown = unguarded(shutdown)
