"""The Redis tier: block bytes shared by many engines through Redis/Valkey, standalone or Cluster.

Scheduler side (never blocks): ``submit_*`` hand the job to a small thread pool and return;
``lookup`` answers from what this tier knows (a store in flight: ``None``) or through
:class:`kv_offload.tiering.AsyncLookup`, which checks all keys asked in a scheduler step with one
pipelined ``EXISTS`` round trip per server, flushed in ``on_schedule_end``; ``get_finished``
collects results. Every accepted job reports exactly one result, with the reason it failed.

I/O side (the pool's threads): a job goes out in batches of ``batch_blocks`` blocks
(:mod:`.blocks`), one pipeline per server per batch, each round trip through the server's
circuit breaker (:mod:`.transport`), once the namespace is claimed for this block size and
format (:mod:`.namespace`).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import deque
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import numpy as np
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AuthFailureLog
from kv_offload.tiering import (
    AsyncLookup,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

from .blocks import Batch, BlockIO
from .namespace import Namespace
from .servers import Servers
from .settings import RedisTierSettings
from .stats import Counters, RedisTierStats
from .transport import BatchFailed, Transport

__all__ = ["RedisTier", "RedisTierStats"]

logger = logging.getLogger("kv_offload.redis_tier")


@functools.cache
def _constructor_defaults() -> dict[str, Any]:
    """The tier's own arguments and their defaults, read from ``RedisTier.__init__`` (one
    place states them)."""
    parameters = list(inspect.signature(RedisTier.__init__).parameters.values())[4:]
    return {p.name: p.default for p in parameters}


class RedisTier(SecondaryTierManager):
    """``[[tiers]] type = "redis"``; every keyword argument is a config key (README)."""

    #: Every engine with the same ``url`` and ``namespace`` reaches the same blocks.
    shared_across_engines = True

    @classmethod
    def validate_arguments(cls, **arguments: Any) -> None:
        """The keys as written, as the constructor checks them (url form and db, numbers,
        TLS files, ``password_env`` set), without connecting to anything."""
        RedisTierSettings.from_args("redis", **{**_constructor_defaults(), **arguments})

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        password_env: str | None = None,
        cluster: bool = False,
        startup_nodes: Sequence[str] | None = None,
        namespace: str = "kv-offload",
        ttl_s: float | None = None,
        batch_blocks: int = 16,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 5.0,
        max_in_flight: int = 64,
        io_threads: int = 2,
        retry_after_s: float = 0.5,
        max_retry_after_s: float = 10.0,
        lookup_cache: int = 100_000,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        auth_key_env: str | None = None,
        auth_key_previous_env: str | None = None,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        self.settings = s = RedisTierSettings.from_args(
            tier_type,
            url=url,
            password_env=password_env,
            cluster=cluster,
            startup_nodes=startup_nodes,
            namespace=namespace,
            ttl_s=ttl_s,
            batch_blocks=batch_blocks,
            connect_timeout_s=connect_timeout_s,
            timeout_s=timeout_s,
            max_in_flight=max_in_flight,
            io_threads=io_threads,
            retry_after_s=retry_after_s,
            max_retry_after_s=max_retry_after_s,
            lookup_cache=lookup_cache,
            tls_ca_file=tls_ca_file,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            auth_key_env=auth_key_env,
            auth_key_previous_env=auth_key_previous_env,
        )
        self._auth = s.auth
        self._counters = Counters()
        self._block = config.block_size_bytes
        self._servers = Servers(s)
        transport = Transport(tier_type, s, self._servers, self._counters)
        self._namespace = Namespace(s, self._servers, transport, self._block, s.auth)
        try:
            self._namespace.check(at_startup=True)
        except BaseException:
            self._servers.close()  # no thread started yet; leave no socket behind either
            raise
        self._pool = ThreadPoolExecutor(s.io_threads, thread_name_prefix=f"kv-offload-{tier_type}")
        self._done: deque[tuple[JobResult, JobMetadata]] = deque()
        self._in_flight = 0
        self._storing: dict[OffloadKey, int] = {}  # keys of this tier's stores in flight
        self._lookups = AsyncLookup(self._exists, name=tier_type, max_results=s.lookup_cache)
        self._blocks = BlockIO(
            transport,
            np.asarray(primary_kv_view),
            self._block,
            s.auth,
            self._counters,
            AuthFailureLog(tier_type, logger),
            self._lookups.forget,
        )
        self._closed = False

    @property
    def stats(self) -> RedisTierStats:
        """The live counters (``get_stats()`` is a consistent copy)."""
        return self._counters.stats

    def __repr__(self) -> str:
        s = self.settings
        auth = "" if self._auth is None else f", auth={self._auth!r}"
        return (
            f"RedisTier({s.safe_url!r}, namespace={s.namespace!r}, cluster={s.cluster}, "
            f"block_size_bytes={self._block}{auth})"
        )

    # -- the scheduler side ---------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self._storing:
            return None
        return self._lookups.lookup(key, req_context)

    def on_schedule_end(self) -> None:
        self._lookups.flush()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.release(req_context.req_id)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Nothing to do: the server's LRU/LFU sees every ``GET``."""

    def submit_store(self, job: JobMetadata) -> None:
        if self._accept(job):
            for key in job.keys:
                self._storing[key] = self._storing.get(key, 0) + 1
            self._pool.submit(self._run, job, self._blocks.store)

    def submit_load(self, job: JobMetadata) -> None:
        if self._accept(job):
            self._pool.submit(self._run, job, self._blocks.load)

    def get_finished(self) -> list[JobResult]:
        results: list[JobResult] = []
        done = self._done
        while done:
            result, job = done.popleft()
            self._in_flight -= 1
            failed = result.failed_keys if result.success else frozenset(job.keys)
            if job.is_promotion:
                # Whatever made a key fail (server down, value gone or corrupt), what the
                # tier believed about it is stale: the next lookup asks again (else a
                # cached "present" would promote, fail and promote again).
                for key in failed:
                    self._lookups.forget(key)
            else:
                for key in job.keys:
                    left = self._storing.get(key, 1) - 1
                    if left:
                        self._storing[key] = left
                    else:
                        self._storing.pop(key, None)
                    if key not in failed:
                        self._lookups.record(key, True)
            results.append(result)
        return results

    def get_stats(self) -> dict[str, Any]:
        """The counters of :class:`RedisTierStats` plus the lookup helper's, as a dict."""
        out = self._counters.snapshot()
        out["lookups"] = asdict(self._lookups.stats)
        out["jobs_in_flight"] = self._in_flight
        return out

    def settle_lookups(self, timeout: float) -> bool:
        """Wait until the existence checks asked so far have answered (``False``: not within
        ``timeout`` seconds); a test or a tool that wants lookups answered, not ``None``."""
        return self._lookups.wait(timeout)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._lookups.shutdown()
        self._servers.close()

    def _accept(self, job: JobMetadata) -> bool:
        """Take the job, or report it failed at once, saying why (closed, overloaded, server
        down)."""
        self._in_flight += 1
        reason = None
        if self._closed:
            reason = "the tier is shut down"
        elif self._in_flight > self.settings.max_in_flight:
            self._counters.count(refused_jobs=1)
            reason = f"{self.settings.max_in_flight} jobs in flight already (max_in_flight)"
        elif not self.settings.cluster and self._servers.standalone_blocked():
            self._counters.count(fast_failed_jobs=1)
            reason = f"{self.settings.safe_url} is down; retrying later"
        if reason is None:
            return True
        self._counters.job_failed(job.is_promotion)
        self._done.append((JobResult(job.job_id, success=False, reason=reason), job))
        return False

    # -- the I/O side ---------------------------------------------------------------------

    def _run(self, job: JobMetadata, batch: Batch) -> None:
        """One job, batch after batch; always ends in exactly one result. A batch returns the
        keys it could not store or load (their server down, their value gone or corrupt):
        only those fail, the job's other keys succeed (``JobResult.failed_keys``), so one
        dead Cluster master fails the keys in its slots, not every job that touches it."""
        failed: set[OffloadKey] = set()
        reason: str | None = None
        try:
            namespace = self._namespace
            if namespace.fatal is not None:
                raise BatchFailed(namespace.fatal)
            namespace.check(at_startup=False)
            slots = job.block_ids.tolist()
            step = self.settings.batch_blocks
            for start in range(0, len(job.keys), step):
                batch_failed, why = batch(
                    job.keys[start : start + step], slots[start : start + step]
                )
                failed.update(batch_failed)
                reason = reason or why
        except BatchFailed as exc:
            logger.debug("%s: job %d failed: %s", self.tier_type, job.job_id, exc)
            failed, reason = set(job.keys), str(exc)
        except Exception as exc:
            logger.exception("%s: job %d failed unexpectedly", self.tier_type, job.job_id)
            failed, reason = set(job.keys), f"internal error: {type(exc).__name__}: {exc}"
        finally:
            success = len(failed) < len(job.keys)
            if failed:
                self._counters.job_failed(job.is_promotion)
            result = JobResult(
                job.job_id,
                success,
                reason if failed else None,
                frozenset(failed) if success else frozenset(),
            )
            self._done.append((result, job))

    def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        """The AsyncLookup resolver (:meth:`BlockIO.exists`); every key a miss while the
        namespace cannot be used."""
        namespace = self._namespace
        if namespace.fatal is not None:
            return [False] * len(keys)
        try:
            namespace.check(at_startup=False)
        except BatchFailed:
            return [False] * len(keys)
        return self._blocks.exists(keys)
