"""The CPU block manager: which CPU slot holds which block, and when a slot may be read,
written or reused; it never touches KV bytes.

One class, as vLLM's ``cpu/manager.py`` is; its collaborators get explicit arguments: the slot
table and ref counts (:class:`~kv_offload.cpu.slots.SlotTable`), the eviction step
(:class:`~kv_offload.cpu.eviction.Eviction`), the policy plugin (which key holds which slot),
the counters (:mod:`~kv_offload.cpu.counters`), and what it is built from
(:mod:`~kv_offload.cpu.construction`). Every public method checks its whole input, then
changes state: a call that raises a :class:`~kv_offload.ManagerError` leaves the manager as it
was. The checks are yes-or-no on the fast path; :mod:`~kv_offload.cpu.validation` builds the
error on the slow path.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NoReturn

from ..admission import AdmissionPolicy, checked_admit, overrides
from ..base import OffloadingManager
from ..block_status import BlockStatus
from ..buffer import CPUKVBuffer
from ..concurrency import entry_guarded, new_entry_token, take_for_good, unguarded
from ..errors import ManagerError
from ..events import EventLog
from ..keys import OffloadKey
from ..plugins.dispatch import HookErrorLog
from ..plugins.loading import KVOffloadPluginManager
from ..policies import CachePolicy
from ..types import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
    check_load_filter,
)
from . import validation as check
from .construction import build_policy, check_num_blocks, overridden, plugin_setup
from .counters import Counters
from .eviction import Eviction
from .handover import CPUCalls
from .reuse_filter import DEFAULT_MAX_TRACKER_SIZE, cpu_admission
from .slots import SlotTable, without_block

__all__ = ["CPUOffloadingManager", "MEDIUM_CPU"]

MEDIUM_CPU = "CPU"
_HIT, _MISS, _PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING


def _empty_store() -> PrepareStoreOutput:
    return PrepareStoreOutput([], CPULoadStoreSpec(()), [])


class CPUOffloadingManager(OffloadingManager):
    """Tracks which block lives in which CPU slot, with a pluggable eviction policy.

    ``cache_policy`` names an installed policy plugin (``"lru"`` by default, ``"arc"``, or any
    third-party name); ``cache_policy_module_path`` is the out-of-tree fallback. With
    ``enable_events`` the manager records :class:`~kv_offload.OffloadingEvent` batches in
    :attr:`event_log` for :meth:`take_events`. ``store_threshold`` (2 or more) stores a block
    from its ``store_threshold``-th offer on, offers counted for at most ``max_tracker_size``
    keys, as vLLM does; ``admission`` (an :class:`~kv_offload.admission.AdmissionPolicy`,
    exclusive with ``store_threshold``) is any other rule for which offered blocks the cache
    stores (:mod:`~kv_offload.cpu.reuse_filter`).

    Single-threaded: each request-flow method (and ``pin``/``unpin``, ``take_events``,
    ``reset_cache``, ``shutdown``) takes the entry guard first
    (:func:`~kv_offload.concurrency.entry_guarded`), so a second
    thread, or a hook calling back into the flow, gets :class:`~kv_offload.ConcurrentUseError`
    with nothing changed. ``get_stats()``, ``ref_count()``, ``block_id()`` and the ``num_*``
    properties are lock-free reads. Share it between threads with :func:`kv_offload.synchronized`.
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
        #: What the cache asks before it stores (``store-threshold`` for ``store_threshold``
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
        #: Called with each eviction's keys and slots before the slots are reused (their bytes
        #: still intact); given by the owner at :meth:`hand_over`.
        self._on_evict: Callable[[list[OffloadKey], list[BlockStatus]], None] | None = None
        self._entry = new_entry_token()  # taken by every request-flow call (concurrency.py)
        #: The manager this one was handed over to (its only caller), if any.
        self.owner: object | None = None
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

    # -- request lifecycle ----------------------------------------------------------------

    @entry_guarded
    def on_new_request(self, req_context: ReqContext, *, _alone: bool = True) -> None:
        """A request arrived. A request's load filter can name no store but this cache
        (``_alone``; an owner checks the filter itself: cpu/handover.py)."""
        if self._closed:
            raise check.closed_error("on_new_request")
        if getattr(req_context, "req_id", None) is None:
            check.check_context(req_context, "on_new_request")
        if _alone:
            check_load_filter(req_context)
        if (hook := self.hooks.request_started) is not None:
            hook(manager=self, req_context=req_context)

    @entry_guarded
    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._closed:
            raise check.closed_error("on_request_finished")
        if getattr(req_context, "req_id", None) is None:
            check.check_context(req_context, "on_request_finished")
        if self._on_request_finished is not None:
            self._on_request_finished(req_context)
        if self._admission_finished is not None:
            self._admission_finished(req_context)
        if (hook := self.hooks.request_finished) is not None:
            hook(manager=self, req_context=req_context)

    def on_schedule_end(self) -> None:
        """End of a scheduler step; nothing is deferred in the CPU-only manager."""

    # -- lookups and loads ----------------------------------------------------------------

    def _blocks_of(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        operation: str,
        distinct: bool = True,
    ) -> tuple[list[OffloadKey], list[BlockStatus | None]]:
        """The keys as a list, with each key's block (``None`` if absent); raises for a bad
        context, an unhashable key or (``distinct``) a repeated key before anything changes.
        A key that is not bytes is absent: the caller's refusal of absent keys names it."""
        if getattr(req_context, "req_id", None) is None:
            check.check_context(req_context, operation)
        key_list = keys if type(keys) is list else check.as_list(keys, operation)
        try:
            blocks = list(map(self._get, key_list))
        except ManagerError:  # a failed manager's reads (cpu/eviction.py)
            raise
        except Exception as exc:
            raise check.bad_batch(key_list, operation, exc, self.cache_policy_name) from exc
        if distinct and len(set(key_list)) != len(key_list):  # hashable: all were looked up
            raise check.bad_batch(key_list, operation)
        return key_list, blocks

    @entry_guarded
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` if ``key`` is loadable now, ``PENDING`` if its store is in flight."""
        try:  # the context's req_id is read as an attribute here, not with getattr
            req_id = req_context.req_id
            block = self._get(key)
        except ManagerError:  # a failed manager's reads (cpu/eviction.py)
            raise
        except Exception as exc:
            check.check_context(req_context, "lookup")
            raise check.bad_batch([key], "lookup", exc, self.cache_policy_name) from exc
        if req_id is None:
            check.check_context(req_context, "lookup")
        counters = self.counters
        if block is None:
            # Only misses pay these checks: the cache is empty after shutdown, and a value
            # that is not a key is never found.
            if self._closed:
                raise check.closed_error("lookup")
            if type(key) is not bytes:
                check.check_key(key, "lookup")
            counters.misses += 1
            return _MISS
        if self._refs[block] < 0:
            counters.pending_lookups += 1
            return _PENDING
        counters.hits += 1
        return _HIT

    @entry_guarded
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        """Pin loadable blocks until :meth:`complete_load`; returns their slots in key order."""
        spec = CPULoadStoreSpec(self._pin(keys, req_context, "prepare_load"))
        if self._on_request_access is not None:
            self._on_request_access(keys if type(keys) is list else list(keys), req_context)
        return spec

    @entry_guarded
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin blocks pinned by :meth:`prepare_load`."""
        key_list = keys if type(keys) is list else check.as_list(keys, "complete_load")
        self.counters.loaded += self._unpin(key_list, req_context, "complete_load")
        if (hook := self.hooks.blocks_loaded) is not None:
            hook(manager=self, keys=list(key_list), medium=MEDIUM_CPU, req_context=req_context)

    @entry_guarded
    def pin(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str = "pin"
    ) -> list[BlockStatus]:
        """Protect readable blocks from eviction (one more reader each); returns their slots.

        ``prepare_load`` is this plus a spec and the request's access; an owner pins blocks it
        copies elsewhere (cpu/handover.py).
        """
        key_list, blocks = self._blocks_of(keys, req_context, operation)
        pinned = self._slots.pin(blocks)
        if pinned is None:
            if self._closed:
                raise check.closed_error(operation)
            raise check.not_readable_error(operation, key_list, self._slots.counts(blocks))
        if self._mark_non_evictable is not None:
            refs = self._refs
            for key, block in zip(key_list, pinned):
                if refs[block] == 1:
                    self._mark_non_evictable(key)
        return pinned

    _pin = unguarded(pin)  # for prepare_load, which holds the entry guard

    @entry_guarded
    def unpin(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str = "unpin"
    ) -> int:
        """Release one reader of each block; returns how many keys were unpinned."""
        key_list, blocks = self._blocks_of(keys, req_context, operation)
        unpinned = self._slots.unpin(blocks)
        if unpinned is None:
            if self._closed:
                raise check.closed_error(operation)
            raise check.not_pinned_error(operation, key_list, self._slots.counts(blocks))
        if self._mark_evictable is not None:
            refs = self._refs
            for key, block in zip(key_list, unpinned):
                if not refs[block]:
                    self._mark_evictable(key)
        return len(key_list)

    _unpin = unguarded(unpin)  # for complete_load, which holds the entry guard

    @entry_guarded
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks as recently used; keys not in the cache are ignored."""
        if self._closed:
            raise check.closed_error("touch")
        if getattr(req_context, "req_id", None) is None:
            check.check_context(req_context, "touch")
        key_list = keys if type(keys) is list else check.as_list(keys, "touch")
        try:
            unique = len(set(key_list)) == len(key_list)
        except TypeError:
            unique = False
        if not unique:
            raise check.bad_batch(key_list, "touch")
        self._policy.touch(key_list, req_context)

    # -- stores ---------------------------------------------------------------------------

    @entry_guarded
    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        *,
        protected: Collection[OffloadKey] = (),
        _offered: bool = True,
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not yet stored, evicting if needed.

        Eviction is all or nothing and never takes a pending or pinned block, nor any of
        ``keys`` or ``protected`` (blocks a caller is about to load). Returns ``None``, with no
        state change but what the admission counted, when not enough blocks can be evicted.
        With an admission (``store_threshold`` or ``admission``), it is offered every key and
        only the absent keys it admits are stored; an admission that breaks its contract is a
        :class:`~kv_offload.errors.PluginError` naming it, raised before anything is stored.
        Blocks the engine did not offer (``_offered`` false: an owner's
        :attr:`~kv_offload.cpu.handover.CPUCalls.reserve`) are stored without asking.
        """
        if self._closed:
            raise check.closed_error("prepare_store")
        key_list, blocks = self._blocks_of(keys, req_context, "prepare_store", distinct=False)
        key_set = set(key_list)  # what eviction must spare, with ``protected``
        if len(key_set) != len(key_list):
            raise check.bad_batch(key_list, "prepare_store")
        if protected:
            key_set = check.protected_set(key_set, protected)
        to_store = without_block(key_list, blocks)
        if not check.all_keys(to_store):  # keys enter the cache here: the resident are keys
            check.check_keys(to_store, "prepare_store")
        if self._on_request_access is not None:
            self._on_request_access(key_list, req_context)
        if self.admission is not None and _offered:
            admission = self.admission
            admitted = set(checked_admit(admission, admission.plugin_name, key_list, req_context))
            count = len(to_store)
            to_store = [key for key in to_store if key in admitted]
            self.counters.stores_skipped += count - len(to_store)
        count = len(to_store)
        if not count:
            return _empty_store()
        if (hook := self.hooks.store_admission) is not None:
            answer = hook(manager=self, keys=list(to_store), req_context=req_context)
            to_store = check.admitted(answer, to_store)
            count = len(to_store)
            if not count:
                return _empty_store()
        if self._on_store_miss is not None:
            self._on_store_miss(to_store, req_context)
        shortfall = count - self._slots.num_free
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            chosen = self._eviction.choose(shortfall, key_set)
            if chosen is None:
                self.counters.rejected_stores += 1
                self.counters.observe_allocation(count)
                return None
            evicted, victim_blocks = chosen
            if (on_evict := self._on_evict) is not None:
                on_evict(evicted, victim_blocks)  # before the slots are reused: bytes intact
            self.counters.evictions += shortfall
            if self.event_log is not None:
                self.event_log.record(evicted, MEDIUM_CPU, True)
        # Counted once eviction can no longer raise: a broken policy leaves the stats as they were.
        self.counters.observe_allocation(count)
        new_blocks = self._slots.allocate(to_store)
        self._policy.insert_many(to_store, new_blocks)
        output = PrepareStoreOutput(to_store, CPULoadStoreSpec(new_blocks), evicted)
        if evicted and (hook := self.hooks.blocks_evicted) is not None:
            self._errors.fire(
                hook, manager=self, keys=list(evicted), medium=MEDIUM_CPU, req_context=req_context
            )
            self._errors.raise_pending(output)  # the slots are allocated: use them
        return output

    @entry_guarded
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Make stored blocks loadable, or free their slots when ``success`` is false."""
        if type(success) is not bool:
            check.check_success(success)
        # A repeated key is caught by the slot table (its block is pending only once).
        key_list, blocks = self._blocks_of(keys, req_context, "complete_store", distinct=False)
        if not self._slots.finish_store(blocks, success):
            if self._closed:
                raise check.closed_error("complete_store")
            raise check.storable_error(
                key_list, self._slots.counts(blocks), self._slots, self.cache_policy_name
            )
        if success:
            self.counters.stored += len(key_list)
            if self._mark_evictable is not None:
                for key in key_list:
                    self._mark_evictable(key)
            if self.event_log is not None and key_list:
                self.event_log.record(list(key_list), MEDIUM_CPU, False)
            hook = self.hooks.blocks_stored
        else:
            remove = self._policy.remove
            for key in key_list:
                remove(key)
            self.counters.failed_stores += len(key_list)
            if self.event_log is not None and key_list:
                self.event_log.record(list(key_list), MEDIUM_CPU, True, True)
            hook = self.hooks.store_failed
        if hook is not None:
            hook(manager=self, keys=list(key_list), medium=MEDIUM_CPU, req_context=req_context)

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
        only this cache's failed stores are metadata-only removals."""
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

    def get_stats(self) -> OffloadingStats:
        return self.counters.snapshot(self.num_blocks, self._slots)

    def cpu_stats(self) -> OffloadingStats:
        return self.get_stats()

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

    # -- the hand-over to an owner --------------------------------------------------------

    def hand_over(
        self,
        owner: object,
        on_evict: Callable[[list[OffloadKey], list[BlockStatus]], None] | None = None,
    ) -> CPUCalls:
        """Make ``owner`` (a manager built over this one, which takes the entry guard of each
        call itself) this manager's only caller, and return the request flow it drives
        (:mod:`kv_offload.cpu.handover`). ``on_evict`` is called with each eviction's keys and
        slots before the slots are reused, their bytes still intact.

        From now on the request-flow methods of this manager refuse every other caller with
        :class:`~kv_offload.ConcurrentUseError` naming ``owner``; snapshot reads stay open. A
        manager is handed over once: a second owner is refused.
        """
        if self.owner is not None:
            raise check.handed_over_twice(self, self.owner, owner)
        take_for_good(self, "hand_over")
        self.owner = owner
        self._on_evict = on_evict
        return CPUCalls(self)
