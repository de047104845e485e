"""The S3 tier: block bytes in any S3-compatible object store, shared by many engines.

Scheduler side (never waits on the network): ``submit_*`` account for the job and hand each
of its blocks to a pool of ``io_threads`` threads; ``lookup`` answers from what this engine
wrote or found at start (:mod:`.index`), ``None`` for a store in flight, and otherwise through
:class:`kv_offload.tiering.AsyncLookup`: the keys asked in a scheduler step are checked
together (concurrent HEADs on ``lookup_threads`` threads) after ``on_schedule_end``, the
lookups answering ``None`` ("ask again") until then. ``get_finished`` collects results and
updates the accounting. Every accepted job reports exactly one result; a block that fails
fails its own key only (``JobResult.failed_keys``), never its neighbours.

I/O side: one object per block (:mod:`.layout`), PUT in one request or, above
``multipart_threshold_bytes``, as a multipart upload; every request bounded and through the
endpoint's breaker (:mod:`.store`); every object read checked before a byte reaches the CPU
buffer (:mod:`.codec`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import deque
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AuthFailureLog
from kv_offload.errors import ConfigError
from kv_offload.tiering import (
    AsyncLookup,
    JobMetadata,
    JobResult,
    Medium,
    OffloadingConfig,
    SecondaryTierManager,
)

from . import codec
from .index import CapacityIndex
from .layout import Layout
from .probe import check_at_build
from .settings import S3TierSettings
from .store import S3Store, StoreFailed, Unavailable

__all__ = ["S3Tier", "S3TierStats"]

logger = logging.getLogger("kv_offload.s3_tier")


@functools.cache
def _constructor_defaults() -> dict[str, Any]:
    """The tier's own arguments and their defaults, read from ``S3Tier.__init__``."""
    parameters = list(inspect.signature(S3Tier.__init__).parameters.values())[4:]
    return {p.name: p.default for p in parameters}


@dataclass
class S3TierStats:
    """Cumulative counters (``get_stats()`` adds the lookup helper's and the breaker's)."""

    stored_blocks: int = 0
    loaded_blocks: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    multipart_uploads: int = 0
    evicted_blocks: int = 0
    delete_failures: int = 0
    #: blocks found by listing the prefix at start
    recovered_blocks: int = 0
    #: fresh blocks of other engines dropped from the accounting, not deleted
    foreign_fresh_kept: int = 0
    vanished_objects: int = 0
    corrupt_objects: int = 0
    auth_failures: dict[str, int] = field(default_factory=dict)
    failed_store_jobs: int = 0
    failed_load_jobs: int = 0
    #: jobs failed at once: the breaker was open, the tier full of in-flight blocks, ...
    fast_failed_jobs: int = 0
    refused_jobs: int = 0
    lookup_requests: int = 0


