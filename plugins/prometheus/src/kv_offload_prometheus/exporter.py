"""The hook plugin: which managers to watch, what only the hooks tell, and the HTTP server.

Counters and gauges come from each watched manager's ``get_stats()`` at scrape time (see
:mod:`.metrics`); the hooks add what the stats lack: requests started and finished, tier jobs
by outcome, and their latency. The request hooks run on the scheduler's path, so they do one
dict lookup and one increment.

A manager is watched from the first hook it fires. A ``TieringOffloadingManager``'s CPU tier
fires the CPU events itself; when the tiered manager fires its first tier event, it takes over
its CPU tier's ``manager`` label (its ``get_stats()`` includes the CPU tier's), so a stack is
one label value. Labels are ``"0"``, ``"1"``, ...: the lowest value free, at most
``max_managers`` at once; a manager beyond that is not exported (logged once). A manager's
series leave the registry when it shuts down (its counters are reset then anyway) or is
garbage-collected; the HTTP server stops when the last watched manager shuts down.

Scrapes run on the server's thread while the manager runs on its own: ``get_stats()`` only
reads counters, and the hook counts are copied with single C-level dict copies, so a scrape
never sees a half-built dict; fields of one snapshot may be one operation apart.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kv_offload import ConfigError
from kv_offload.plugins import hookimpl
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .latency import Latency, latency_family
from .metrics import Families
from .settings import Settings

__all__ = ["PrometheusExporter"]

logger = logging.getLogger("kv_offload.prometheus")

#: get_stats() retries when a tiered manager's promotion queue changed size mid-read.
_STATS_ATTEMPTS = 5


@dataclass(eq=False)
class _Watched:
    """One exported manager (a stack: a tiered manager and its CPU tier share one)."""

    label: str | None  # None: over max_managers, counted but not exported
    sources: list[weakref.ref[Any]]  # managers whose get_stats() speaks for it, newest last
    ids: list[int] = field(default_factory=list)
    requests_started: int = 0
    requests_finished: int = 0
    jobs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    latency: dict[tuple[str, str], Latency] = field(default_factory=dict)

    def manager(self) -> Any:
        for ref in reversed(self.sources):
            manager = ref()
            if manager is not None:
                return manager
        return None


def _stats(manager: Any) -> Any:
    """The manager's kv-offload stats, or ``None`` for a hook source that has none: inside
    vLLM the kv-offload-vllm bridge fires hooks with its adapters as ``manager``, vLLM
    objects whose ``get_stats`` (if any) is vLLM's, not kv-offload's; only their hook
    counts are exported."""
    get_stats = getattr(manager, "get_stats", None)
    if get_stats is None:
        return None
    for attempt in range(_STATS_ATTEMPTS):
        try:
            stats = get_stats()
            return stats if hasattr(stats, "cpu") or hasattr(stats, "hits") else None
        except RuntimeError:  # "dictionary changed size during iteration": read again
            if attempt == _STATS_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


class _Collector(Collector):
    """Yields every family of an exporter; registered in its registry (and elsewhere)."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter

    def describe(self) -> Iterator[Metric]:
        # Names only: registering must not read a manager.
        prefix = self._exporter.settings.prefix
        yield from Families(prefix).all()
        yield latency_family(prefix)

    def collect(self) -> Iterator[Metric]:
        exporter = self._exporter
        families = Families(exporter.settings.prefix)
        latency = latency_family(exporter.settings.prefix)
        for record in exporter._exported():
            manager = record.manager()
            if manager is None or record.label is None:
                continue
            stats = _stats(manager)
            if stats is not None:
                families.add_stats(record.label, stats)
            families.add_hook_counts(
                record.label, record.requests_started, record.requests_finished, dict(record.jobs)
            )
            for (tier, direction), observed in sorted(dict(record.latency).items()):
                buckets, total = observed.samples()
                latency.add_metric([record.label, tier, direction], buckets, total)
        yield from families.all()
        yield latency


