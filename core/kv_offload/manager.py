"""The CPU block manager: slots, reference counts, events and the request flow.

It runs in the scheduler and never touches KV bytes: it decides which CPU slot holds which
block, and when a slot may be read, written or reused. The eviction policy is a plugin
resolved by name (:class:`~kv_offload.policy_factory.CachePolicyFactory`).

Every public method validates its whole input before changing anything, so a call that raises
leaves the manager exactly as it was: no lost blocks, no leaked pins or slots.
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import compress, repeat
from operator import is_
from typing import Any

from .block_status import PENDING_REF_CNT, BlockStatus, bind_block_status
from .buffer import CPUKVBuffer
from .errors import (
    ConfigError,
    HookError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyStateError,
    KVOffloadError,
    ManagerError,
    PluginError,
)
from .events import OffloadingEvent
from .hooks import HookCallers, KVOffloadPluginManager, get_plugin_manager, register_if_hookimpl
from .keys import OffloadKey
from .lookup import LookupResult
from .policy import CachePolicy
from .policy_factory import CachePolicyFactory
from .request import ReqContext
from .spec import CPULoadStoreSpec, PrepareStoreOutput
from .stats import OffloadingStats

__all__ = ["CPUOffloadingManager"]

MEDIUM_CPU = "CPU"

_HIT = LookupResult.HIT
_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING


def _short(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_ctx(req_context: Any, operation: str) -> None:
    if getattr(req_context, "req_id", None) is None:
        raise InvalidArgumentError(
            f"{operation}: req_context must be a ReqContext with a req_id, got "
            f"{_short(req_context)}; pass ReqContext(req_id=...)"
        )


def _hashable(key: object) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _as_list(keys: Any, operation: str) -> list[Any]:
    """A batch of keys as a list; a single key or a non-iterable is a caller's mistake."""
    if isinstance(keys, (bytes, bytearray, str)):
        raise InvalidArgumentError(
            f"{operation}: keys must be a collection of offload keys, got a single "
            f"{type(keys).__name__} {_short(keys)}; pass [key]"
        )
    try:
        return list(keys)
    except TypeError:
        raise InvalidArgumentError(
            f"{operation}: keys must be a collection of offload keys, got "
            f"{type(keys).__name__} {_short(keys)}"
        ) from None


def _malformed_keys(key_list: list[Any], operation: str) -> InvalidArgumentError:
    """The precise error for a batch that is unhashable or repeats a key (slow path)."""
    seen: set[Any] = set()
    for key in key_list:
        if not _hashable(key):
            return InvalidKeyError(
                f"{operation}: key {_short(key)} of type {type(key).__name__} is unhashable; "
                f"offload keys must be bytes (see kv_offload.make_offload_key)"
            )
        if key in seen:
            return InvalidArgumentError(
                f"{operation}: key {_short(key)} appears more than once in one call; "
                f"pass each key once"
            )
        seen.add(key)
    raise AssertionError("unreachable: the batch is well formed")  # pragma: no cover


_int_new = int.__new__


def _describe_victims(victims: Any, refs: list[int]) -> str:
    """What a policy's broken evict() returned, with each block's ref count when possible."""
    try:
        shown = [(key, refs[block]) for key, block in list(victims)[:5]]
        return f"(key, ref_cnt) {_short(shown)} ({len(victims)} in all)"
    except Exception:
        return _short(victims)


#: A slot whose store failed, between the check and its release (never seen outside).
_FAILED_REF_CNT = -2


def _overridden(policy: CachePolicy, name: str) -> Any:
    """The policy's bound method ``name``, or ``None`` if it is the base class's no-op."""
    if getattr(type(policy), name) is getattr(CachePolicy, name):
        return None
    return getattr(policy, name)


