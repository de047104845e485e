"""The I/O side of the Redis tier: everything that talks to the servers, on the tier's threads.

The scheduler side (:mod:`.tier`) hands :class:`IOSide` an immutable :class:`Transfer` per
job and takes back immutable ``JobResult`` objects through :meth:`IOSide.get_finished`; the
lookup helper's thread asks :meth:`IOSide.exists`. Everything else lives here and is owned
here: the clients and the slot map (:class:`Servers`), a circuit breaker per server
(:class:`CircuitBreaker`), round trips through them (:class:`Transport`), the namespace claim
(:class:`NamespaceClaim`), the batches of stores, loads and existence checks
(:class:`BlockIO`), the worker threads and their queue of finished jobs, and the counters the
I/O threads keep (:class:`Counters`). What the values and keys look like is :mod:`.stored`'s;
how a command is packed without copying the row is :mod:`.wire`'s.

A job goes out in batches of ``batch_blocks`` blocks, one pipeline per server per batch, each
round trip through the server's breaker, once the namespace is claimed for this block size
and format. Every transfer ends in exactly one result, with the reason it failed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey
from kv_offload.block_auth import AuthFailureLog, BlockAuth
from kv_offload.errors import ConfigError
from kv_offload.tiering import CircuitBreaker, JobResult
from redis import Redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import stored
from .settings import RedisTierSettings
from .wire import Parts, ZeroCopyPool, exists_many

__all__ = [
    "REROUTE",
    "UNREACHABLE",
    "BatchFailed",
    "CircuitBreaker",
    "Counters",
    "IOSide",
    "RedisTierStats",
    "Transfer",
]

logger = logging.getLogger("kv_offload.redis_tier")


# -- the counters the I/O threads keep ----------------------------------------------------


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


class Counters:
    """A tier's :class:`RedisTierStats` and its authentication failures by kind, counted
    from any thread."""

    def __init__(self) -> None:
        self.stats = RedisTierStats()
        self._auth_kinds: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, **deltas: int) -> None:
        with self._lock:
            stats = self.stats
            for name, delta in deltas.items():
                setattr(stats, name, getattr(stats, name) + delta)

    def job_failed(self, load: bool) -> None:
        self.count(**{"failed_load_jobs" if load else "failed_store_jobs": 1})

    def auth_failed(self, kind: str) -> None:
        with self._lock:
            self.stats.auth_failures += 1
            self._auth_kinds[kind] = self._auth_kinds.get(kind, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict, ``auth_failure_kinds`` included."""
        with self._lock:
            out: dict[str, Any] = asdict(self.stats)
            out["auth_failure_kinds"] = dict(self._auth_kinds)
        return out


class Unreachable(Exception):
    """No client for these keys right now (breaker open, topology unknown, slot uncovered)."""


@dataclass
class Group:
    """The keys of one batch that live on one server."""

    server: str
    client: Redis | None
    breaker: CircuitBreaker | None
    indices: list[int] = field(default_factory=list)
    #: why ``client`` is None
    reason: str = ""