class PrometheusExporter:
    """The ``prometheus`` hook plugin: metrics of the managers it watches, in
    :attr:`registry`, served on ``settings.port`` if set.

    Expose :attr:`registry` yourself (``prometheus_client.generate_latest(registry)``,
    ``make_wsgi_app(registry)``), or mount :attr:`collector` on another registry, or set
    ``global_registry`` to add it to ``prometheus_client.REGISTRY``.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings = settings if settings is not None else Settings()
        self._lock = threading.RLock()  # weakref callbacks may run inside a locked section
        self._records: dict[int, _Watched] = {}
        self._warned_full = False
        self._server: Any = None
        self._thread: threading.Thread | None = None
        #: The port the server listens on (the real one when ``port = 0``), else ``None``.
        self.port: int | None = None
        self.collector = _Collector(self)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self.collector)
        self._in_global = False
        if settings.global_registry:
            try:
                REGISTRY.register(self.collector)
            except ValueError as exc:
                raise ConfigError(
                    f"global_registry: prometheus_client.REGISTRY already has metrics of these "
                    f"names ({exc}); another exporter with prefix {settings.prefix!r} is "
                    "registered there: give this one another prefix, or share one plugin "
                    "manager between the managers (they get distinct manager labels)"
                ) from None
            self._in_global = True
        if settings.port is not None:
            try:
                self._serve(settings.port, settings.addr)
            except BaseException:
                self.close()
                raise

    # -- the HTTP server ------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """``http://addr:port/metrics`` while the server runs, else ``None``."""
        if self.port is None:
            return None
        host = f"[{self.settings.addr}]" if ":" in self.settings.addr else self.settings.addr
        return f"http://{host}:{self.port}/metrics"

    def _serve(self, port: int, addr: str) -> None:
        try:
            self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        except socket.gaierror as exc:
            raise ConfigError(
                f"addr {addr!r} does not resolve to an address of this machine: {exc.strerror}"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} is in use on {addr}: pick a free port (or 0 for any free "
                    "one), or stop what listens there"
                ) from None
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise ConfigError(
                    f"addr {addr!r} is not an address of this machine: {exc.strerror}"
                ) from None
            if exc.errno == errno.EACCES:
                raise ConfigError(
                    f"port {port} needs privileges to listen on: use a port above 1023"
                ) from None
            raise ConfigError(
                f"port {port} on {addr}: cannot listen: {exc.strerror or exc}"
            ) from None
        self.port = int(self._server.server_port)
        logger.info("serving metrics at %s", self.url)

    def close(self) -> None:
        """Stop the HTTP server and leave ``prometheus_client.REGISTRY``; the registry keeps
        working for a program that exposes it itself. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self.port = None
        if self._in_global:
            self._in_global = False
            REGISTRY.unregister(self.collector)

    # -- watched managers -----------------------------------------------------------------

    def _exported(self) -> list[_Watched]:
        with self._lock:
            unique = {id(r): r for r in self._records.values() if r.label is not None}
        return sorted(unique.values(), key=lambda r: int(r.label or 0))

    def _watch(self, manager: Any) -> _Watched:
        with self._lock:
            record = self._records.get(id(manager))
            if record is not None:
                return record
            primary = getattr(manager, "primary", None)  # a tiered manager's CPU tier
            record = self._records.get(id(primary)) if primary is not None else None
            ref = weakref.ref(manager, functools.partial(self._collected, id(manager)))
            if record is not None:
                record.sources.append(ref)
            else:
                record = _Watched(self._free_label(), [ref])
            record.ids.append(id(manager))
            self._records[id(manager)] = record
            return record

    def _free_label(self) -> str | None:
        taken = {r.label for r in self._records.values()}
        for index in range(self.settings.max_managers):
            if str(index) not in taken:
                return str(index)
        if not self._warned_full:
            self._warned_full = True
            logger.warning(
                "more than max_managers=%d managers at once: the newest are not exported; "
                "raise [hooks.prometheus] max_managers",
                self.settings.max_managers,
            )
        return None

    def _collected(self, key: int, _ref: weakref.ref[Any]) -> None:
        self._forget(key)

    def _forget(self, key: int) -> None:
        """Drop a manager; the last one of a record takes its series out of the registry."""
        with self._lock:
            record = self._records.pop(key, None)
            if record is None:
                return
            record.ids.remove(key)
            if not record.ids:
                record.label = None  # out of the next scrape

    # -- hooks ----------------------------------------------------------------------------

    @hookimpl
    def kv_offload_request_started(self, manager: Any) -> None:
        record = self._records.get(id(manager))
        if record is None:
            record = self._watch(manager)
        record.requests_started += 1

    @hookimpl
    def kv_offload_request_finished(self, manager: Any) -> None:
        record = self._records.get(id(manager))
        if record is None:
            record = self._watch(manager)
        record.requests_finished += 1

    @hookimpl
    def kv_offload_tier_job_finished(
        self, manager: Any, tier: str, direction: str, success: bool, seconds: float
    ) -> None:
        record = self._records.get(id(manager))
        if record is None:
            record = self._watch(manager)
        jobs = record.jobs
        key = (tier, direction, "success" if success else "failure")
        jobs[key] = jobs.get(key, 0) + 1
        latency = record.latency.get((tier, direction))
        if latency is None:
            latency = record.latency[(tier, direction)] = Latency(self.settings.buckets)
        latency.observe(seconds)

    @hookimpl
    def kv_offload_shutdown(self, manager: Any) -> None:
        with self._lock:
            record = self._records.get(id(manager))
            for key in list(record.ids) if record is not None else ():
                self._forget(key)
            last = not self._records
        if last and self._server is not None:
            self.close()
