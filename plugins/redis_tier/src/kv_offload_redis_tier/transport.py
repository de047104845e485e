"""Talking to one server of the tier: a pipelined round trip through its circuit breaker.

A connection failure or a timeout opens the server's breaker (:mod:`.breaker`): later batches
for it fail at once, without I/O, until a retry after ``retry_after_s`` (doubling). In a
Cluster a failing or rerouting node may have been replaced (a replica promoted to its slots),
so the slot map is read again and the next batch goes to the new owner: the tier heals without
a restart. Failures come back as :class:`BatchFailed` with a reason a ``JobResult`` can carry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from redis import Redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .breaker import CircuitBreaker
from .servers import Group, Servers
from .settings import RedisTierSettings
from .stats import Counters

__all__ = ["REROUTE", "UNREACHABLE", "BatchFailed", "Transport"]

logger = logging.getLogger("kv_offload.redis_tier")

#: Errors that mean "this server cannot be reached right now": they open its breaker.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: Replies that mean "ask the right node": refresh the Cluster slot map.
REROUTE = (AskError, ClusterDownError, TryAgainError)


class BatchFailed(Exception):
    """A batch (or a part of it for one server) failed; the message says why (already
    counted and logged)."""


class Transport:
    """Round trips to the tier's servers, each through its breaker."""

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