class Servers:
    """Which server holds a key: one standalone server, or the master of the key's Cluster slot.

    The tier batches per server: :meth:`Servers.route` splits a batch of keys into one group per
    server, and each group goes out as one pipeline (one round trip). Each server has its own
    :class:`CircuitBreaker`, so in a Cluster a dead master fails only the keys of its
    slots while the other masters keep serving. Clients never retry on their own (the breaker
    decides when to try again), and their connections pack commands with
    :class:`~.wire.ZeroCopyPacker`.
    """

    def __init__(self, settings: RedisTierSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}
        self._client: Redis | None = None
        self._cluster: RedisCluster | None = None
        self._cluster_breaker = self._breaker("cluster topology")
        self._refreshed_at = 0.0
        #: why the Cluster client could not be created last time (for a clear startup error)
        self.init_error: BaseException | None = None
        scheme = "rediss" if settings.use_tls else "redis"
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        # The URL redis-py sees carries no password: that travels as a keyword argument.
        self._url = f"{scheme}://{host}:{settings.port}/{settings.db}"
        if not settings.cluster:
            pool = ZeroCopyPool.from_url(
                self._url,
                retry=Retry(NoBackoff(), 0),
                max_connections=settings.io_threads + 4,  # workers, the lookup thread, spare
                **settings.connection_kwargs(),
            )
            self._client = Redis(connection_pool=pool)

    # -- clients --------------------------------------------------------------------------

    def _breaker(self, server: str) -> CircuitBreaker:
        breaker = self._breakers.get(server)
        if breaker is None:
            breaker = self._breakers[server] = CircuitBreaker(
                self.settings.retry_after_s, self.settings.max_retry_after_s
            )
        return breaker

    def standalone_blocked(self) -> bool:
        """Whether the standalone server's breaker is open and not yet due for a retry."""
        return self._client is not None and self._breaker("server").blocked()

    def _cluster_client(self) -> RedisCluster:
        """The Cluster client, created on first use (it fetches the slot map)."""
        if self._cluster is not None:
            return self._cluster
        with self._lock:
            if self._cluster is None:
                if not self._cluster_breaker.allow():
                    raise Unreachable("no Cluster node answered; retrying later")
                s = self.settings
                try:
                    self._cluster = RedisCluster.from_url(
                        self._url,
                        startup_nodes=[
                            ClusterNode(h, p)  # type: ignore[no-untyped-call]
                            for h, p in s.startup_nodes
                        ],
                        connection_pool_class=ZeroCopyPool,
                        require_full_coverage=False,
                        max_connections=s.io_threads + 4,
                        **{k: v for k, v in s.connection_kwargs().items() if v is not None},
                    )
                except (RedisClusterException, ConnectionError, OSError) as exc:
                    self._cluster_breaker.failure()
                    self.init_error = exc
                    raise Unreachable(f"no Cluster node answered ({exc})") from exc
                except Exception as exc:
                    # redis-py raises its own ConnectionError/AuthenticationError here.
                    self._cluster_breaker.failure()
                    self.init_error = exc
                    raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
                self._cluster_breaker.success()
            return self._cluster

    def refresh_topology(self) -> None:
        """Re-read the Cluster slot map (after MOVED or an uncovered slot), at most once per
        ``retry_after_s``."""
        cluster = self._cluster
        if cluster is None:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at < self.settings.retry_after_s:
                return
            self._refreshed_at = now
            try:
                cluster.nodes_manager.initialize()
            except Exception as exc:
                logger.debug("%s: Cluster topology refresh failed: %s", self.settings.tier, exc)

    def masters(self) -> dict[int, str] | None:
        """The master (``host:port``) of each covered slot, as the Cluster client's slot map
        has it (a dead master keeps its slots until a replica takes them over); ``None`` for
        a standalone server. :class:`Unreachable` if no Cluster node answered yet."""
        if self._client is not None:
            return None
        slots = self._cluster_client().nodes_manager.slots_cache
        return {slot: nodes[0].name for slot, nodes in list(slots.items()) if nodes}

    def route(self, keys: Sequence[bytes]) -> list[Group]:
        """``keys`` (Redis keys) grouped per server, in first-seen order."""
        if self._client is not None:
            return [Group("server", self._client, self._breaker("server"), list(range(len(keys))))]
        try:
            cluster = self._cluster_client()
        except Unreachable as exc:
            return [Group("cluster", None, None, list(range(len(keys))), str(exc))]
        groups: dict[str, Group] = {}
        for index, key in enumerate(keys):
            try:
                node = cluster.get_node_from_key(key)  # type: ignore[no-untyped-call]
            except SlotNotCoveredError as exc:
                group = groups.setdefault("uncovered", Group("uncovered", None, None, [], str(exc)))
            else:
                group = groups.get(node.name)  # type: ignore[assignment]
                if group is None:
                    group = groups[node.name] = Group(
                        node.name,
                        cluster.get_redis_connection(node),
                        self._breaker(node.name),
                    )
            group.indices.append(index)
        if "uncovered" in groups:
            self.refresh_topology()
        return list(groups.values())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()


#: Errors that mean "this server cannot be reached right now": they open its breaker.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: Replies that mean "ask the right node": refresh the Cluster slot map.
REROUTE = (AskError, ClusterDownError, TryAgainError)


