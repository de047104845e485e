"""Real ``redis-server`` processes on loopback ports, for the Redis tier tests.

:class:`RedisServer` runs one server from a throwaway config in a temporary directory (no
persistence, nothing shared with a system Redis), can be killed with ``SIGKILL`` and restarted
on the same port. :func:`start_cluster` starts three of them with ``cluster-enabled`` and joins
them with ``redis-cli --cluster create``. When ``CI`` is set a missing ``redis-server`` fails
the run; elsewhere the tests skip, saying how to install it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

__all__ = ["PASSWORD", "PASSWORD_ENV", "RedisServer", "free_port", "need", "start_cluster"]

#: The test servers' password, and the variable the stacks read it from (``password_env``).
PASSWORD = "s3cret-for-tests-only"
PASSWORD_ENV = "KVO_TEST_REDIS_PASSWORD"

INSTALL_HINT = (
    "install it to run the Redis tier tests: `apt-get install -y redis-server` "
    "(Debian/Ubuntu), `brew install redis`, or put a Valkey/Redis build on PATH"
)


def need(program: str) -> str:
    """The path of ``program``: fail under CI, skip elsewhere, when it is missing."""
    path = shutil.which(program)
    if path is None:
        message = f"{program} not found on PATH; {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {message}", pytrace=False)
        pytest.skip(message)
    return path


def _die_with_parent() -> None:
    """Linux: the server gets SIGKILL when the test process dies, even if that process is
    killed itself (no stray servers on a shared machine). Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port (and, for Cluster nodes, its bus port ``port + 10000``)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not with_bus:
            return port
        if port + 10000 < 65536 and _port_free(port + 10000):
            return port
    raise RuntimeError("no free loopback port pair found")


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 with a throwaway config and directory."""

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        extra: Sequence[str] = (),
        tls: dict[str, str] | None = None,
        cluster: bool = False,
    ) -> None:
        self.binary = need("redis-server")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port(with_bus=cluster)
        self.password = password
        self.tls = tls
        lines = [
            "bind 127.0.0.1",
            f"dir {directory}",
            f"logfile {directory / 'redis.log'}",
            'save ""',
            "appendonly no",
            "maxmemory 256mb",
            "maxmemory-policy allkeys-lru",
            "protected-mode no",
        ]
        if tls is None:
            lines.append(f"port {self.port}")
        else:
            lines += [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {tls['cert']}",
                f"tls-key-file {tls['key']}",
                f"tls-ca-cert-file {tls['ca']}",
                "tls-auth-clients no",
            ]
        if password is not None:
            lines.append(f"requirepass {password}")
            lines.append(f"masterauth {password}")  # a Cluster replica logs in to its master
        if cluster:
            lines += [
                "cluster-enabled yes",
                f"cluster-config-file {directory / 'nodes.conf'}",
                "cluster-node-timeout 1000",
                "cluster-require-full-coverage no",
                "repl-diskless-sync-delay 0",  # replicas in sync at once: failover-ready
            ]
        lines += list(extra)
        self.config = directory / "redis.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, *, password: bool = False) -> str:
        scheme = "redis" if self.tls is None else "rediss"
        auth = f":{self.password}@" if password and self.password else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        kwargs: dict[str, object] = {"password": self.password, "socket_timeout": 5}
        if self.tls is not None:
            kwargs.update(ssl=True, ssl_ca_certs=self.tls["ca"])
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [self.binary, str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                if self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited at startup:\n{log}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {self.address} did not answer")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """``SIGKILL``: the server dies without closing anything cleanly."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_cluster(
    directory: Path, masters: int = 3, replicas: int = 0, extra: Sequence[str] = ()
) -> list[RedisServer]:
    """``masters`` Cluster masters on loopback ports, joined and covering every slot, each
    with ``replicas`` replicas (``redis-cli --cluster create`` picks which node is which:
    ask ``CLUSTER NODES`` or :func:`masters_of`); ``extra`` config lines on every node
    (ACL users, ...)."""
    cli = need("redis-cli")
    count = masters * (1 + replicas)
    nodes = [RedisServer(directory / f"node{i}", cluster=True, extra=extra) for i in range(count)]
    try:
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(n.address for n in nodes),
                "--cluster-yes",
                "--cluster-replicas",
                str(replicas),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 20
        for node in nodes:
            client = node.client()
            while client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Cluster node {node.address} never reached state ok")
                time.sleep(0.05)
            # A replica that never synchronised cannot take over: wait for every link.
            while (info := client.info("replication"))["role"] == "slave" and info.get(
                "master_link_status"
            ) != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Cluster replica {node.address} never synchronised")
                time.sleep(0.05)
            client.close()
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def slot_owners(node: RedisServer) -> dict[int, str]:
    """Which master (``host:port``) owns each hash slot, as ``node`` sees the Cluster."""
    client = node.client()
    try:
        owner: dict[int, str] = {}
        for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
            address = f"{master[0].decode()}:{master[1]}"
            owner.update((slot, address) for slot in range(start, end + 1))
        return owner
    finally:
        client.close()


def make_tls_files(directory: Path) -> dict[str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not found: cannot make a throwaway certificate for the TLS test")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        directory / name for name in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt")
    )
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kvo-test-ca",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
        "-out", str(csr))  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return {"ca": str(ca), "cert": str(cert), "key": str(key)}