class CPUOffloadingManager:
    """Tracks which block lives in which CPU slot, with a pluggable eviction policy.

    ``cache_policy`` names an installed policy plugin (``"lru"`` by default, ``"arc"``, or any
    third-party name); ``cache_policy_module_path`` is the out-of-tree fallback. With
    ``enable_events`` the manager records :class:`OffloadingEvent` batches for
    :meth:`take_events`.
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
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise ConfigError(
                f"num_blocks must be an int, got {type(num_blocks).__name__} {num_blocks!r}"
            )
        if num_blocks <= 0:
            raise ConfigError(f"num_blocks must be > 0 (CPU tier size in blocks), got {num_blocks}")
        policy_cls = CachePolicyFactory.get_cache_policy_cls(cache_policy, cache_policy_module_path)
        try:
            policy = policy_cls(cache_capacity=num_blocks)
        except KVOffloadError:
            raise
        except Exception as exc:
            raise PluginError(
                f"policy {cache_policy!r} ({policy_cls.__module__}.{policy_cls.__qualname__}) "
                f"failed to initialise: {type(exc).__name__}: {exc}",
                kind="policy",
                plugin=cache_policy,
            ) from exc
        if kv_buffer is None and block_size_bytes is not None:
            kv_buffer = CPUKVBuffer(num_blocks, block_size_bytes)
        if kv_buffer is not None and kv_buffer.num_blocks != num_blocks:
            raise ConfigError(
                f"kv_buffer has {kv_buffer.num_blocks} rows but num_blocks is {num_blocks}"
            )
        self.kv_buffer = kv_buffer
        self.num_blocks = num_blocks
        self.cache_policy_name = cache_policy
        self._policy: CachePolicy = policy
        # Looked up once: the hottest call of the manager, often a bound C method.
        self._get = policy.get
        self._refs: list[int] = [PENDING_REF_CNT] * num_blocks
        self._status_cls: type[BlockStatus] = bind_block_status(self._refs)
        # Policy callbacks left as the base class's no-ops are not called at all.
        self._mark_evictable = _overridden(policy, "mark_evictable")
        self._mark_non_evictable = _overridden(policy, "mark_non_evictable")
        self._on_request_finished = _overridden(policy, "on_request_finished")
        self._on_request_access = _overridden(policy, "on_request_access")
        self._on_store_miss = _overridden(policy, "on_store_miss")
        self._num_allocated = 0
        self._free: list[BlockStatus] = []
        self._num_evictable = 0
        self._num_pending = 0
        self._num_pinned = 0
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._closed = False
        self._reset_counters()
        self.plugin_manager = plugin_manager if plugin_manager is not None else get_plugin_manager()
        self._hooks = HookCallers(self.plugin_manager)
        self._own_plugins = register_if_hookimpl(self.plugin_manager, policy)

    def _reset_counters(self) -> None:
        self._hits = 0
        self._misses = 0
        self._pending_lookups = 0
        self._stored = 0
        self._loaded = 0
        self._failed_stores = 0
        self._rejected_stores = 0
        self._evictions = 0

    # -- introspection --------------------------------------------------------------------

    @property
    def policy(self) -> CachePolicy:
        return self._policy

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._num_allocated + len(self._free)

    @property
    def num_resident_blocks(self) -> int:
        return self._num_allocated - len(self._free)

    def ref_count(self, key: OffloadKey) -> int | None:
        """``ref_cnt`` of a resident block (-1 pending, 0 idle, n pinned), else ``None``."""
        block = self._get(key)
        return None if block is None else self._refs[block]

    def block_id(self, key: OffloadKey) -> int | None:
        """The CPU slot of a resident block, else ``None``."""
        block = self._get(key)
        return None if block is None else int(block)

    # -- request lifecycle ----------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> None:
        _check_ctx(req_context, "on_new_request")
        if (hook := self._hooks.request_started) is not None:
            hook(manager=self, req_context=req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        _check_ctx(req_context, "on_request_finished")
        if self._on_request_finished is not None:
            self._on_request_finished(req_context)
        if (hook := self._hooks.request_finished) is not None:
            hook(manager=self, req_context=req_context)

    def on_schedule_end(self) -> None:
        """End of a scheduler step; nothing is deferred in the CPU-only manager."""

    # -- lookups and loads ----------------------------------------------------------------

    def _blocks_of(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str
    ) -> tuple[list[OffloadKey], list[BlockStatus | None]]:
        """The keys as a list, with each key's block (``None`` if absent).

        Raises, before anything changes, for a bad context or an unhashable key; the per-key
        diagnosis runs only on failure.
        """
        try:
            if req_context.req_id is None:
                raise AttributeError("req_id")
        except AttributeError:
            _check_ctx(req_context, operation)
        key_list = keys if type(keys) is list else _as_list(keys, operation)
        try:
            blocks = list(map(self._get, key_list))
        except TypeError:
            raise _malformed_keys(key_list, operation) from None
        return key_list, blocks

    def _batch(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str
    ) -> tuple[list[OffloadKey], set[OffloadKey], list[BlockStatus | None]]:
        """:meth:`_blocks_of` plus the keys as a set, raising for a repeated key."""
        key_list, blocks = self._blocks_of(keys, req_context, operation)
        key_set = set(key_list)  # hashable: every key was looked up
        if len(key_set) != len(key_list):
            raise _malformed_keys(key_list, operation)
        return key_list, key_set, blocks

    def _key_state_error(
        self,
        operation: str,
        key_list: list[OffloadKey],
        blocks: list[BlockStatus | None],
        wrong: Any,
        advice: str,
    ) -> KeyStateError:
        """Name the first key whose ref count ``wrong`` rejects (``None``: not resident)."""
        refs = self._refs
        for key, block in zip(key_list, blocks):
            count = None if block is None else refs[block]
            if wrong(count):
                state = {
                    None: "not in the CPU tier",
                    -1: "pending (its store is in flight)",
                    0: "idle (not pinned)",
                }.get(count, f"pinned {count} time(s)")
                return KeyStateError(
                    f"{operation}: key {_short(key)} is {state}; {advice}",
                    key=key,
                    operation=operation,
                )
        raise AssertionError("unreachable: no key is in a wrong state")  # pragma: no cover

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` if ``key`` is loadable now, ``PENDING`` if its store is in flight."""
        try:
            if req_context.req_id is None:
                raise AttributeError("req_id")
            block = self._get(key)
        except (AttributeError, TypeError):
            _check_ctx(req_context, "lookup")
            raise _malformed_keys([key], "lookup") from None
        if block is None:
            self._misses += 1
            return _MISS
        if self._refs[block] < 0:
            self._pending_lookups += 1
            return _PENDING
        self._hits += 1
        return _HIT

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        """Pin loadable blocks until :meth:`complete_load`; returns their slots in key order."""
        spec = CPULoadStoreSpec(self.pin(keys, req_context, "prepare_load"))
        if self._on_request_access is not None:
            self._on_request_access(keys if type(keys) is list else list(keys), req_context)
        return spec

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin blocks pinned by :meth:`prepare_load`."""
        key_list = keys if type(keys) is list else _as_list(keys, "complete_load")
        self._loaded += self.unpin(key_list, req_context, "complete_load")
        if (hook := self._hooks.blocks_loaded) is not None:
            hook(manager=self, keys=list(key_list), medium=MEDIUM_CPU, req_context=req_context)

    def pin(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str = "pin"
    ) -> list[BlockStatus]:
        """Protect readable blocks from eviction (one more reader each); returns their slots.

        ``prepare_load`` is this plus a spec; a tiered manager pins blocks it cascades.
        """
        key_list, _, blocks = self._batch(keys, req_context, operation)
        refs = self._refs
        # Loops, not C-level maps: loads are a handful of blocks, where a map's setup dominates.
        for block in blocks:
            if block is None or refs[block] < 0:
                raise self._key_state_error(
                    operation,
                    key_list,
                    blocks,
                    lambda c: c is None or c < 0,
                    "load only keys that lookup() answered HIT",
                )
        newly_pinned = 0
        for block in blocks:
            count = refs[block]  # type: ignore[index]
            if not count:
                newly_pinned += 1
            refs[block] = count + 1  # type: ignore[index]
        if newly_pinned:
            self._num_evictable -= newly_pinned
            self._num_pinned += newly_pinned
            if self._mark_non_evictable is not None:
                for key, block in zip(key_list, blocks):
                    if refs[block] == 1:  # type: ignore[index]
                        self._mark_non_evictable(key)
        return blocks  # type: ignore[return-value]

    def unpin(
        self, keys: Collection[OffloadKey], req_context: ReqContext, operation: str = "unpin"
    ) -> int:
        """Release one reader of each block; returns how many keys were unpinned."""
        key_list, _, blocks = self._batch(keys, req_context, operation)
        refs = self._refs
        for block in blocks:
            if block is None or refs[block] <= 0:
                raise self._key_state_error(
                    operation,
                    key_list,
                    blocks,
                    lambda c: c is None or c <= 0,
                    f"call {operation} only for keys pinned by "
                    + ("prepare_load" if operation == "complete_load" else "pin"),
                )
        released = 0
        for block in blocks:
            count = refs[block] - 1  # type: ignore[index]
            if not count:
                released += 1
            refs[block] = count  # type: ignore[index]
        if released:
            self._num_evictable += released
            self._num_pinned -= released
            if self._mark_evictable is not None:
                for key, block in zip(key_list, blocks):
                    if not refs[block]:  # type: ignore[index]
                        self._mark_evictable(key)
        return len(key_list)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks as recently used; keys not in the CPU tier are ignored."""
        if getattr(req_context, "req_id", None) is None:
            _check_ctx(req_context, "touch")
        key_list = keys if type(keys) is list else _as_list(keys, "touch")
        try:
            unique = len(set(key_list)) == len(key_list)
        except TypeError:
            unique = False
        if not unique:
            raise _malformed_keys(key_list, "touch")
        self._policy.touch(key_list, req_context)

    # -- stores ---------------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        *,
        protected: Collection[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not yet stored, evicting if needed.

        Eviction is all or nothing and never takes a pending or pinned block, nor any of
        ``keys`` or ``protected`` (blocks a caller is about to load). Returns ``None``, with no
        state change, when not enough blocks can be evicted.
        """
        if self._closed:
            self._check_open("prepare_store")
        key_list, key_set, blocks = self._batch(keys, req_context, "prepare_store")
        if self._on_request_access is not None:
            self._on_request_access(key_list, req_context)
        if protected:
            key_set = key_set.union(protected)
        count = blocks.count(None)
        if count == len(key_list):
            to_store = key_list[:]
        elif count:
            to_store = list(compress(key_list, map(is_, blocks, repeat(None))))
        else:
            return PrepareStoreOutput([], CPULoadStoreSpec(()), [])
        if (hook := self._hooks.store_admission) is not None:
            to_store = self._admit(hook, to_store, req_context)
            count = len(to_store)
            if not count:
                return PrepareStoreOutput([], CPULoadStoreSpec(()), [])
        if self._on_store_miss is not None:
            self._on_store_miss(to_store, req_context)
        shortfall = count - (self.num_blocks - self._num_allocated + len(self._free))
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            if shortfall > self._num_evictable:
                self._rejected_stores += 1
                return None
            victims = self._policy.evict(shortfall, key_set)
            if victims is None:
                self._rejected_stores += 1
                return None
            evicted = self._take_victims(victims, shortfall, key_set)
            if self._events is not None:
                self._events.append(OffloadingEvent(evicted, MEDIUM_CPU, removed=True))
        new_blocks = self._allocate(count)
        self._policy.insert_many(to_store, new_blocks)
        self._num_pending += count
        output = PrepareStoreOutput(to_store, CPULoadStoreSpec(new_blocks), evicted)
        if evicted and (hook := self._hooks.blocks_evicted) is not None:
            try:
                hook(manager=self, keys=list(evicted), medium=MEDIUM_CPU, req_context=req_context)
            except HookError as exc:
                exc.result = output  # the slots are allocated: the caller must still use them
                raise
        return output

    def _admit(
        self, hook: Any, to_store: list[OffloadKey], req_context: ReqContext
    ) -> list[OffloadKey]:
        """The keys the store-admission hook lets in, in the caller's order."""
        admitted = hook(manager=self, keys=list(to_store), req_context=req_context)
        if admitted is None:
            return to_store
        try:
            allowed = set(admitted)
        except TypeError:
            raise HookError(
                f"kv_offload_store_admission returned {admitted!r}; it must return a list of "
                f"keys or None",
                kind="hook",
            ) from None
        return [key for key in to_store if key in allowed]

    def _take_victims(
        self, victims: list[tuple[OffloadKey, BlockStatus]], expected: int, protected: set[Any]
    ) -> list[OffloadKey]:
        """Check a policy's victims against the evict() contract, then free their slots.

        The policy is a plugin: a victim that is pinned, pending or protected would have its
        bytes overwritten while in use, so the contract is checked here, not trusted.
        """
        refs = self._refs
        try:
            keys, blocks = zip(*victims)
            broken = (
                len(keys) != expected
                or any(map(refs.__getitem__, blocks))
                or not protected.isdisjoint(keys)
            )
        except (TypeError, ValueError, IndexError):
            broken = True
        if broken:
            raise PluginError(
                f"policy {self.cache_policy_name!r} broke the evict() contract: asked for "
                f"{expected} (key, BlockStatus) pairs of idle, unprotected blocks, got "
                f"{_describe_victims(victims, refs)}; fix the policy's evict()",
                kind="policy",
                plugin=self.cache_policy_name,
            )
        self._free.extend(blocks)
        self._num_evictable -= expected
        self._evictions += expected
        return list(keys)

    def _allocate(self, count: int) -> list[BlockStatus]:
        """``count`` slots, marked pending: never-used slots first, then freed ones."""
        free = self._free
        refs = self._refs
        fresh = self.num_blocks - self._num_allocated
        if fresh >= count:
            fresh = count
            blocks = []
        else:
            blocks = free[len(free) - count + fresh :]
            del free[len(free) - count + fresh :]
            for block in blocks:
                refs[block] = PENDING_REF_CNT
            if not fresh:  # the steady state of a full cache
                return blocks
        start = self._num_allocated
        status_cls = self._status_cls
        # int.__new__ skips BlockStatus.__new__'s per-object table write; done as a slice.
        new = [_int_new(status_cls, i) for i in range(start, start + fresh)]
        refs[start : start + fresh] = [PENDING_REF_CNT] * fresh
        self._num_allocated += fresh
        return new + blocks

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Make stored blocks loadable, or free their slots when ``success`` is false."""
        # Repeated keys are caught by the marking pass below, without building a set.
        key_list, blocks = self._blocks_of(keys, req_context, "complete_store")
        refs = self._refs
        count = len(key_list)
        # One pass checks and marks. A block that is not pending (absent, loadable, or marked
        # already because its key repeats) stops it, and the marks made so far are undone.
        mark = 0 if success else _FAILED_REF_CNT
        done = 0
        for block in blocks:
            if block is None or refs[block] != PENDING_REF_CNT:
                break
            refs[block] = mark
            done += 1
        if done != count:
            for block in blocks[:done]:
                refs[block] = PENDING_REF_CNT  # type: ignore[index]
            if len(set(key_list)) != count:
                raise _malformed_keys(key_list, "complete_store")
            raise self._key_state_error(
                "complete_store",
                key_list,
                blocks,
                lambda c: c != PENDING_REF_CNT,
                "it was never prepared for storing: pass the keys_to_store of prepare_store",
            )
        self._num_pending -= count
        if success:
            self._num_evictable += count
            self._stored += count
            if self._mark_evictable is not None:
                for key in key_list:
                    self._mark_evictable(key)
            if self._events is not None and key_list:
                self._events.append(OffloadingEvent(list(key_list), MEDIUM_CPU, removed=False))
            if (hook := self._hooks.blocks_stored) is not None:
                hook(
                    manager=self,
                    keys=list(key_list),
                    medium=MEDIUM_CPU,
                    req_context=req_context,
                )
        else:
            remove = self._policy.remove
            for key in key_list:
                remove(key)
            self._free.extend(blocks)  # type: ignore[arg-type]
            self._failed_stores += count
            if (hook := self._hooks.store_failed) is not None:
                hook(
                    manager=self,
                    keys=list(key_list),
                    medium=MEDIUM_CPU,
                    req_context=req_context,
                )

    # -- whole-cache operations -----------------------------------------------------------

    def take_events(self) -> list[OffloadingEvent]:
        """The events recorded since the last call (empty unless ``enable_events``)."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> None:
        """Drop every block, pinned and pending ones included; counters restart at zero.

        In-flight transfers are forgotten: completing them afterwards raises
        :class:`KeyStateError`, as for keys that were never prepared.
        """
        self._policy.clear()
        self._num_allocated = 0
        self._free.clear()
        self._num_evictable = 0
        self._num_pending = 0
        self._num_pinned = 0
        self._reset_counters()
        if (hook := self._hooks.cache_reset) is not None:
            hook(manager=self)

    def get_stats(self) -> OffloadingStats:
        return OffloadingStats(
            capacity=self.num_blocks,
            lookups=self._hits + self._misses + self._pending_lookups,
            hits=self._hits,
            misses=self._misses,
            pending=self._pending_lookups,
            stored_blocks=self._stored,
            loaded_blocks=self._loaded,
            failed_stores=self._failed_stores,
            rejected_stores=self._rejected_stores,
            evictions=self._evictions,
            resident_blocks=self.num_resident_blocks,
            free_blocks=self.num_free_blocks,
            pending_blocks=self._num_pending,
            pinned_blocks=self._num_pinned,
            evictable_blocks=self._num_evictable,
        )

    def shutdown(self) -> None:
        """Release everything; later stores raise :class:`ManagerError`.

        Shutdown always completes; a hook plugin that raises on the way is reported after.
        """
        if self._closed:
            return
        self._closed = True
        errors: list[HookError] = []
        try:
            self.reset_cache()
        except HookError as exc:
            errors.append(exc)
        try:
            if (hook := self._hooks.shutdown) is not None:
                hook(manager=self)
        except HookError as exc:
            errors.append(exc)
        finally:
            for plugin in self._own_plugins:
                self.plugin_manager.unregister(plugin)
        if errors:
            raise errors[0]

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise ManagerError(f"{operation}: the manager was shut down; create a new one")
