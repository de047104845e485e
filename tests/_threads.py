"""What the thread tests of both managers share (tests/cpu/test_cpu_threads.py,
tests/tiering/test_tiering_threads.py): retrying calls refused as concurrent, and running
driver threads against one manager."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from kv_offload import ConcurrentUseError, OffloadingManager

T = TypeVar("T")
TallyT = TypeVar("TallyT")


class Refusals(Protocol):
    """A driver's tally: how many of its calls were refused (and retried)."""

    refused: int


def retry(tally: Refusals, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` until it is not refused as concurrent (a refusal changed nothing)."""
    while True:
        try:
            return call(*args, **kwargs)
        except ConcurrentUseError as exc:
            assert not exc.reentrant
            tally.refused += 1


def run_threads(
    drive: Callable[[OffloadingManager, str, int, TallyT, int], None],
    manager: OffloadingManager,
    tallies: list[TallyT],
    requests: int,
    disjoint: bool,
    timeout: float,
) -> list[TallyT]:
    """One thread per tally, each running ``drive`` for ``requests`` requests; with
    ``disjoint`` thread ``n`` uses keys from ``100 * n`` (else all share the same keys)."""
    workers = [
        threading.Thread(
            target=drive,
            args=(manager, f"t{n}", requests, tally, 100 * n if disjoint else 0),
        )
        for n, tally in enumerate(tallies)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=timeout)
        assert not worker.is_alive()
    return tallies
