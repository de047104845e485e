"""Moving blocks: a batch of stores or loads, one pipeline per server, and existence checks.

Run on the tier's I/O threads (lookups' existence checks on the lookup helper's thread). A
store sends each CPU row as it is in the buffer (no copy, see :mod:`.wire`) behind a header
(:mod:`.codec`); a load checks every value and copies the payload into its CPU row: a value
that fails the check or vanished fails that key, is counted, and a bad one is deleted. Each
batch returns the keys that failed and the first reason, so one dead Cluster master fails
the keys in its slots, not every job that touches it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey
from kv_offload.block_auth import AuthFailureLog, BlockAuth
from redis.exceptions import ResponseError

from . import codec
from .servers import Servers
from .stats import Counters
from .transport import REROUTE, BatchFailed, Transport
from .wire import Parts, exists_many

__all__ = ["BlockIO", "Batch"]

logger = logging.getLogger("kv_offload.redis_tier")

_EXISTS_CHUNK = 1024

#: A batch of one job: its keys and CPU slots in, the keys that failed and why out.
Batch = Callable[[list[OffloadKey], list[int]], tuple[list[OffloadKey], str | None]]


class BlockIO:
    """Stores, loads and existence checks of one tier's blocks, against its servers.

    ``forget`` drops what the tier's lookups believe about a key whose value turned out gone
    or bad, so the next lookup asks the server again.
    """

    def __init__(
        self,
        transport: Transport,
        cpu: npt.NDArray[np.uint8],
        block_size: int,
        auth: BlockAuth | None,
        counters: Counters,
        auth_log: AuthFailureLog,
        forget: Callable[[OffloadKey], None],
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
        self.forget = forget
        self.prefix = f"{settings.namespace}:".encode()
        self.ttl_ms = None if settings.ttl_s is None else max(1, int(settings.ttl_s * 1000))

    def rkey(self, key: OffloadKey) -> bytes:
        """The Redis key of a block: the namespace, then the key in hex."""
        return self.prefix + key.hex().encode()

    def store(
        self, keys: list[OffloadKey], slots: list[int]
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
                    head = codec.header(keys[i], row, self.auth)
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
        stored = len(keys) - len(failed)
        self.counters.count(stored_blocks=stored, bytes_written=stored * self.block_size)
        return failed, reason

    def load(self, keys: list[OffloadKey], slots: list[int]) -> tuple[list[OffloadKey], str | None]:
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
            self.forget(key)
            return "a block vanished (evicted, expired or deleted)", False
        if isinstance(value, ResponseError):
            return str(value), False
        try:
            payload = codec.check(value, key, self.block_size, self.auth)
        except codec.AuthFailed as exc:
            self.forget(key)
            self.counters.auth_failed(exc.kind)
            fate = "deleted" if exc.delete else "left alone"
            self.auth_log.report(
                exc.kind, f"value {rkey.decode()!r}: {exc}", f"the value is {fate}"
            )
            return f"unauthenticated value ({exc.kind}): {exc}", exc.delete
        except codec.BadValue as exc:
            self.counters.count(corrupt_values=1)
            self.forget(key)
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
