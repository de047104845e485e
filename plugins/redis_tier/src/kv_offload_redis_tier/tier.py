"""The Redis tier's scheduler side: block bytes shared by many engines through Redis/Valkey.

Everything here runs on the engine's scheduler thread and never blocks: ``submit_*`` take the
job (or refuse it at once, saying why) and hand the I/O side (:mod:`.io`) an immutable
:class:`~.io.Transfer`; ``lookup`` answers from what this tier knows (a store in flight:
``None``) or through :class:`kv_offload.tiering.AsyncLookup`, which checks all keys asked in a
scheduler step with one pipelined ``EXISTS`` round trip per server, flushed in
``on_schedule_end``; ``get_finished`` takes the I/O side's results and settles this side's
state with them. Every accepted job reports exactly one result, with the reason it failed.

State and its owner: this module owns the jobs with a result pending, the keys of stores in
flight, the lookup helper and its answers, and the counts of jobs it refused; the I/O side
owns its servers, namespace claim, queue of finished jobs and its counters. Neither writes
the other's: :attr:`RedisTier.stats` and ``get_stats`` add the two sides' counts up.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Collection, Sequence
from dataclasses import asdict, fields
from typing import Any

import numpy as np
from kv_offload import OffloadKey, ReqContext
from kv_offload.tiering import (
    AsyncLookup,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

from .io import IOSide, RedisTierStats, Transfer
from .settings import RedisTierSettings

__all__ = ["RedisTier", "RedisTierStats"]


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
        self._block = config.block_size_bytes
        self._io = IOSide(s, np.asarray(primary_kv_view), self._block)
        self._jobs: dict[int, JobMetadata] = {}  # every job whose result is not reported yet
        self._refused: list[JobResult] = []  # jobs failed at submission, reported next
        self._counted = RedisTierStats()  # what this side counts (jobs it refused)
        self._storing: dict[OffloadKey, int] = {}  # keys of this tier's stores in flight
        self._lookups = AsyncLookup(self._io.exists, name=tier_type, max_results=s.lookup_cache)
        self._closed = False

    @property
    def stats(self) -> RedisTierStats:
        """The counters now: the I/O side's plus this side's (``get_stats()`` adds the lookup
        helper's and the jobs in flight)."""
        io = self._io.counters.snapshot()
        mine = self._counted
        return RedisTierStats(
            **{f.name: io[f.name] + getattr(mine, f.name) for f in fields(RedisTierStats)}
        )

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
            self._io.submit(
                Transfer(job.job_id, tuple(job.keys), tuple(job.block_ids.tolist()), False)
            )

    def submit_load(self, job: JobMetadata) -> None:
        if self._accept(job):
            self._io.submit(
                Transfer(job.job_id, tuple(job.keys), tuple(job.block_ids.tolist()), True)
            )

    def get_finished(self) -> list[JobResult]:
        results: list[JobResult] = []
        finished = self._io.get_finished()
        if self._refused:
            finished[:0] = self._refused
            self._refused = []
        for result in finished:
            job = self._jobs.pop(result.job_id)
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
        out = self._io.counters.snapshot()
        for name, value in asdict(self._counted).items():
            out[name] += value
        out["lookups"] = asdict(self._lookups.stats)
        out["jobs_in_flight"] = len(self._jobs)
        return out

    def settle_lookups(self, timeout: float) -> bool:
        """Wait until the existence checks asked so far have answered (``False``: not within
        ``timeout`` seconds); a test or a tool that wants lookups answered, not ``None``."""
        return self._lookups.wait(timeout)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._io.close()
        self._lookups.shutdown()

    def _accept(self, job: JobMetadata) -> bool:
        """Take the job, or report it failed at once, saying why (closed, overloaded, server
        down)."""
        self._jobs[job.job_id] = job
        reason = None
        counted = self._counted
        if self._closed:
            reason = "the tier is shut down"
        elif len(self._jobs) > self.settings.max_in_flight:
            counted.refused_jobs += 1
            reason = f"{self.settings.max_in_flight} jobs in flight already (max_in_flight)"
        elif not self.settings.cluster and self._io.down():
            counted.fast_failed_jobs += 1
            reason = f"{self.settings.safe_url} is down; retrying later"
        if reason is None:
            return True
        if job.is_promotion:
            counted.failed_load_jobs += 1
        else:
            counted.failed_store_jobs += 1
        self._refused.append(JobResult(job.job_id, success=False, reason=reason))
        return False