class _Counters:
    """The stats, updated from the I/O threads under one lock."""

    def __init__(self) -> None:
        self.stats = S3TierStats()
        self._lock = threading.Lock()

    def count(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self.stats, name, getattr(self.stats, name) + amount)

    def auth_failed(self, kind: str) -> None:
        with self._lock:
            failures = self.stats.auth_failures
            failures[kind] = failures.get(kind, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out = {f.name: getattr(self.stats, f.name) for f in fields(self.stats)}
            out["auth_failures"] = dict(self.stats.auth_failures)
            return out


class _Job:
    """A job in flight: its blocks finish on the pool's threads; the last one reports."""

    __slots__ = ("failed", "job", "lock", "missing", "reason", "remaining")

    def __init__(self, job: JobMetadata) -> None:
        self.job = job
        self.remaining = len(job.keys)
        self.failed: set[OffloadKey] = set()
        #: keys a load found absent or bad: what this engine believed of them is stale
        self.missing: set[OffloadKey] = set()
        self.reason: str | None = None
        self.lock = threading.Lock()


class S3Tier(SecondaryTierManager):
    """``[[tiers]] type = "s3"``; every keyword argument is a config key (README)."""

    medium = Medium.STORAGE
    #: Every engine with the same bucket and prefix reaches the same blocks.
    shared_across_engines = True

    @classmethod
    def validate_arguments(cls, **arguments: Any) -> None:
        """The keys as written, as the constructor checks them, without any request."""
        S3TierSettings.from_args("s3", **{**_constructor_defaults(), **arguments})

    @classmethod
    def validate_for_stack(cls, config: OffloadingConfig, **arguments: Any) -> None:
        s = S3TierSettings.from_args("s3", **{**_constructor_defaults(), **arguments})
        s.capacity_for(cls._object_bytes(config.block_size_bytes, s))

    @staticmethod
    def _object_bytes(block_size: int, s: S3TierSettings, key_bytes: int = 32) -> int:
        return codec.header_size(key_bytes, s.auth) + block_size

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        endpoint_url: str | None = None,
        bucket: str | None = None,
        prefix: str = "kv-offload",
        *,
        capacity_blocks: int | None = None,
        capacity_bytes: int | None = None,
        addressing_style: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        verify_tls: bool = True,
        tls_ca_file: str | None = None,
        io_threads: int = 16,
        lookup_threads: int = 16,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 5.0,
        max_attempts: int = 3,
        retry_after_s: float = 0.5,
        max_retry_after_s: float = 10.0,
        max_in_flight: int = 64,
        lookup_cache: int = 100_000,
        multipart_threshold_bytes: int = 16 * 1024 * 1024,
        multipart_part_bytes: int = 8 * 1024 * 1024,
        shared_grace_s: float = 300.0,
        auth_key_env: str | None = None,
        auth_key_previous_env: str | None = None,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        arguments = {k: v for k, v in locals().items() if k in _constructor_defaults()}
        self.settings = s = S3TierSettings.from_args(tier_type, **arguments)
        self._block = config.block_size_bytes
        self._object = self._object_bytes(self._block, s)
        self.capacity_blocks = s.capacity_for(self._object)
        self._layout = Layout(s.prefix)
        self._counters = _Counters()
        self._auth_log = AuthFailureLog(tier_type, logger)
        marker = (
            f"kv-offload-s3-tier format={codec.format_version(s.auth)} block_size={self._block}"
        )
        probe = S3Store(s, max_attempts=2, data_path=False)
        try:
            check_at_build(probe, self._layout.marker, marker)
        finally:
            probe.close()
        self._store = S3Store(s)
        try:
            self._index = CapacityIndex(self.capacity_blocks, s.shared_grace_s)
            self._recover()
        except BaseException:
            self._store.close()
            raise
        self._cpu = np.asarray(primary_kv_view)
        self._pool = ThreadPoolExecutor(s.io_threads, thread_name_prefix=f"kv-offload-{tier_type}")
        self._heads = ThreadPoolExecutor(
            s.lookup_threads, thread_name_prefix=f"kv-offload-{tier_type}-lookup"
        )
        self._lookups = AsyncLookup(self._exists, name=tier_type, max_results=s.lookup_cache)
        self._done: deque[_Job] = deque()
        self._in_flight = 0
        self._storing: dict[OffloadKey, int] = {}
        self._loading: dict[OffloadKey, int] = {}
        self._closed = False

    def _recover(self) -> None:
        """List the prefix: every block found is accounted for, oldest first (a restart
        keeps what the store holds, and the bound)."""
        found = []
        try:
            for item in self._store.list_prefix(self._layout.blocks):
                key = self._layout.key_of(item.name)
                if key is not None:
                    found.append((item.modified, key))
        except StoreFailed as exc:
            raise ConfigError(
                f"tier {self.tier_type!r}: listing {self.settings.where} failed ({exc}); the "
                f"credentials need s3:ListBucket"
            ) from None
        found.sort()
        for modified, key in found:
            self._index.found(key, modified)
        self._counters.count(recovered_blocks=len(found))
        if found:
            logger.info(
                "%s: %d blocks found under %s", self.tier_type, len(found), self.settings.where
            )

    @property
    def stats(self) -> S3TierStats:
        """The live counters (``get_stats()`` is a consistent copy)."""
        return self._counters.stats

    def __repr__(self) -> str:
        auth = "" if self.settings.auth is None else f", auth={self.settings.auth!r}"
        return (
            f"S3Tier({self.settings.where!r}, capacity_blocks={self.capacity_blocks}, "
            f"block_size_bytes={self._block}{auth})"
        )

    # -- the scheduler side ---------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self._storing:
            return None
        if key in self._index:
            return True
        return self._lookups.lookup(key, req_context)

    def on_schedule_end(self) -> None:
        self._lookups.flush()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.release(req_context.req_id)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            self._index.touch(key)

    def submit_store(self, job: JobMetadata) -> None:
        if not self._accept(job):
            return
        protected = self._storing.keys() | self._loading.keys() | set(job.keys)
        new = [k for k in dict.fromkeys(job.keys) if k not in self._index]
        # A job larger than the whole tier keeps its first blocks (a prompt's prefix is
        # what the next request reuses); the rest fail, each with its own key.
        over = set(new[self.capacity_blocks :])
        victims = self._index.make_room(len(new) - len(over), protected)
        self._counters.count(foreign_fresh_kept=self._index.dropped_foreign)
        self._index.dropped_foreign = 0
        if victims is None:
            self._counters.count(refused_jobs=1)
            self._fail_now(job, f"the tier is full of blocks in flight ({self.capacity_blocks})")
            return
        if victims:
            for key in victims:
                self._lookups.forget(key)
            self._pool.submit(self._delete, victims)
        for key in job.keys:
            self._storing[key] = self._storing.get(key, 0) + 1
            if key not in over:
                self._index.written(key)
        self._spread(job, self._store_one, over, "larger than the tier's capacity_blocks")

    def submit_load(self, job: JobMetadata) -> None:
        if not self._accept(job):
            return
        for key in job.keys:
            self._loading[key] = self._loading.get(key, 0) + 1
        self._spread(job, self._load_one)

    def get_finished(self) -> list[JobResult]:
        results: list[JobResult] = []
        done = self._done
        while done:
            state = done.popleft()
            job = state.job
            self._in_flight -= 1
            failed = state.failed
            counts = self._loading if job.is_promotion else self._storing
            for key in job.keys:
                left = counts.get(key, 1) - 1
                if left:
                    counts[key] = left
                else:
                    counts.pop(key, None)
            if job.is_promotion:
                for key in state.missing:
                    self._lookups.forget(key)
                    self._index.discard(key)
                for key in job.keys:
                    if key not in failed:
                        self._index.touch(key)
            else:
                for key in failed:
                    if key not in self._storing:
                        self._index.discard(key)
            success = len(failed) < len(job.keys)
            if failed:
                self._counters.count(
                    **{"failed_load_jobs" if job.is_promotion else "failed_store_jobs": 1}
                )
            results.append(
                JobResult(
                    job.job_id,
                    success,
                    state.reason if failed else None,
                    frozenset(failed) if success else frozenset(),
                )
            )
        return results

    def get_stats(self) -> dict[str, Any]:
        out = self._counters.snapshot()
        out["lookups"] = asdict(self._lookups.stats)
        out["jobs_in_flight"] = self._in_flight
        out["accounted_blocks"] = len(self._index)
        out["capacity_blocks"] = self.capacity_blocks
        out["breaker_trips"] = self._store.breaker.trips
        out["unavailable_errors"] = self._store.unavailable_errors
        return out

    def settle_lookups(self, timeout: float) -> bool:
        """Wait until the existence checks asked so far have answered (tests, tools)."""
        return self._lookups.wait(timeout)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._lookups.shutdown()
        self._heads.shutdown(wait=True)
        self._store.close()

    # -- accepting a job ------------------------------------------------------------------

    def _accept(self, job: JobMetadata) -> bool:
        """Take the job, or fail it at once saying why (closed, overloaded, endpoint down)."""
        self._in_flight += 1
        reason = None
        if self._closed:
            reason = "the tier is shut down"
        elif self._in_flight > self.settings.max_in_flight:
            self._counters.count(refused_jobs=1)
            reason = f"{self.settings.max_in_flight} jobs in flight already (max_in_flight)"
        elif self._store.breaker.blocked():
            self._counters.count(fast_failed_jobs=1)
            reason = f"{self.settings.where} is down; retrying later"
        if reason is None:
            return True
        self._fail_now(job, reason)
        return False

    def _fail_now(self, job: JobMetadata, reason: str) -> None:
        """Report ``job`` (already counted in flight) failed on the next ``get_finished``."""
        state = _Job(job)
        state.failed.update(job.keys)
        state.reason = reason
        state.remaining = 0
        self._done.append(state)

    def _spread(
        self,
        job: JobMetadata,
        one: Any,
        refused: Collection[OffloadKey] = (),
        why: str | None = None,
    ) -> None:
        """One pool task per block: a job's blocks go out in parallel; the ``refused`` keys
        fail at once, for ``why``."""
        state = _Job(job)
        tasks = []
        for index, slot in enumerate(job.block_ids.tolist()):
            if job.keys[index] in refused:
                state.failed.add(job.keys[index])
                state.reason = why
                state.remaining -= 1
            else:
                tasks.append((index, slot))
        if not tasks:
            self._done.append(state)
            return
        for index, slot in tasks:
            self._pool.submit(one, state, index, slot)

    # -- the I/O side ---------------------------------------------------------------------

    def _finish(
        self, state: _Job, key: OffloadKey, reason: str | None, *, missing: bool = False
    ) -> None:
        with state.lock:
            if reason is not None:
                state.failed.add(key)
                state.reason = state.reason or reason
                if missing:
                    state.missing.add(key)
            state.remaining -= 1
            last = state.remaining == 0
        if last:
            self._done.append(state)

    def _store_one(self, state: _Job, index: int, slot: int) -> None:
        key = state.job.keys[index]
        reason = None
        try:
            row = self._cpu[slot]
            head = codec.header(key, row, self.settings.auth)
            name = self._layout.name(key)
            size = len(head) + row.nbytes
            parts = self.settings.parts_of(size)
            body = b"".join((head, memoryview(row)))  # one object, one buffer
            if parts == 1:
                self._store.put(name, body)
            else:
                self._store.put_multipart(name, body, self.settings.multipart_part_bytes)
                self._counters.count(multipart_uploads=1)
            self._counters.count(stored_blocks=1, bytes_written=self._block)
        except StoreFailed as exc:
            reason = str(exc)
        except Exception as exc:
            logger.exception("%s: a store failed unexpectedly", self.tier_type)
            reason = f"internal error: {type(exc).__name__}: {exc}"
        self._finish(state, key, reason)

    def _load_one(self, state: _Job, index: int, slot: int) -> None:
        key = state.job.keys[index]
        reason = None
        missing = False
        name = self._layout.name(key)
        try:
            value = self._store.get(name)
            if value is None:
                self._counters.count(vanished_objects=1)
                reason, missing = "a block vanished (evicted or deleted)", True
            else:
                reason = self._land(key, name, slot, value)
                missing = reason is not None
        except StoreFailed as exc:
            reason = str(exc)
        except Exception as exc:
            logger.exception("%s: a load failed unexpectedly", self.tier_type)
            reason = f"internal error: {type(exc).__name__}: {exc}"
        self._finish(state, key, reason, missing=missing)

    def _land(self, key: OffloadKey, name: str, slot: int, value: memoryview) -> str | None:
        """Check one object and copy its payload into CPU slot ``slot``; ``None``, or why
        not (a bad object is deleted when it is worthless to every reader)."""
        try:
            payload = codec.check(value, key, self._block, self.settings.auth)
        except codec.AuthFailed as exc:
            self._counters.auth_failed(exc.kind)
            fate = "deleted" if exc.delete else "left alone"
            self._auth_log.report(exc.kind, f"object {name!r}: {exc}", f"the object is {fate}")
            self._drop_bad(name, exc.delete)
            return f"unauthenticated object ({exc.kind}): {exc}"
        except codec.BadObject as exc:
            self._counters.count(corrupt_objects=1)
            fate = "deleted" if exc.delete else "left alone"
            logger.warning(
                "%s: object %r failed its check (%s); %s", self.tier_type, name, exc, fate
            )
            self._drop_bad(name, exc.delete)
            return f"corrupt object: {exc}"
        np.copyto(self._cpu[slot], np.frombuffer(payload, np.uint8))
        self._counters.count(loaded_blocks=1, bytes_read=self._block)
        return None

    def _drop_bad(self, name: str, delete: bool) -> None:
        if delete and self._store.delete_many([name]):
            self._counters.count(delete_failures=1)

    def _delete(self, victims: list[OffloadKey]) -> None:
        names = [self._layout.name(k) for k in victims]
        failed = self._store.delete_many(names)
        self._counters.count(evicted_blocks=len(names) - len(failed), delete_failures=len(failed))
        if failed:
            logger.warning(
                "%s: %d of %d evicted blocks could not be deleted; they stay in the bucket "
                "until a restart adopts them",
                self.tier_type,
                len(failed),
                len(names),
            )

    def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        """The AsyncLookup resolver: one HEAD per key, ``lookup_threads`` at a time; every
        key a miss while the endpoint is down."""
        if self._store.breaker.blocked():
            return [False] * len(keys)
        self._counters.count(lookup_requests=len(keys))
        names = [self._layout.name(k) for k in keys]
        try:
            return list(self._heads.map(self._head, names))
        except RuntimeError:  # the pool is shut down
            return [False] * len(keys)

    def _head(self, name: str) -> bool:
        try:
            return self._store.exists(name)
        except Unavailable:
            return False
