"""What a Redis tier counts: :class:`RedisTierStats`, kept behind a lock by :class:`Counters`
(the I/O threads count, ``get_stats`` reads)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Counters", "RedisTierStats"]


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
