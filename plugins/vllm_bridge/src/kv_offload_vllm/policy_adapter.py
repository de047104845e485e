"""A kv-offload eviction policy as a vLLM ``CachePolicy`` (written to 0.33's interface; what
another release differs in is bridged by :mod:`kv_offload_vllm.compat`).

vLLM's ``CPUOffloadingManager`` owns the chunks: ctypes ``ChunkStatus`` structs whose
``ref_cnt`` it changes in place. The adapter hands the kv-offload policy a
:class:`~kv_offload.policies.BlockStatus` per chunk whose ``ref_cnt`` reads that live struct,
keeps the key -> chunk map vLLM's ``get`` answers from, and maps vLLM's request-scoped
callbacks onto the kv-offload ones:

* ``insert(key, chunk, ctx)``, one key at a time -> one ``insert_many(keys, blocks)`` per store,
  as kv-offload's manager calls it: the keys vLLM inserts in a row for one request are handed
  to the policy at its next callback (a policy may classify a store's batch as a whole, as
  ``reuse`` does; key by key its hit ratio differed from kv-offload's own manager's);
* ``on_request_finished(key_groups, insertion_only, reused, ctx)`` -> ``touch`` of the keys the
  request reused (ready blocks it loaded or offered again), in prefix order, one call per KV
  group, then ``on_request_finished(ctx)``. Blocks a request only inserted are not a use, as
  in kv-offload's own manager, which touches a request's hits and nothing else;
* ``on_request_access`` / ``on_store_miss`` -> the kv-offload policy's methods of those names
  when its class defines them (the optional request-scoped callbacks), otherwise nothing:
  vLLM's default of touching a missed key would count a miss as a use. vLLM's
  ``prepare_store`` reports a store's misses before its accesses, kv-offload's the other way
  round, so a miss waits for the same request's access that follows it (or the next
  callback). vLLM reports a request's miss of a key once, so a store of keys missed before
  comes with none: if the policy's last access or miss callback was another request's, the
  keys the store inserts are reported as its miss before they are handed over, which is how a
  policy learns the storing request (kv-offload's manager reports every store's misses just
  before ``insert_many``, which carries no context). vLLM reports a key once per request and
  leaves pending blocks out of a store's accesses; kv-offload's manager reports every offered
  key: that difference stays. Key positions are read from vLLM's context
  (:class:`~kv_offload_vllm._common.BridgedReqContext`);
* ``evict`` -> ``evict``, whose answer is checked the way kv-offload's manager checks it
  (exactly ``n`` distinct resident blocks, all idle, none protected), because vLLM trusts it.

kv-offload hooks fire where the callbacks carry the information: ``blocks_evicted`` (with the
context of the store that evicted, known at the insert that follows), ``blocks_stored`` and
``store_failed`` (per key, with the context of the request that stored it), ``request_finished``
and ``cache_reset``. ``request_started`` and ``blocks_loaded`` are not visible to a vLLM
policy. ``manager`` in those hooks is the adapter.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from kv_offload import KVOffloadError, OffloadKey, PluginError, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, CachePolicyFactory

from ._common import PREFIX, fire_hook, kvo_context
from ._victims import checked_victims
from .compat import vllm_api

__all__ = ["policy_adapter"]

MEDIUM_CPU = "CPU"


class _LiveRefCounts:
    """Slot -> ``ref_cnt`` table of kv-offload's ``BlockStatus``, read from vLLM's chunks."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: dict[int, Any] = {}

    def __getitem__(self, slot: int, /) -> int:
        return int(self.chunks[slot].ref_cnt)

    def __setitem__(self, slot: int, value: int, /) -> None:
        self.chunks[slot].ref_cnt = value


def _block_status_class(table: _LiveRefCounts) -> type[BlockStatus]:
    """A ``BlockStatus`` subclass whose ``ref_cnt`` is the live count of vLLM's chunk."""
    namespace = {
        "__slots__": (),
        "_ref_counts": table,
        "ref_cnt": property(table.__getitem__, table.__setitem__, doc=BlockStatus.ref_cnt.__doc__),
    }
    return type("BlockStatus", (BlockStatus,), namespace)


def _overridden(policy: CachePolicy, name: str) -> Any:
    """The policy's bound method ``name`` if its class defines one beyond the base no-op."""
    method = getattr(type(policy), name, None)
    if method is None or method is getattr(CachePolicy, name, None):
        return None
    return getattr(policy, name)


