"""Which server holds a key: one standalone server, or the master of the key's Cluster slot.

The tier batches per server: :meth:`Servers.route` splits a batch of keys into one group per
server, and each group goes out as one pipeline (one round trip). Each server has its own
:class:`~.breaker.CircuitBreaker`, so in a Cluster a dead master fails only the keys of its
slots while the other masters keep serving. Clients never retry on their own (the breaker
decides when to try again), and their connections pack commands with
:class:`~.wire.ZeroCopyPacker`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis import Redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, SlotNotCoveredError
from redis.retry import Retry

from .breaker import CircuitBreaker
from .settings import RedisTierSettings
from .wire import ZeroCopyPool

__all__ = ["Group", "Servers", "Unreachable"]

logger = logging.getLogger("kv_offload.redis_tier")


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
