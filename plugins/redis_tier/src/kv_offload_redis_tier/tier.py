"""The Redis tier: block bytes shared by many engines through Redis/Valkey, standalone or Cluster.

Scheduler side (never blocks): ``submit_*`` hand the job to a small thread pool and return;
``lookup`` answers from what this tier knows (a store in flight: ``None``) or through
:class:`kv_offload.tiering.AsyncLookup`, which checks all keys asked in a scheduler step with one
pipelined ``EXISTS`` round trip per server, flushed in ``on_schedule_end``; ``get_finished``
collects results. Every accepted job reports exactly one result.

I/O side (the pool's threads): a job goes out in batches of ``batch_blocks`` blocks, one
pipeline per server per batch. Stores send each CPU row as it is in the buffer (no copy, see
:mod:`.wire`) behind a header (:mod:`.codec`); loads check every value and copy the payload
into its CPU row: a value that fails the check or vanished fails the load, is counted, and a
bad one is deleted. A connection failure opens the server's circuit breaker: later jobs for it
fail at once until a retry after ``retry_after_s`` (doubling) reconnects.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AuthFailureLog
from kv_offload.errors import ConfigError
from kv_offload.tiering import (
    AsyncLookup,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)
from redis import Redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import codec
from .breaker import CircuitBreaker
from .servers import Group, Servers, Unreachable
from .settings import RedisTierSettings
from .wire import Parts, exists_many

__all__ = ["RedisTier", "RedisTierStats"]

logger = logging.getLogger("kv_offload.redis_tier")

# Errors that mean "this server cannot be reached right now": they open its breaker.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
# Replies that mean "ask the right node": refresh the Cluster slot map.
_REROUTE = (AskError, ClusterDownError, TryAgainError)
_EXISTS_CHUNK = 1024


@dataclass
class RedisTierStats:
    """Cumulative counters of one Redis tier (blocks unless named otherwise)."""

    stored_blocks: int = 0
    loaded_blocks: int = 0
    failed_store_jobs: int = 0
    failed_load_jobs: int = 0
    #: values that failed the header/checksum check (each deleted)
    corrupt_values: int = 0
    #: values that failed authentication (``auth_key_env``): unsigned, forged, signed with a
    #: secret this stack does not hold; never served (by kind: ``auth_failure_kinds``)
    auth_failures: int = 0
    #: keys that were gone at load time (evicted, expired, deleted)
    vanished_values: int = 0
    #: per-server parts of a batch failed without I/O (server unknown or its breaker open)
    fast_failed_jobs: int = 0
    #: jobs refused because ``max_in_flight`` jobs were already running
    refused_jobs: int = 0
    #: connection failures and timeouts
    server_errors: int = 0
    reconnects: int = 0
    lookup_round_trips: int = 0
    bytes_written: int = 0
    bytes_read: int = 0


class _BatchFailed(Exception):
    """One batch of a job failed; the message says why (already counted and logged)."""


def _refusal(exc: BaseException | None) -> NoPermissionError | None:
    """The ACL refusal (``NOPERM``) behind ``exc``, if one is in its chain of causes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, NoPermissionError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class _Denied(Exception):
    """The server's ACL refused ``command`` on the namespace's keys."""

    def __init__(self, command: str, error: Exception) -> None:
        super().__init__(command)
        self.command = command
        self.error = error


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
        self._auth_log = AuthFailureLog(tier_type, logger)
        self._auth_kinds: dict[str, int] = {}
        self.stats = RedisTierStats()
        self._stats_lock = threading.Lock()
        self._cpu: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self._block = config.block_size_bytes
        self._prefix = f"{s.namespace}:".encode()
        self._ttl_ms = None if s.ttl_s is None else max(1, int(s.ttl_s * 1000))
        self._servers = Servers(s)
        self._fatal: str | None = None  # the namespace check failed: every job fails
        self._namespace_checked = False
        self._namespace_lock = threading.Lock()
        try:
            self._check_namespace(at_startup=True)
        except BaseException:
            self._servers.close()  # no thread started yet; leave no socket behind either
            raise
        self._pool = ThreadPoolExecutor(s.io_threads, thread_name_prefix=f"kv-offload-{tier_type}")
        self._done: deque[tuple[JobResult, JobMetadata]] = deque()
        self._in_flight = 0
        self._storing: dict[OffloadKey, int] = {}  # keys of this tier's stores in flight
        self._lookups = AsyncLookup(self._exists, name=tier_type, max_results=s.lookup_cache)
        self._closed = False

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
            self._pool.submit(self._run, job, self._store_batch)

    def submit_load(self, job: JobMetadata) -> None:
        if self._accept(job):
            self._pool.submit(self._run, job, self._load_batch)

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
        with self._stats_lock:
            out: dict[str, Any] = asdict(self.stats)
            out["auth_failure_kinds"] = dict(self._auth_kinds)
        out["lookups"] = asdict(self._lookups.stats)
        out["jobs_in_flight"] = self._in_flight
        return out

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._lookups.shutdown()
        self._servers.close()

    def _accept(self, job: JobMetadata) -> bool:
        """Take the job, or report it failed at once (closed, overloaded, server down)."""
        self._in_flight += 1
        reason = None
        if self._closed:
            reason = "closed"
        elif self._in_flight > self.settings.max_in_flight:
            reason = "refused"
        elif not self.settings.cluster and self._servers_blocked():
            reason = "fast"
        if reason is None:
            return True
        self._count(
            refused_jobs=int(reason == "refused"),
            fast_failed_jobs=int(reason == "fast"),
            **{"failed_load_jobs" if job.is_promotion else "failed_store_jobs": 1},
        )
        self._done.append((JobResult(job.job_id, success=False), job))
        return False

    def _servers_blocked(self) -> bool:
        return self._servers.standalone_blocked()

    # -- the I/O side ---------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def _rkey(self, key: OffloadKey) -> bytes:
        return self._prefix + key.hex().encode()

    def _run(self, job: JobMetadata, batch: Any) -> None:
        """One job, batch after batch; always ends in exactly one result. A batch returns the
        keys it could not store or load (their server down, their value gone or corrupt):
        only those fail, the job's other keys succeed (``JobResult.failed_keys``), so one
        dead Cluster master fails the keys in its slots, not every job that touches it."""
        failed: set[OffloadKey] = set()
        reason: str | None = None
        try:
            if self._fatal is not None:
                raise _BatchFailed(self._fatal)
            self._check_namespace(at_startup=False)
            slots = job.block_ids.tolist()
            step = self.settings.batch_blocks
            for start in range(0, len(job.keys), step):
                batch_failed, why = batch(
                    job.keys[start : start + step], slots[start : start + step]
                )
                failed.update(batch_failed)
                reason = reason or why
        except _BatchFailed as exc:
            logger.debug("%s: job %d failed: %s", self.name, job.job_id, exc)
            failed, reason = set(job.keys), str(exc)
        except Exception as exc:
            logger.exception("%s: job %d failed unexpectedly", self.name, job.job_id)
            failed, reason = set(job.keys), f"{type(exc).__name__}: {exc}"
        finally:
            success = len(failed) < len(job.keys)
            if failed:
                self._count(**{"failed_load_jobs" if job.is_promotion else "failed_store_jobs": 1})
            result = JobResult(
                job.job_id,
                success,
                reason if failed else None,
                frozenset(failed) if success else frozenset(),
            )
            self._done.append((result, job))

    def _usable(self, group: Group) -> str | None:
        """Why ``group``'s server cannot be asked now (unknown, or its breaker open), else None.
        In a Cluster a down node may have been replaced (a replica promoted to its slots):
        the slot map is read again (at most once per ``retry_after_s``), so the next batch
        goes to the new owner and the tier heals without a restart."""
        if group.client is None or group.breaker is None:
            why = group.reason
        elif not group.breaker.allow():
            why = f"{self._where(group.server)} is down; retrying later"
        else:
            return None
        self._count(fast_failed_jobs=1)
        if self.settings.cluster:
            self._servers.refresh_topology()
        return why

    def _execute(self, group: Group, commands: list[tuple[Any, ...]]) -> list[Any]:
        """One pipeline (one round trip) on ``group``'s server; connection errors open its
        breaker and fail the batch, other per-command errors come back in the list."""

        def pipeline(client: Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            return list(pipe.execute(raise_on_error=False))

        replies = self._talk(group, pipeline)
        if any(isinstance(r, _REROUTE) for r in replies):
            self._servers.refresh_topology()
        return replies

    def _talk(self, group: Group, exchange: Callable[[Redis], list[Any]]) -> list[Any]:
        """Run one round trip on ``group``'s server, keeping its breaker up to date."""
        client, breaker = group.client, group.breaker
        if client is None or breaker is None:
            raise _BatchFailed(group.reason)
        try:
            replies = exchange(client)
        except _UNREACHABLE as exc:
            self._server_failed(group.server, breaker, exc)
            raise _BatchFailed(f"{self._where(group.server)}: {type(exc).__name__}") from None
        if breaker.success():
            self._count(reconnects=1)
            logger.warning("%s: %s is reachable again", self.name, self._where(group.server))
        return replies

    def _server_failed(self, server: str, breaker: CircuitBreaker, exc: BaseException) -> None:
        self._count(server_errors=1)
        if self.settings.cluster:
            self._servers.refresh_topology()
        if breaker.failure():
            hint = ""
            if isinstance(exc, AuthenticationError):
                hint = " (check the password: url or password_env)"
            logger.warning(
                "%s: %s failed (%s: %s)%s; its jobs fail at once until a retry in %.1f s",
                self.name,
                self._where(server),
                type(exc).__name__,
                exc,
                hint,
                breaker.first_delay,
            )

    def _where(self, server: str) -> str:
        return self.settings.safe_url if server == "server" else f"Cluster node {server}"

    def _store_batch(
        self, keys: list[OffloadKey], slots: list[int]
    ) -> tuple[list[OffloadKey], str | None]:
        """SET each key on its server; the keys that failed, and the first reason."""
        rkeys = [self._rkey(k) for k in keys]
        expiry: tuple[Any, ...] = () if self._ttl_ms is None else ("PX", self._ttl_ms)
        failed: list[OffloadKey] = []
        reason: str | None = None
        for group in self._servers.route(rkeys):
            why = self._usable(group)
            if why is None:
                commands = []
                for i in group.indices:
                    row = self._cpu[slots[i]]
                    head = codec.header(keys[i], row, self._auth)
                    commands.append(("SET", rkeys[i], Parts(head, row), *expiry))
                try:
                    replies = self._execute(group, commands)
                except _BatchFailed as exc:
                    why = str(exc)
                else:
                    for i, reply in zip(group.indices, replies):
                        if isinstance(reply, Exception):
                            # e.g. OOM with maxmemory-policy noeviction: the server is up
                            if reason is None:
                                logger.warning("%s: a store was refused: %s", self.name, reply)
                            failed.append(keys[i])
                            reason = reason or str(reply)
                    continue
            failed.extend(keys[i] for i in group.indices)
            reason = reason or why
        stored = len(keys) - len(failed)
        self._count(stored_blocks=stored, bytes_written=stored * self._block)
        return failed, reason

    def _load_batch(
        self, keys: list[OffloadKey], slots: list[int]
    ) -> tuple[list[OffloadKey], str | None]:
        """GET each key from its server into its CPU slot, checked; the keys that failed."""
        rkeys = [self._rkey(k) for k in keys]
        failed: list[OffloadKey] = []
        reason: str | None = None
        for group in self._servers.route(rkeys):
            why = self._usable(group)
            if why is None:
                try:
                    replies = self._execute(group, [("GET", rkeys[i]) for i in group.indices])
                except _BatchFailed as exc:
                    why = str(exc)
            if why is not None:
                failed.extend(keys[i] for i in group.indices)
                reason = reason or why
                continue
            corrupt: list[bytes] = []
            for i, value in zip(group.indices, replies):
                landed = self._land(keys[i], rkeys[i], slots[i], value)
                if landed is not None:
                    why, delete = landed
                    failed.append(keys[i])
                    reason = reason or why
                    if delete:
                        corrupt.append(rkeys[i])
            if corrupt:
                # If the server went away meanwhile, the next reader finds it corrupt again.
                with contextlib.suppress(_BatchFailed):
                    self._execute(group, [("DEL", k) for k in corrupt])
        loaded = len(keys) - len(failed)
        self._count(loaded_blocks=loaded, bytes_read=loaded * self._block)
        return failed, reason

    def _land(self, key: OffloadKey, rkey: bytes, slot: int, value: Any) -> tuple[str, bool] | None:
        """Check one GET reply and copy its payload into CPU slot ``slot``; ``None``, or why
        not and whether to delete the value."""
        if value is None:
            self._count(vanished_values=1)
            self._lookups.forget(key)
            return "a block vanished (evicted, expired or deleted)", False
        if isinstance(value, ResponseError):
            return str(value), False
        try:
            payload = codec.check(value, key, self._block, self._auth)
        except codec.AuthFailed as exc:
            self._lookups.forget(key)
            with self._stats_lock:
                self.stats.auth_failures += 1
                self._auth_kinds[exc.kind] = self._auth_kinds.get(exc.kind, 0) + 1
            fate = "deleted" if exc.delete else "left alone"
            self._auth_log.report(
                exc.kind, f"value {rkey.decode()!r}: {exc}", f"the value is {fate}"
            )
            return f"unauthenticated value ({exc.kind}): {exc}", exc.delete
        except codec.BadValue as exc:
            self._count(corrupt_values=1)
            self._lookups.forget(key)
            logger.warning(
                "%s: value %r failed its check (%s); %s, the load fails",
                self.name,
                rkey.decode(),
                exc,
                "deleted" if exc.delete else "left alone",
            )
            return f"corrupt value: {exc}", exc.delete
        np.copyto(self._cpu[slot], np.frombuffer(payload, np.uint8))
        return None

    def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        """The AsyncLookup resolver: one round trip of ``EXISTS`` commands per server (and per
        1,024 keys); keys of an unreachable server answer ``False`` (a miss: the engine
        recomputes)."""
        answers = [False] * len(keys)
        if self._fatal is not None:
            return answers
        try:
            self._check_namespace(at_startup=False)
        except _BatchFailed:
            return answers
        rkeys = [self._rkey(k) for k in keys]
        for group in self._servers.route(rkeys):
            if group.client is None or group.breaker is None or not group.breaker.allow():
                continue
            for start in range(0, len(group.indices), _EXISTS_CHUNK):
                chunk = group.indices[start : start + _EXISTS_CHUNK]
                names = [rkeys[i] for i in chunk]
                try:
                    replies = self._talk(group, functools.partial(exists_many, keys=names))
                except _BatchFailed:
                    break
                except ResponseError as exc:  # MOVED after a failover, NOAUTH, ...
                    logger.debug("%s: existence check refused: %s", self.name, exc)
                    if isinstance(exc, _REROUTE):
                        self._servers.refresh_topology()
                    break
                self._count(lookup_round_trips=1)
                for i, present in zip(chunk, replies):
                    answers[i] = present
        return answers

    # -- the namespace check --------------------------------------------------------------

    def _check_namespace(self, *, at_startup: bool) -> None:
        """Claim ``namespace`` for this block size and format, or refuse a namespace that
        holds another one. At startup an unreachable server is only a warning (the tier
        retries); a wrong password or a mismatch is a :class:`ConfigError`."""
        if self._namespace_checked:
            return
        with self._namespace_lock:
            if self._namespace_checked:
                return
            s = self.settings
            meta = f"{s.namespace}:__format__".encode()
            version = codec.format_version(self._auth)
            mine = f"kv-offload-redis-tier format={version} block_size={self._block}"
            try:
                server, client, breaker = self._servers.client_for(meta)
                if not at_startup and not breaker.allow():
                    raise _BatchFailed(f"{self._where(server)} is down; retrying later")
                try:
                    try:
                        theirs = self._claim(client, meta, mine)
                    except NoPermissionError as exc:
                        raise _Denied("SET NX / GET (the namespace marker)", exc) from None
                    self._check_permissions(client, meta)
                except _Denied as exc:
                    denied = self._denied(exc.command, exc.error)
                    if at_startup:
                        raise denied from None
                    # The server was unreachable at startup: fail every job from now on.
                    self._fatal = str(denied)
                    logger.error("%s: %s", self.name, denied)
                    raise _BatchFailed(str(denied)) from None
                except _UNREACHABLE as exc:
                    self._server_failed(server, breaker, exc)
                    if at_startup and isinstance(exc, AuthenticationError):
                        raise ConfigError(
                            f"tier {s.tier!r}: {s.safe_url} refused the credentials "
                            f"({exc}); check the password in the url or in password_env"
                        ) from None
                    if at_startup and "certificate verify failed" in str(exc).lower():
                        raise ConfigError(
                            f"tier {s.tier!r}: the TLS certificate of {s.safe_url} is not "
                            f"trusted ({exc}); set tls_ca_file to the CA that signed it"
                        ) from None
                    raise _BatchFailed(f"{self._where(server)}: {type(exc).__name__}") from None
                breaker.success()
            except ResponseError as exc:
                if at_startup and "DB index" in str(exc):
                    raise ConfigError(
                        f"tier {s.tier!r}: url {s.safe_url!r} selects database {s.db}, which "
                        f"the server does not have ({exc}; a server has databases 0 to its "
                        f"'databases' setting - 1, 16 by default); fix the db number in url",
                        key="url",
                    ) from None
                raise
            except (_BatchFailed, Unreachable) as exc:
                refused = _refusal(exc) or _refusal(self._servers.init_error)
                if at_startup and refused is not None and s.cluster:
                    user = s.username or "default"
                    raise ConfigError(
                        f"tier {s.tier!r}: the Redis user {user!r} on {s.safe_url} may not run "
                        f"the Cluster commands the client needs to find the slots of namespace "
                        f"{s.namespace!r} ({refused}); a Cluster user needs `+cluster|slots "
                        f"+command` besides `~{s.namespace}:* +get +set +exists +del` on every "
                        f"node (see the tier's README, 'Access control')",
                        key="namespace",
                    ) from None
                if at_startup and "Cluster mode is not enabled" in str(exc):
                    raise ConfigError(
                        f"tier {s.tier!r}: cluster = true, but {s.safe_url} is a standalone "
                        f"server (Cluster mode is not enabled on it); set cluster = false, "
                        f"or point url at a Redis Cluster node",
                        key="cluster",
                    ) from None
                if at_startup:
                    logger.warning(
                        "%s: %s is not reachable at startup (%s); jobs fail until it is",
                        self.name,
                        s.safe_url,
                        exc,
                    )
                    return
                raise _BatchFailed(str(exc)) from None
            if theirs != mine:
                hint = "give this model or block size its own namespace"
                if f"block_size={self._block}" in theirs.split():
                    hint = (
                        "every engine of a namespace must set auth_key_env (format=2) or none "
                        "(format=1); set it here too, or give this stack its own namespace"
                    )
                message = (
                    f"tier {s.tier!r}: namespace {s.namespace!r} on {s.safe_url} holds "
                    f"{theirs!r}, this stack writes {mine!r}; {hint}"
                )
                if at_startup:
                    raise ConfigError(message)
                self._fatal = message
                logger.error("%s: %s", self.name, message)
                raise _BatchFailed(message)
            self._namespace_checked = True

    def _check_permissions(self, client: Redis, meta: bytes) -> None:
        """Run every command the tier uses once on a probe key of the namespace, so that a
        user the server's ACL does not let use it fails the build (:class:`ConfigError`)
        instead of every later job failing one by one. The probe's hash tag puts it in the
        marker's Cluster slot: the same server answers."""
        probe = f"{self.settings.namespace}:__acl_probe__{{".encode() + meta + b"}"
        pipe = client.pipeline(transaction=False)
        pipe.set(probe, b"1", px=60_000)
        pipe.get(probe)
        pipe.exists(probe)
        pipe.delete(probe)
        replies = pipe.execute(raise_on_error=False)
        for command, reply in zip(("SET ... PX", "GET", "EXISTS", "DEL"), replies):
            if isinstance(reply, NoPermissionError):
                raise _Denied(command, reply)
            # Other errors (OOM under noeviction, ...) are the server's state, not the ACL's.

    def _denied(self, command: str, exc: Exception) -> ConfigError:
        s = self.settings
        user = s.username or "default"
        return ConfigError(
            f"tier {s.tier!r}: the Redis user {user!r} on {s.safe_url} may not run {command} "
            f"on keys of namespace {s.namespace!r} ({exc}); grant it, e.g. "
            f"`ACL SETUSER {user} ~{s.namespace}:* +get +set +exists +del`, or use the "
            f"namespace its ACL allows (see the tier's README, 'Access control')",
            key="namespace",
        )

    @staticmethod
    def _claim(client: Redis, meta: bytes, mine: str) -> str:
        if client.set(meta, mine, nx=True):
            return mine
        theirs = client.get(meta)
        if theirs is None:  # evicted between the two commands: claim again next time
            return mine
        if isinstance(theirs, str):
            return theirs
        return bytes(theirs).decode(errors="replace")