@functools.cache
def policy_adapter(name: str) -> type[Any]:
    """The vLLM ``CachePolicy`` subclass running kv-offload's policy ``name``.

    Resolving ``name`` goes through kv-offload's own factory (runtime registrations, installed
    entry points), so an unknown name raises its :class:`~kv_offload.errors.PluginNotFoundError`
    listing what is installed.
    """
    api = vllm_api()
    kvo_cls = CachePolicyFactory.get_cache_policy_cls(name)
    bridged_name = PREFIX + name
    vllm_cache_policy: Any = api.CachePolicy

    class BridgedCachePolicy(vllm_cache_policy):  # type: ignore[misc]  # vLLM's class is Any
        kvo_policy_name = name
        kvo_policy_class = kvo_cls
        medium = MEDIUM_CPU

        def __init__(self, cache_capacity: int) -> None:
            super().__init__(cache_capacity)
            try:
                policy = kvo_cls(cache_capacity=cache_capacity)
            except KVOffloadError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"policy {name!r} ({kvo_cls.__module__}.{kvo_cls.__qualname__}), bridged "
                    f"into vLLM as {bridged_name!r}, failed to initialise: "
                    f"{type(exc).__name__}: {exc}",
                    kind="policy",
                    plugin=name,
                ) from exc
            self._policy: CachePolicy = policy
            self.cache_policy_name = bridged_name
            self._table = _LiveRefCounts()
            self._status_cls = _block_status_class(self._table)
            self._chunks: dict[OffloadKey, Any] = {}
            # key -> context of the request that stored it, while its store is in flight
            self._storing: dict[OffloadKey, ReqContext] = {}
            self._evicted: list[OffloadKey] = []
            # The store batch vLLM is inserting key by key, and a deferred on_store_miss.
            self._batch_keys: list[OffloadKey] = []
            self._batch_blocks: list[BlockStatus] = []
            self._batch_ctx: Any = None
            self._miss: tuple[list[OffloadKey], Any] | None = None
            # The vLLM context of the last on_request_access / on_store_miss handed over.
            self._told: Any = None
            # vLLM calls get() for every lookup: answer from the key -> chunk map directly.
            setattr(self, "get", self._chunks.get)  # noqa: B010 - shadows the method below
            self._request_access = _overridden(policy, "on_request_access")
            self._store_miss = _overridden(policy, "on_store_miss")
            self._request_finished = _overridden(policy, "on_request_finished")
            self._mark_evictable = _overridden(policy, "mark_evictable")
            self._mark_non_evictable = _overridden(policy, "mark_non_evictable")

        @property
        def policy(self) -> CachePolicy:
            """The kv-offload policy, with every block vLLM has inserted so far."""
            self._flush()
            return self._policy

        def _flush(self) -> None:
            """Hand the policy what was deferred: the store miss, then the insert batch."""
            if self._miss is not None:
                keys, vllm_ctx = self._miss
                self._miss = None
                self._store_miss(keys, kvo_context(vllm_ctx))
                self._told = vllm_ctx
            if self._batch_keys:
                keys, blocks, vllm_ctx = self._batch_keys, self._batch_blocks, self._batch_ctx
                self._batch_keys, self._batch_blocks, self._batch_ctx = [], [], None
                if self._store_miss is not None and vllm_ctx is not self._told:
                    # vLLM reports a request's misses once: a store of keys it missed before
                    # came without any. kv-offload's manager reports every store's misses
                    # before inserting them, which is how a policy knows the storing request.
                    self._store_miss(list(keys), kvo_context(vllm_ctx))
                    self._told = vllm_ctx
                self._policy.insert_many(keys, blocks)

        def get(self, key: OffloadKey) -> Any:  # replaced per instance in __init__
            return self._chunks.get(key)

        def insert(self, key: OffloadKey, chunk: Any, req_context: Any) -> None:
            # vLLM inserts one key at a time; kv-offload's manager hands a policy a store's
            # keys in one insert_many (a policy may classify the batch as a whole, as reuse
            # does), so the keys are collected and flushed at the next policy call.
            if self._miss is not None or (self._batch_keys and req_context is not self._batch_ctx):
                self._flush()
            ctx = kvo_context(req_context)
            if self._evicted:
                # The eviction that made room for this store: now its request is known.
                evicted, self._evicted = self._evicted, []
                fire_hook(
                    "kv_offload_blocks_evicted",
                    bridged_name,
                    manager=self,
                    keys=evicted,
                    medium=MEDIUM_CPU,
                    req_context=ctx,
                )
            slot = int(chunk.chunk_id)
            self._table.chunks[slot] = chunk
            self._chunks[key] = chunk
            self._storing[key] = ctx
            self._batch_keys.append(key)
            self._batch_blocks.append(int.__new__(self._status_cls, slot))
            self._batch_ctx = req_context

        def remove(self, key: OffloadKey) -> None:
            self._flush()
            self._policy.remove(key)
            chunk = self._chunks.pop(key, None)
            if chunk is not None:
                self._table.chunks.pop(int(chunk.chunk_id), None)
            ctx = self._storing.pop(key, None)
            if ctx is not None:
                fire_hook(
                    "kv_offload_store_failed",
                    bridged_name,
                    manager=self,
                    keys=[key],
                    medium=MEDIUM_CPU,
                    req_context=ctx,
                )

        def touch(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
            self._flush()
            self._policy.touch(list(keys), kvo_context(req_context))

        def on_request_access(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
            # vLLM's prepare_store reports a store's misses before its accesses; kv-offload's
            # manager (and so its policies) the other way round: a miss of this request
            # waits for the access that follows it in the same prepare_store.
            miss = self._miss
            if miss is not None and miss[1] is req_context:
                self._miss = None
            else:
                miss = None
            self._flush()
            if self._request_access is not None:
                self._request_access(list(keys), kvo_context(req_context))
                self._told = req_context
            if miss is not None:
                self._store_miss(miss[0], kvo_context(req_context))
                self._told = req_context

        def on_store_miss(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
            if self._store_miss is not None:
                self._flush()
                self._miss = (list(keys), req_context)

        def on_request_finished(
            self,
            key_groups: Sequence[Sequence[OffloadKey]],
            insertion_only_keys: set[OffloadKey],
            reused_keys: set[OffloadKey],
            req_context: Any,
        ) -> None:
            self._flush()
            ctx = kvo_context(req_context)
            if reused_keys:
                for group in key_groups:
                    used = [key for key in group if key in reused_keys]
                    if used:
                        self._policy.touch(used, ctx)
            if self._request_finished is not None:
                self._request_finished(ctx)
            fire_hook("kv_offload_request_finished", bridged_name, manager=self, req_context=ctx)

        def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]] | None:
            self._flush()
            victims = self._policy.evict(n, protected)
            if victims is None:
                return None
            evicted = checked_victims(
                victims,
                n,
                protected,
                self._chunks,
                policy=name,
                policy_class=kvo_cls,
                bridged_name=bridged_name,
            )
            for key, chunk in evicted:
                del self._chunks[key]
                self._table.chunks.pop(int(chunk.chunk_id), None)
            self._evicted.extend(key for key, _ in evicted)
            return evicted

        def clear(self) -> None:
            self._batch_keys, self._batch_blocks, self._batch_ctx = [], [], None
            self._miss = None
            self._told = None
            self._policy.clear()
            self._chunks.clear()
            self._table.chunks.clear()
            self._storing.clear()
            self._evicted.clear()
            fire_hook("kv_offload_cache_reset", bridged_name, manager=self)

        def mark_evictable(self, key: OffloadKey) -> None:
            self._flush()
            if self._mark_evictable is not None:
                self._mark_evictable(key)
            ctx = self._storing.pop(key, None)
            if ctx is not None:  # its store completed (ref_cnt -1 -> 0)
                fire_hook(
                    "kv_offload_blocks_stored",
                    bridged_name,
                    manager=self,
                    keys=[key],
                    medium=MEDIUM_CPU,
                    req_context=ctx,
                )

        def mark_non_evictable(self, key: OffloadKey) -> None:
            self._flush()
            if self._mark_non_evictable is not None:
                self._mark_non_evictable(key)

    bridged: type[Any] = api.release.policy_class(BridgedCachePolicy)
    bridged.__name__ = bridged.__qualname__ = bridged_name
    bridged.__doc__ = (
        f"kv-offload policy {name!r} ({kvo_cls.__module__}.{kvo_cls.__qualname__}) "
        f"inside vLLM's CPUOffloadingManager."
    )
    return bridged
