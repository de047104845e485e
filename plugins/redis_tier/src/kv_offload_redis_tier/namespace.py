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
header of every value still rejects a block of another size or format (:mod:`.codec`).

At startup an unreachable server is only a warning (checked again before each job); a wrong
password, a missing database, a refused ACL or a Cluster node configured as a standalone
server is a :class:`ConfigError`. A mismatch found after startup makes every later job fail
with that message (``fatal``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

from kv_offload.block_auth import BlockAuth
from kv_offload.errors import ConfigError
from redis import Redis
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from . import codec
from .servers import Servers, Unreachable
from .settings import RedisTierSettings
from .transport import REROUTE, UNREACHABLE, BatchFailed, Transport

__all__ = ["Namespace"]

logger = logging.getLogger("kv_offload.redis_tier")

#: How many hash tags ``{0}``, ``{1}``, ... are tried to find a slot of every master.
_TAG_SEARCH = 1 << 16


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


@dataclass(frozen=True)
class _Copy:
    """One copy of the namespace marker: its key, and the hash tag that puts the ACL probe
    in the same slot (so the same server answers both)."""

    key: bytes
    tag: bytes


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
        self.marker = (
            f"kv-offload-redis-tier format={codec.format_version(auth)} block_size={block_size}"
        )
        self._home = _Copy(f"{settings.namespace}:__format__".encode(), b"")
        self._claimed: set[bytes] = set()  # copies that hold this stack's marker
        self._created: dict[bytes, Redis] = {}  # the copies this stack wrote, and where
        self._checked = False  # every copy claimed: nothing left to do
        self._usable = False  # at least one copy claimed: jobs may run
        self._retry_at = 0.0  # when to try the unclaimed copies again
        self._lock = threading.Lock()

    def copies(self) -> list[_Copy]:
        """Where the marker lives: ``<namespace>:__format__`` (the only copy on a standalone
        server, and the one older versions read), and in a Cluster a copy
        ``<namespace>:__format__{N}`` on every other master, ``N`` the first number whose
        slot that master owns. A namespace with a hash tag of its own has all its keys in
        one slot, hence one copy."""
        home = self._home
        masters = self.servers.masters()
        if masters is None or key_slot(home.key + b"{0}") == key_slot(home.key + b"{1}"):
            return [home]
        wanted = set(masters.values())
        if not wanted:
            raise Unreachable("the Cluster's slot map has no master")
        chosen: dict[str, _Copy] = {}
        owner = masters.get(key_slot(home.key))
        if owner is not None:
            chosen[owner] = home
        for number in range(_TAG_SEARCH):
            if len(chosen) == len(wanted):
                break
            tag = str(number).encode()
            key = home.key + b"{" + tag + b"}"
            owner = masters.get(key_slot(key))
            if owner is not None and owner not in chosen:
                chosen[owner] = _Copy(key, tag)
        return list(chosen.values())

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
                    self._conflict(self._denied(exc.command, exc.error), at_startup)
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
                    self._conflict(self._mismatch(theirs), at_startup)
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

    def _claim_one(self, client: Redis, copy: _Copy) -> str | None:
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
            raise self._cluster_node()

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
            raise self._cluster_node() from None

    def _cluster_node(self) -> ConfigError:
        s = self.settings
        return ConfigError(
            f"tier {s.tier!r}: cluster = false, but {s.safe_url} is a Redis Cluster node "
            f"(it answers only for its own slots); set cluster = true (and startup_nodes "
            f"to more of its nodes), or point url at a standalone server",
            key="cluster",
        )

    def _mismatch(self, theirs: str) -> ConfigError:
        s = self.settings
        hint = "give this model or block size its own namespace"
        if f"block_size={self.block_size}" in theirs.split():
            hint = (
                "every engine of a namespace must set auth_key_env (format=2) or none "
                "(format=1); set it here too, or give this stack its own namespace"
            )
        return ConfigError(
            f"tier {s.tier!r}: namespace {s.namespace!r} on {s.safe_url} holds "
            f"{theirs!r}, this stack writes {self.marker!r}; {hint}"
        )

    def _check_permissions(self, client: Redis, copy: _Copy) -> None:
        """Run every command the tier uses once on a probe key of the namespace, so that a
        user the server's ACL does not let use it fails the build (:class:`ConfigError`)
        instead of every later job failing one by one. The probe's hash tag puts it in the
        copy's Cluster slot: the same server answers."""
        tag = copy.tag or copy.key
        probe = f"{self.settings.namespace}:__acl_probe__{{".encode() + tag + b"}"
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
