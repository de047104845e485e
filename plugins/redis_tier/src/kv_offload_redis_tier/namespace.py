"""Claiming a namespace on the server, and checking the ACL lets this stack use it.

Every engine that shares a namespace must write blocks of one size and one format (signed or
not), or one engine would read another's blocks as corrupt. The first engine claims the
namespace with a marker key (``SET NX``); a later one with a different marker is refused
with a :class:`ConfigError` naming both. Then every command the tier uses runs once on a probe
key, so a user the server's ACL confines elsewhere fails the build instead of every job. At
startup an unreachable server is only a warning (checked again before each job); a wrong
password, a missing database or a refused ACL is a :class:`ConfigError`. A mismatch found
after startup makes every later job fail with that message (``fatal``).
"""

from __future__ import annotations

import logging
import threading

from kv_offload.block_auth import BlockAuth
from kv_offload.errors import ConfigError
from redis import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from . import codec
from .servers import Servers, Unreachable
from .settings import RedisTierSettings
from .transport import UNREACHABLE, BatchFailed, Transport

__all__ = ["Namespace"]

logger = logging.getLogger("kv_offload.redis_tier")


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


class Namespace:
    """The namespace claim of one tier: checked once, from any thread."""

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
        self._checked = False
        self._lock = threading.Lock()

    def check(self, *, at_startup: bool) -> None:
        """Claim ``namespace`` for this block size and format, or refuse a namespace that
        holds another one. At startup an unreachable server is only a warning (the tier
        retries); a wrong password or a mismatch is a :class:`ConfigError`."""
        if self._checked:
            return
        with self._lock:
            if self._checked:
                return
            s = self.settings
            meta = f"{s.namespace}:__format__".encode()
            version = codec.format_version(self.auth)
            mine = f"kv-offload-redis-tier format={version} block_size={self.block_size}"
            try:
                server, client, breaker = self.servers.client_for(meta)
                if not at_startup and not breaker.allow():
                    raise BatchFailed(f"{self.transport.where(server)} is down; retrying later")
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
                    self.fatal = str(denied)
                    logger.error("%s: %s", self.transport.name, denied)
                    raise BatchFailed(str(denied)) from None
                except UNREACHABLE as exc:
                    self.transport.server_failed(server, breaker, exc)
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
                    raise BatchFailed(
                        f"{self.transport.where(server)}: {type(exc).__name__}"
                    ) from None
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
            except (BatchFailed, Unreachable) as exc:
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
                if at_startup:
                    logger.warning(
                        "%s: %s is not reachable at startup (%s); jobs fail until it is",
                        self.transport.name,
                        s.safe_url,
                        exc,
                    )
                    return
                raise BatchFailed(str(exc)) from None
            if theirs != mine:
                hint = "give this model or block size its own namespace"
                if f"block_size={self.block_size}" in theirs.split():
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
                self.fatal = message
                logger.error("%s: %s", self.transport.name, message)
                raise BatchFailed(message)
            self._checked = True

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
