"""Fixtures of the Redis tier tests: real servers on loopback ports, stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _redis_servers import PASSWORD, PASSWORD_ENV, RedisServer, start_cluster


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One password-protected server shared by the tests that do not kill it."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), password=PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, for tests that kill it."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[RedisServer]]:
    """Three Cluster masters on loopback ports (no replicas)."""
    nodes = start_cluster(tmp_path / "cluster")
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[list[RedisServer]]:
    """Three Cluster masters with a replica each (six servers on loopback ports)."""
    nodes = start_cluster(tmp_path / "cluster", replicas=1)
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture(autouse=True)
def password_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return PASSWORD_ENV
