"""The tier's I/O threads: one FIFO queue per thread, a key always on the same thread.

Routing every operation on a key (store, load, delete) to one thread keeps them in the order
the scheduler issued them without any lock: an evicted block's delete runs before a later
store of the same key, so the delete can never remove the new file. A job's keys spread over
the threads, so one large job still uses all of them.

A task is a plain callable; its result goes to the shared ``done`` queue. A task that raises
still produces a result (``on_error``), so every job reports, whatever a worker does.

``idle`` (optional) is background work a thread does when its queue is empty, one small step
per call, checking the queue again after each (a task waits at most one step): it returns
``True`` while there is more to do. The fs tier creates empty files there ahead of stores.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Lanes"]

logger = logging.getLogger("kv_offload.fs_tier")

Task = Callable[[], Any]
ErrorResult = Callable[[BaseException], Any]
Idle = Callable[[], bool]


class Lanes:
    """``count`` daemon threads, each draining its own queue into ``done``."""

    def __init__(self, count: int, name: str, idle: Idle | None = None) -> None:
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = idle
        self._queues: list[queue.SimpleQueue[tuple[Task, ErrorResult] | None]] = []
        self._threads: list[threading.Thread] = []
        for index in range(count):
            q: queue.SimpleQueue[tuple[Task, ErrorResult] | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._run, args=(q,), name=f"kv-offload-{name}-io-{index}", daemon=True
            )
            self._queues.append(q)
            self._threads.append(thread)
            thread.start()

    def __len__(self) -> int:
        return len(self._queues)

    def submit(self, lane: int, task: Task, on_error: ErrorResult) -> None:
        self._queues[lane].put((task, on_error))

    def _run(self, tasks: queue.SimpleQueue[tuple[Task, ErrorResult] | None]) -> None:
        done = self.done
        idle = self._idle
        while True:
            try:
                item = tasks.get_nowait()
            except queue.Empty:
                if idle is not None:
                    try:
                        if idle():
                            continue
                    except BaseException:  # background work only: stop doing it, keep serving
                        logger.exception("fs tier I/O thread: idle work raised; stopped")
                        idle = None
                item = tasks.get()
            if item is None:
                return
            task, on_error = item
            try:
                result = task()
            except BaseException as exc:  # report, whatever it was, and keep serving
                try:
                    result = on_error(exc)
                except BaseException:  # pragma: no cover - on_error only builds a record
                    logger.exception("fs tier I/O thread: error handler raised")
                    continue
            done.put(result)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued tasks, then stop the threads."""
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout)
        self._queues = []
        self._threads = []
