"""The tier's config keys, validated once, and the secret kept out of every printout.

The password comes from the URL (``redis://:secret@host``) or, better, from an environment
variable named by ``password_env``. :class:`RedisTierSettings` keeps it in a field excluded
from ``repr`` and shows the URL as :attr:`RedisTierSettings.safe_url`, with the password
replaced by ``***``: that is the only form logs and error messages use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from kv_offload.block_auth import BlockAuth
from kv_offload.errors import ConfigError

__all__ = ["RedisTierSettings", "redact_url"]


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info part replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _positive(tier: str, name: str, value: Any, *, integer: bool = False) -> None:
    number = isinstance(value, int) or (not integer and isinstance(value, float))
    if isinstance(value, bool) or not number or value <= 0:
        kind = "int" if integer else "number"
        raise ConfigError(
            f"tier {tier!r}: {name} must be a positive {kind}, got {value!r}", key=name
        )


@dataclass(frozen=True)
class RedisTierSettings:
    tier: str
    safe_url: str
    host: str
    port: int
    db: int
    username: str | None
    use_tls: bool
    cluster: bool
    startup_nodes: tuple[tuple[str, int], ...]
    namespace: str
    ttl_s: float | None
    batch_blocks: int
    connect_timeout_s: float
    timeout_s: float
    max_in_flight: int
    io_threads: int
    retry_after_s: float
    max_retry_after_s: float
    lookup_cache: int
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    password: str | None = field(default=None, repr=False)
    #: signs and checks every value (``auth_key_env``); ``None``: checksums only
    auth: BlockAuth | None = None

    @classmethod
    def from_args(
        cls,
        tier: str,
        *,
        url: str,
        password_env: str | None,
        cluster: bool,
        startup_nodes: Sequence[str] | None,
        namespace: str,
        ttl_s: float | None,
        batch_blocks: int,
        connect_timeout_s: float,
        timeout_s: float,
        max_in_flight: int,
        io_threads: int,
        retry_after_s: float,
        max_retry_after_s: float,
        lookup_cache: int,
        tls_ca_file: str | None,
        tls_cert_file: str | None,
        tls_key_file: str | None,
        auth_key_env: str | None = None,
        auth_key_previous_env: str | None = None,
    ) -> RedisTierSettings:
        if not isinstance(url, str):
            raise ConfigError(
                f"tier {tier!r}: url must be a string like redis://host:6379/0", key="url"
            )
        safe = redact_url(url)
        try:
            parts = urlsplit(url)
            port = parts.port or 6379
        except ValueError as exc:
            raise ConfigError(
                f"tier {tier!r}: url {safe!r} is malformed ({exc})", key="url"
            ) from None
        if parts.scheme not in ("redis", "rediss"):
            raise ConfigError(
                f"tier {tier!r}: url {safe!r} must start with redis:// (plain) or rediss:// (TLS)",
                key="url",
            )
        if not parts.hostname:
            raise ConfigError(f"tier {tier!r}: url {safe!r} names no host", key="url")
        path = parts.path.lstrip("/")
        if path and not path.isdigit():
            raise ConfigError(
                f"tier {tier!r}: url {safe!r}: the path must be a db number", key="url"
            )
        db = int(path or 0)
        if cluster and db:
            raise ConfigError(
                f"tier {tier!r}: Redis Cluster has only db 0; drop /{db} from url", key="url"
            )
        password = unquote(parts.password) if parts.password is not None else None
        if password_env is not None:
            if not isinstance(password_env, str) or not password_env:
                raise ConfigError(
                    f"tier {tier!r}: password_env must name an environment variable",
                    key="password_env",
                )
            if password is not None:
                raise ConfigError(
                    f"tier {tier!r}: the password is both in url and in password_env "
                    f"{password_env!r}; keep only password_env",
                    key="password_env",
                )
            if password_env not in os.environ:
                raise ConfigError(
                    f"tier {tier!r}: environment variable {password_env!r} (password_env) is "
                    f"not set; export it with the server's password",
                    key="password_env",
                )
            password = os.environ[password_env]
        if not isinstance(cluster, bool):
            raise ConfigError(
                f"tier {tier!r}: cluster must be true or false, got {cluster!r}", key="cluster"
            )
        nodes: list[tuple[str, int]] = []
        if startup_nodes is not None:
            if not cluster:
                raise ConfigError(
                    f"tier {tier!r}: startup_nodes needs cluster = true", key="startup_nodes"
                )
            if isinstance(startup_nodes, str) or not isinstance(startup_nodes, Sequence):
                raise ConfigError(
                    f"tier {tier!r}: startup_nodes must be a list of 'host:port' strings",
                    key="startup_nodes",
                )
            for node in startup_nodes:
                host, sep, node_port = str(node).rpartition(":")
                if not sep or not host or not node_port.isdigit():
                    raise ConfigError(
                        f"tier {tier!r}: startup node {node!r} is not 'host:port'",
                        key="startup_nodes",
                    )
                nodes.append((host.strip("[]"), int(node_port)))
        if not isinstance(namespace, str) or not namespace or any(c.isspace() for c in namespace):
            raise ConfigError(
                f"tier {tier!r}: namespace must be a non-empty string without spaces, got "
                f"{namespace!r}",
                key="namespace",
            )
        if ttl_s is not None:
            _positive(tier, "ttl_s", ttl_s)
        numbers: tuple[tuple[str, Any], ...] = (
            ("batch_blocks", batch_blocks),
            ("max_in_flight", max_in_flight),
            ("io_threads", io_threads),
            ("lookup_cache", lookup_cache),
        )
        for name, value in numbers:
            _positive(tier, name, value, integer=True)
        numbers = (
            ("connect_timeout_s", connect_timeout_s),
            ("timeout_s", timeout_s),
            ("retry_after_s", retry_after_s),
            ("max_retry_after_s", max_retry_after_s),
        )
        for name, value in numbers:
            _positive(tier, name, value)
        if max_retry_after_s < retry_after_s:
            raise ConfigError(
                f"tier {tier!r}: max_retry_after_s ({max_retry_after_s}) must be >= "
                f"retry_after_s ({retry_after_s})",
                key="max_retry_after_s",
            )
        use_tls = parts.scheme == "rediss"
        files: tuple[tuple[str, str | None], ...] = (
            ("tls_ca_file", tls_ca_file),
            ("tls_cert_file", tls_cert_file),
            ("tls_key_file", tls_key_file),
        )
        for name, file in files:
            if file is None:
                continue
            if not use_tls:
                raise ConfigError(f"tier {tier!r}: {name} needs a rediss:// url", key=name)
            if not os.path.isfile(file):
                raise ConfigError(
                    f"tier {tier!r}: {name} {file!r} is not a readable file", key=name
                )
        auth = BlockAuth.from_arguments(
            tier,
            auth_key_env,
            auth_key_previous_env,
            context=b"kv-offload-redis-tier:" + namespace.encode(),
        )
        return cls(
            tier=tier,
            safe_url=safe,
            host=parts.hostname,
            port=port,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            use_tls=use_tls,
            cluster=cluster,
            startup_nodes=tuple(nodes),
            namespace=namespace,
            ttl_s=ttl_s,
            batch_blocks=batch_blocks,
            connect_timeout_s=float(connect_timeout_s),
            timeout_s=float(timeout_s),
            max_in_flight=max_in_flight,
            io_threads=io_threads,
            retry_after_s=float(retry_after_s),
            max_retry_after_s=float(max_retry_after_s),
            lookup_cache=lookup_cache,
            tls_ca_file=tls_ca_file,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            password=password,
            auth=auth,
        )

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of redis-py clients (standalone pool or cluster) for these
        settings; the secret travels only here."""
        kwargs: dict[str, Any] = {
            "password": self.password,
            "username": self.username,
            "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
        }
        if self.use_tls:
            kwargs["ssl_ca_certs"] = self.tls_ca_file
            kwargs["ssl_certfile"] = self.tls_cert_file
            kwargs["ssl_keyfile"] = self.tls_key_file
        return kwargs