class BatchFailed(Exception):
    """A batch (or a part of it for one server) failed; the message says why (already
    counted and logged)."""


class Transport:
    """Talking to one server of the tier: a pipelined round trip through its circuit breaker.

    A connection failure or a timeout opens the server's breaker (:class:`CircuitBreaker`):
    later batches for it fail at once, without I/O, until a retry after ``retry_after_s``
    (doubling). In a Cluster a failing or rerouting node may have been replaced (a replica
    promoted to its slots), so the slot map is read again and the next batch goes to the new
    owner: the tier heals without a restart. Failures come back as :class:`BatchFailed` with
    a reason a ``JobResult`` can carry.
    """

    def __init__(
        self, name: str, settings: RedisTierSettings, servers: Servers, counters: Counters
    ) -> None:
        self.name = name
        self.settings = settings
        self.servers = servers
        self.counters = counters

    def where(self, server: str) -> str:
        """A server as a message names it (the url without its password, or the node)."""
        return self.settings.safe_url if server == "server" else f"Cluster node {server}"

    def usable(self, group: Group) -> str | None:
        """Why ``group``'s server cannot be asked now (unknown, or its breaker open), else
        ``None``; in a Cluster the slot map is read again (at most once per
        ``retry_after_s``)."""
        if group.client is None or group.breaker is None:
            why = group.reason
        elif not group.breaker.allow():
            why = f"{self.where(group.server)} is down; retrying later"
        else:
            return None
        self.counters.count(fast_failed_jobs=1)
        if self.settings.cluster:
            self.servers.refresh_topology()
        return why

    def execute(self, group: Group, commands: list[tuple[Any, ...]]) -> list[Any]:
        """One pipeline (one round trip) on ``group``'s server; connection errors open its
        breaker and fail the batch, other per-command errors come back in the list."""

        def pipeline(client: Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            return list(pipe.execute(raise_on_error=False))

        replies = self.talk(group, pipeline)
        if any(isinstance(r, REROUTE) for r in replies):
            self.servers.refresh_topology()
        return replies

    def talk(self, group: Group, exchange: Callable[[Redis], list[Any]]) -> list[Any]:
        """Run one round trip on ``group``'s server, keeping its breaker up to date."""
        client, breaker = group.client, group.breaker
        if client is None or breaker is None:
            raise BatchFailed(group.reason)
        try:
            replies = exchange(client)
        except UNREACHABLE as exc:
            self.server_failed(group.server, breaker, exc)
            raise BatchFailed(
                f"{self.where(group.server)} unreachable: {type(exc).__name__}"
            ) from None
        if breaker.success():
            self.counters.count(reconnects=1)
            logger.warning("%s: %s is reachable again", self.name, self.where(group.server))
        return replies

    def server_failed(self, server: str, breaker: CircuitBreaker, exc: BaseException) -> None:
        """Count a failure of ``server``; the first that opens its breaker is logged."""
        self.counters.count(server_errors=1)
        if self.settings.cluster:
            self.servers.refresh_topology()
        if breaker.failure():
            hint = ""
            if isinstance(exc, AuthenticationError):
                hint = " (check the password: url or password_env)"
            logger.warning(
                "%s: %s failed (%s: %s)%s; its jobs fail at once until a retry in %.1f s",
                self.name,
                self.where(server),
                type(exc).__name__,
                exc,
                hint,
                breaker.first_delay,
            )


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


class NamespaceClaim:
    """Claiming a namespace on the server, and checking the ACL lets this stack use it.

    Every engine that shares a namespace must write blocks of one size and one format (signed or
    not), or one engine would read another's blocks as corrupt. The first engine claims the
    namespace with a marker key (``SET NX``); a later one with a different marker is refused
    with a :class:`ConfigError` naming both. Then every command the tier uses runs once on a probe
    key, so a user the server's ACL confines elsewhere fails the build instead of every job.

    In a Cluster the marker has a copy on every master (:meth:`Namespace.copies`), so that no
    single master is the namespace's single point of failure: the stack starts when it reached
    at least one copy and every copy it reached holds its marker (or none yet: it writes it); the
    copies on masters that were down are claimed when they answer again. Two stacks of different
    formats are kept apart whenever they reach one master in common (its copy is claimed by one
    ``SET NX``, the other stack reads it and is refused); a stack that finds a conflict deletes
    the copies it wrote, so a refused stack leaves no claim behind. Whatever the markers say, the
    header of every value still rejects a block of another size or format (:mod:`.stored`).

    At startup an unreachable server is only a warning (checked again before each job); a wrong
    password, a missing database, a refused ACL or a Cluster node configured as a standalone
    server is a :class:`ConfigError`. A mismatch found after startup makes every later job fail
    with that message (``fatal``).

    Checked once, from any thread (startup, the I/O threads, the lookup thread), under
    its own lock; its state is its own.
    """

    def __init__(
        self,
        settings: RedisTierSettings,
        servers: Servers,
        transport: Transport,
        block_size: int,
        auth: BlockAuth | None,
    ) -> None:
        self.settings = settings
        self.servers = servers
        self.transport = transport
        self.block_size = block_size
        self.auth = auth
        #: Why every job fails from now on (a mismatch or an ACL refusal found after startup).
        self.fatal: str | None = None
        self.marker = stored.marker(auth, block_size)
        self._claimed: set[bytes] = set()  # copies that hold this stack's marker
        self._created: dict[bytes, Redis] = {}  # the copies this stack wrote, and where
        self._checked = False  # every copy claimed: nothing left to do
        self._usable = False  # at least one copy claimed: jobs may run
        self._retry_at = 0.0  # when to try the unclaimed copies again
        self._lock = threading.Lock()

    def copies(self) -> list[stored.MarkerCopy]:
        """Where the marker lives (:func:`.stored.marker_copies`) on the servers as the
        slot map has them now."""
        copies = stored.marker_copies(self.settings.namespace, self.servers.masters())
        if not copies:
            raise Unreachable("the Cluster's slot map has no master")
        return copies

    def check(self, *, at_startup: bool) -> None:
        """Claim ``namespace`` for this block size and format, or refuse a namespace that
        holds another one. At startup an unreachable server is only a warning (the tier
        retries); a wrong password or a mismatch is a :class:`ConfigError`. Once a copy is
        claimed, the others are tried again at most once per ``retry_after_s``, without
        failing the job that tries."""
        if self._checked or (self._usable and time.monotonic() < self._retry_at):
            return
        with self._lock:
            if self._checked or (self._usable and time.monotonic() < self._retry_at):
                return
            try:
                self._claim_copies(at_startup)
            except (BatchFailed, Unreachable) as exc:
                self._unreachable(exc, at_startup)

    def _claim_copies(self, at_startup: bool) -> None:
        """Claim every copy not claimed yet that can be reached; a conflict raises."""
        s = self.settings
        pending = [c for c in self.copies() if c.key not in self._claimed]
        groups = self.servers.route([c.key for c in pending])
        missed: list[str] = []  # why each copy not claimed now was not
        for group in groups:
            for index in group.indices:
                copy = pending[index]
                client, breaker = group.client, group.breaker
                if client is None or breaker is None:
                    missed.append(group.reason)
                    continue
                if not at_startup and not breaker.allow():
                    missed.append(f"{self.transport.where(group.server)} is down; retrying later")
                    continue
                try:
                    if at_startup and not s.cluster:
                        self._refuse_cluster_node(client)
                    theirs = self._claim_one(client, copy)
                except _Denied as exc:
                    self._conflict(
                        stored.denied_error(self.settings, exc.command, exc.error), at_startup
                    )
                except UNREACHABLE as exc:
                    self.transport.server_failed(group.server, breaker, exc)
                    if at_startup:
                        self._refuse_credentials(exc)
                    missed.append(f"{self.transport.where(group.server)}: {type(exc).__name__}")
                    continue
                except ResponseError as exc:
                    if at_startup:
                        self._refuse_response(exc)
                    if isinstance(exc, REROUTE):
                        self.servers.refresh_topology()  # the slot moved: its new owner, later
                    # e.g. OOM under maxmemory-policy noeviction: the server is up, try later
                    missed.append(f"{self.transport.where(group.server)} refused it: {exc}")
                    continue
                breaker.success()
                if theirs is None:
                    missed.append(f"the copy on {self.transport.where(group.server)} vanished")
                    continue
                if theirs != self.marker:
                    self._conflict(
                        stored.mismatch_error(self.settings, self.marker, theirs, self.block_size),
                        at_startup,
                    )
                self._claimed.add(copy.key)
        if not missed:
            self._checked = True
            return
        if not self._claimed:
            raise BatchFailed("; ".join(missed))
        self._retry_at = time.monotonic() + s.retry_after_s
        if not self._usable or at_startup:
            logger.warning(
                "%s: namespace %r claimed on %d of %d masters (not on the others: %s); the "
                "tier uses the live masters and claims it on the others when they answer",
                self.transport.name,
                s.namespace,
                len(self._claimed),
                len(self._claimed) + len(missed),
                "; ".join(missed),
            )
        self._usable = True

    def _claim_one(self, client: Redis, copy: stored.MarkerCopy) -> str | None:
        """``SET NX`` one copy (remembered if this stack wrote it), else read it; then run
        the tier's commands on a probe in its slot. The marker it holds (``None``: it
        vanished between the two commands, try again later)."""
        try:
            if client.set(copy.key, self.marker, nx=True):
                self._created[copy.key] = client
                theirs = self.marker
            else:
                stored = client.get(copy.key)
                if stored is None:  # evicted between the two commands
                    return None
                if isinstance(stored, str):
                    theirs = stored
                else:
                    theirs = bytes(stored).decode(errors="replace")
        except NoPermissionError as exc:
            raise _Denied("SET NX / GET (the namespace marker)", exc) from None
        self._check_permissions(client, copy)
        return theirs

    def _conflict(self, error: ConfigError, at_startup: bool) -> NoReturn:
        """Give up the namespace: delete the copies this stack wrote (a refused stack leaves
        no claim that would refuse the namespace's rightful users), then raise ``error`` at
        startup, or fail every job with it from now on."""
        for key, client in self._created.items():
            try:
                if client.get(key) == self.marker.encode():
                    client.delete(key)
            except Exception as exc:  # the copy stays; a stale claim is the lesser harm
                logger.debug("%s: could not withdraw %r: %s", self.transport.name, key, exc)
        self._created.clear()
        if at_startup:
            raise error
        self.fatal = str(error)
        logger.error("%s: %s", self.transport.name, error)
        raise BatchFailed(str(error))

    def _unreachable(self, exc: BatchFailed | Unreachable, at_startup: bool) -> None:
        """No copy could be claimed: a ConfigError for a Cluster refusal, else a warning at
        startup (the tier starts, its jobs fail until a copy is claimed) or a failed job."""
        s = self.settings
        refused = _refusal(exc) or _refusal(self.servers.init_error)
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
        if not at_startup:
            raise BatchFailed(str(exc)) from None
        logger.warning(
            "%s: %s is not reachable at startup (%s); jobs fail until it is",
            self.transport.name,
            s.safe_url,
            exc,
        )

    def _refuse_cluster_node(self, client: Redis) -> None:
        """``cluster = false`` against a Cluster node: a :class:`ConfigError` (else jobs fail
        with ``MOVED`` for the keys of the other masters' slots). Asked with ``INFO``, else
        (an ACL user without it) with ``CLUSTER SLOTS``, which a Cluster user has; a user
        allowed neither is caught by the ``MOVED`` a claim may get."""
        try:
            enabled = bool(client.info("cluster").get("cluster_enabled"))
        except NoPermissionError:
            try:
                client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
            except ResponseError:  # standalone ("cluster support disabled") or refused
                return
            enabled = True
        if enabled:
            raise stored.cluster_node_error(self.settings)

    def _refuse_credentials(self, exc: BaseException) -> None:
        """A wrong password or an untrusted certificate, found at startup: a ConfigError."""
        s = self.settings
        if isinstance(exc, AuthenticationError):
            raise ConfigError(
                f"tier {s.tier!r}: {s.safe_url} refused the credentials "
                f"({exc}); check the password in the url or in password_env"
            ) from None
        if "certificate verify failed" in str(exc).lower():
            raise ConfigError(
                f"tier {s.tier!r}: the TLS certificate of {s.safe_url} is not "
                f"trusted ({exc}); set tls_ca_file to the CA that signed it"
            ) from None

    def _refuse_response(self, exc: ResponseError) -> None:
        """A server reply at startup that means the config is wrong: a ConfigError."""
        s = self.settings
        if "DB index" in str(exc):
            raise ConfigError(
                f"tier {s.tier!r}: url {s.safe_url!r} selects database {s.db}, which "
                f"the server does not have ({exc}; a server has databases 0 to its "
                f"'databases' setting - 1, 16 by default); fix the db number in url",
                key="url",
            ) from None
        if not s.cluster and isinstance(exc, REROUTE):
            raise stored.cluster_node_error(self.settings) from None

    def _check_permissions(self, client: Redis, copy: stored.MarkerCopy) -> None:
        """Run every command the tier uses once on a probe key of the namespace, so that a
        user the server's ACL does not let use it fails the build (:class:`ConfigError`)
        instead of every later job failing one by one. The probe's hash tag puts it in the
        copy's Cluster slot: the same server answers."""
        probe = stored.probe_key(self.settings.namespace, copy)
        pipe = client.pipeline(transaction=False)
        pipe.set(probe, b"1", px=60_000)
        pipe.get(probe)
        pipe.exists(probe)
        pipe.delete(probe)
        replies = pipe.execute(raise_on_error=False)
        for command, reply in zip(stored.PROBE_COMMANDS, replies):
            if isinstance(reply, NoPermissionError):
                raise _Denied(command, reply)
            # Other errors (OOM under noeviction, ...) are the server's state, not the ACL's.


_EXISTS_CHUNK = 1024

#: A batch of one job: its keys and CPU slots in, the keys that failed and why out.
Batch = Callable[[Sequence[OffloadKey], Sequence[int]], tuple[list[OffloadKey], str | None]]


class BlockIO:
    """Moving blocks: a batch of stores or loads, one pipeline per server, and existence checks.

    Run on the tier's I/O threads (lookups' existence checks on the lookup helper's thread). A
    store sends each CPU row as it is in the buffer (no copy, see :mod:`.wire`) behind a header
    (:mod:`.stored`); a load checks every value and copies the payload into its CPU row: a value
    that fails the check or vanished fails that key, is counted, and a bad one is deleted. Each
    batch returns the keys that failed and the first reason, so one dead Cluster master fails
    the keys in its slots, not every job that touches it.

    Stores, loads and existence checks of one tier's blocks, against its servers.

    A key that failed a load is reported in the job's result; the scheduler side then drops
    what its lookups believed about it.
    """

    def __init__(
        self,
        transport: Transport,
        cpu: npt.NDArray[np.uint8],
        block_size: int,
        auth: BlockAuth | None,
        counters: Counters,
        auth_log: AuthFailureLog,
    ) -> None:
        settings = transport.settings
        self.transport = transport
        self.servers: Servers = transport.servers
        self.name = transport.name
        self.cpu = cpu
        self.block_size = block_size
        self.auth = auth
        self.counters = counters
        self.auth_log = auth_log
        self.prefix = stored.key_prefix(settings.namespace)
        self.ttl_ms = None if settings.ttl_s is None else max(1, int(settings.ttl_s * 1000))

    def rkey(self, key: OffloadKey) -> bytes:
        """The Redis key of a block: the namespace, then the key in hex."""
        return self.prefix + key.hex().encode()

    def store(
        self, keys: Sequence[OffloadKey], slots: Sequence[int]
    ) -> tuple[list[OffloadKey], str | None]:
        """SET each key on its server; the keys that failed, and the first reason."""
        rkeys = [self.rkey(k) for k in keys]
        expiry: tuple[Any, ...] = () if self.ttl_ms is None else ("PX", self.ttl_ms)
        failed: list[OffloadKey] = []
        reason: str | None = None
        transport = self.transport
        for group in self.servers.route(rkeys):
            why = transport.usable(group)
            if why is None:
                commands = []
                for i in group.indices:
                    row = self.cpu[slots[i]]
                    head = stored.header(keys[i], row, self.auth)
                    commands.append(("SET", rkeys[i], Parts(head, row), *expiry))
                try:
                    replies = transport.execute(group, commands)
                except BatchFailed as exc:
                    why = str(exc)
                else:
                    for i, reply in zip(group.indices, replies):
                        if isinstance(reply, Exception):
                            # e.g. OOM with maxmemory-policy noeviction: the server is up
                            if reason is None:
                                logger.warning("%s: a store was refused: %s", self.name, reply)
                            failed.append(keys[i])
                            reason = reason or f"the server refused the store: {reply}"
                    continue
            failed.extend(keys[i] for i in group.indices)
            reason = reason or why
        written = len(keys) - len(failed)
        self.counters.count(stored_blocks=written, bytes_written=written * self.block_size)
        return failed, reason

    def load(
        self, keys: Sequence[OffloadKey], slots: Sequence[int]
    ) -> tuple[list[OffloadKey], str | None]:
        """GET each key from its server into its CPU slot, checked; the keys that failed."""
        rkeys = [self.rkey(k) for k in keys]
        failed: list[OffloadKey] = []
        reason: str | None = None
        transport = self.transport
        for group in self.servers.route(rkeys):
            why = transport.usable(group)
            if why is None:
                try:
                    replies = transport.execute(group, [("GET", rkeys[i]) for i in group.indices])
                except BatchFailed as exc:
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
                with contextlib.suppress(BatchFailed):
                    transport.execute(group, [("DEL", k) for k in corrupt])
        loaded = len(keys) - len(failed)
        self.counters.count(loaded_blocks=loaded, bytes_read=loaded * self.block_size)
        return failed, reason

    def _land(self, key: OffloadKey, rkey: bytes, slot: int, value: Any) -> tuple[str, bool] | None:
        """Check one GET reply and copy its payload into CPU slot ``slot``; ``None``, or why
        not and whether to delete the value."""
        if value is None:
            self.counters.count(vanished_values=1)
            return "a block vanished (evicted, expired or deleted)", False
        if isinstance(value, ResponseError):
            return str(value), False
        try:
            payload = stored.check(value, key, self.block_size, self.auth)
        except stored.AuthFailed as exc:
            self.counters.auth_failed(exc.kind)
            fate = "deleted" if exc.delete else "left alone"
            self.auth_log.report(
                exc.kind, f"value {rkey.decode()!r}: {exc}", f"the value is {fate}"
            )
            return f"unauthenticated value ({exc.kind}): {exc}", exc.delete
        except stored.BadValue as exc:
            self.counters.count(corrupt_values=1)
            logger.warning(
                "%s: value %r failed its check (%s); %s, the load fails",
                self.name,
                rkey.decode(),
                exc,
                "deleted" if exc.delete else "left alone",
            )
            return f"corrupt value: {exc}", exc.delete
        np.copyto(self.cpu[slot], np.frombuffer(payload, np.uint8))
        return None

    def exists(self, keys: list[OffloadKey]) -> list[bool]:
        """One round trip of ``EXISTS`` commands per server (and per 1,024 keys); keys of an
        unreachable server answer ``False`` (a miss: the engine recomputes)."""
        answers = [False] * len(keys)
        rkeys = [self.rkey(k) for k in keys]
        for group in self.servers.route(rkeys):
            if group.client is None or group.breaker is None or not group.breaker.allow():
                continue
            for start in range(0, len(group.indices), _EXISTS_CHUNK):
                chunk = group.indices[start : start + _EXISTS_CHUNK]
                names = [rkeys[i] for i in chunk]
                try:
                    replies = self.transport.talk(group, functools.partial(exists_many, keys=names))
                except BatchFailed:
                    break
                except ResponseError as exc:  # MOVED after a failover, NOAUTH, ...
                    logger.debug("%s: existence check refused: %s", self.name, exc)
                    if isinstance(exc, REROUTE):
                        self.servers.refresh_topology()
                    break
                self.counters.count(lookup_round_trips=1)
                for i, present in zip(chunk, replies):
                    answers[i] = present
        return answers


# -- the worker threads -------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """What the scheduler side hands the I/O side for one job, immutable: the job's id, its
    keys and their CPU slots (the rows to read for a store, to fill for a load)."""

    job_id: int
    keys: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    load: bool


class IOSide:
    """The tier's I/O: its servers, its namespace claim, its worker threads and what they
    finished.

    Constructing it claims the namespace (:meth:`NamespaceClaim.check` at startup: a
    :class:`ConfigError` for a wrong password, database, ACL or a mismatched namespace) and
    then starts ``io_threads`` workers. :meth:`submit` queues a :class:`Transfer`;
    :meth:`get_finished` hands back, on the scheduler's thread, the results the workers
    queued since the last call (the queue is this object's: the workers append, only this
    method takes).
    """

    def __init__(
        self, settings: RedisTierSettings, cpu: npt.NDArray[np.uint8], block_size: int
    ) -> None:
        name = settings.tier
        self.settings = settings
        self.counters = Counters()
        self.servers = Servers(settings)
        transport = Transport(name, settings, self.servers, self.counters)
        self.namespace = NamespaceClaim(
            settings, self.servers, transport, block_size, settings.auth
        )
        try:
            self.namespace.check(at_startup=True)
        except BaseException:
            self.servers.close()  # no thread started yet; leave no socket behind either
            raise
        self.blocks = BlockIO(
            transport,
            cpu,
            block_size,
            settings.auth,
            self.counters,
            AuthFailureLog(name, logger),
        )
        self._finished: deque[JobResult] = deque()
        self._pool = ThreadPoolExecutor(
            settings.io_threads, thread_name_prefix=f"kv-offload-{name}"
        )

    def submit(self, transfer: Transfer) -> None:
        self._pool.submit(self._run, transfer)

    def get_finished(self) -> list[JobResult]:
        """The results finished since the last call (scheduler thread)."""
        finished = self._finished
        out: list[JobResult] = []
        while finished:
            out.append(finished.popleft())
        return out

    def down(self) -> bool:
        """Whether a standalone server is known down now (its breaker open, no retry due): a
        new job would fail at once."""
        return self.servers.standalone_blocked()

    def close(self) -> None:
        """Wait for the workers to finish their jobs, then close every connection."""
        self._pool.shutdown(wait=True)
        self.servers.close()

    def _run(self, transfer: Transfer) -> None:
        """One job, batch after batch; always ends in exactly one result. A batch returns the
        keys it could not store or load (their server down, their value gone or corrupt):
        only those fail, the job's other keys succeed (``JobResult.failed_keys``), so one
        dead Cluster master fails the keys in its slots, not every job that touches it."""
        keys = transfer.keys
        failed: set[OffloadKey] = set()
        reason: str | None = None
        try:
            namespace = self.namespace
            if namespace.fatal is not None:
                raise BatchFailed(namespace.fatal)
            namespace.check(at_startup=False)
            batch: Batch = self.blocks.load if transfer.load else self.blocks.store
            slots = transfer.slots
            step = self.settings.batch_blocks
            for start in range(0, len(keys), step):
                batch_failed, why = batch(keys[start : start + step], slots[start : start + step])
                failed.update(batch_failed)
                reason = reason or why
        except BatchFailed as exc:
            logger.debug("%s: job %d failed: %s", self.settings.tier, transfer.job_id, exc)
            failed, reason = set(keys), str(exc)
        except Exception as exc:
            logger.exception("%s: job %d failed unexpectedly", self.settings.tier, transfer.job_id)
            failed, reason = set(keys), f"internal error: {type(exc).__name__}: {exc}"
        finally:
            success = len(failed) < len(keys)
            if failed:
                self.counters.job_failed(transfer.load)
            self._finished.append(
                JobResult(
                    transfer.job_id,
                    success,
                    reason if failed else None,
                    frozenset(failed) if success else frozenset(),
                )
            )

    def exists(self, keys: list[OffloadKey]) -> list[bool]:
        """The lookup helper's resolver (:meth:`BlockIO.exists`, on its thread); every key a
        miss while the namespace cannot be used."""
        namespace = self.namespace
        if namespace.fatal is not None:
            return [False] * len(keys)
        try:
            namespace.check(at_startup=False)
        except BatchFailed:
            return [False] * len(keys)
        return self.blocks.exists(keys)
