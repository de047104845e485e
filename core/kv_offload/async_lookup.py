"""Batched, asynchronous existence checks for tiers that cannot answer ``lookup`` from memory.

A remote or disk tier (Redis, a shared filesystem) does not know whether it holds a block
without asking its store, and the scheduler must not wait for that answer. :class:`AsyncLookup`
turns the question into one batch per scheduler step:

1. ``lookup(key, ctx)`` answers from the result cache when it can; otherwise it registers the
   key for this step and answers ``None`` ("ask again"), which the tiered manager reports as
   ``PENDING``;
2. ``flush()`` (call it from the tier's ``on_schedule_end``) hands every key registered since
   the last flush to the helper's one background thread as **one** batch;
3. the thread calls the tier's ``resolve(keys) -> [bool, ...]`` (one pipelined round trip, one
   directory scan, ...) and stores the answers; the next ``lookup`` of those keys answers
   ``True`` or ``False``.

Results are cached in a bounded LRU (``max_results``) and dropped when no running request
asked for them any more (:meth:`AsyncLookup.release`, from the tier's ``on_request_finished``),
so a block another engine stores later is seen by the next request. A resolver that raises or
returns the wrong number of answers never reaches the scheduler: the batch's keys answer
``False`` (the engine recomputes instead of waiting), the error is logged, counted in
:attr:`AsyncLookup.stats` and passed to ``on_error``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .keys import OffloadKey
from .types import ReqContext

__all__ = ["AsyncLookup", "AsyncLookupStats"]

logger = logging.getLogger("kv_offload.async_lookup")

Resolver = Callable[[list[OffloadKey]], Iterable[bool]]
ErrorCallback = Callable[[BaseException, list[OffloadKey]], None]


@dataclass
class AsyncLookupStats:
    """Cumulative counters of one :class:`AsyncLookup`."""

    lookups: int = 0
    #: lookups answered ``None`` (the key was registered or already being resolved)
    asked_again: int = 0
    batches: int = 0
    resolved_keys: int = 0
    #: batches whose resolver raised or answered the wrong number of keys
    errors: int = 0
    #: cached results dropped because the cache was full
    dropped: int = 0


class AsyncLookup:
    """One background thread resolving a tier's lookups in one batch per scheduler step.

    ``resolve`` runs on the helper's thread only, never on the scheduler's; it receives the
    keys of one step (no duplicates) and returns one ``bool`` per key, in order.
    """

    def __init__(
        self,
        resolve: Resolver,
        *,
        name: str = "tier",
        max_results: int = 100_000,
        on_error: ErrorCallback | None = None,
    ) -> None:
        if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
            raise ConfigError(
                f"AsyncLookup ({name}): max_results must be a positive int, got {max_results!r}"
            )
        self.name = name
        self.max_results = max_results
        self.stats = AsyncLookupStats()
        #: the last error a resolver raised (``None`` once a batch succeeds again)
        self.last_error: BaseException | None = None
        self._resolve = resolve
        self._on_error = on_error
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._batch: dict[OffloadKey, None] = {}  # registered this step, in order
        self._in_flight: set[OffloadKey] = set()  # handed to the thread, not answered yet
        self._batches_in_flight = 0
        self._results: OrderedDict[OffloadKey, bool] = OrderedDict()
        self._asked: dict[str, set[OffloadKey]] = {}  # req_id -> keys it asked about
        self._askers: dict[OffloadKey, int] = {}  # key -> running requests that asked
        self._queue: queue.SimpleQueue[list[OffloadKey] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"kv-offload-lookup-{name}", daemon=True
        )
        self._thread.start()

    # -- the scheduler side ---------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """``True``/``False`` once resolved; ``None`` while the answer is not in yet."""
        with self._lock:
            self.stats.lookups += 1
            if self._closed:
                return False
            asked = self._asked.setdefault(req_context.req_id, set())
            if key not in asked:
                asked.add(key)
                self._askers[key] = self._askers.get(key, 0) + 1
            result = self._results.get(key)
            if result is not None:
                self._results.move_to_end(key)
                return result
            self.stats.asked_again += 1
            if key not in self._in_flight:
                self._batch[key] = None
            return None

    def flush(self) -> None:
        """Send the keys registered since the last flush to the thread as one batch."""
        with self._lock:
            if not self._batch or self._closed:
                return
            keys = list(self._batch)
            self._batch.clear()
            self._in_flight.update(keys)
            self._batches_in_flight += 1
        self._queue.put(keys)

    def record(self, key: OffloadKey, present: bool) -> None:
        """The tier knows the answer itself (it just stored the block): cache it, and let it
        win over a check of the key still in flight."""
        with self._lock:
            self._in_flight.discard(key)
            self._batch.pop(key, None)
            self._put(key, present)

    def forget(self, key: OffloadKey) -> None:
        """Drop what is known of ``key`` (a load found it missing or corrupt): the next
        lookup asks the store again."""
        with self._lock:
            self._in_flight.discard(key)
            self._results.pop(key, None)

    def release(self, req_id: str) -> None:
        """A request finished: drop the results no other running request asked for."""
        with self._lock:
            for key in self._asked.pop(req_id, ()):
                left = self._askers.get(key, 0) - 1
                if left > 0:
                    self._askers[key] = left
                    continue
                self._askers.pop(key, None)
                self._results.pop(key, None)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no flushed batch is being resolved; ``False`` on timeout. For tests,
        benchmarks and shutdown paths, never the scheduler."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._batches_in_flight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def __len__(self) -> int:
        """How many results are cached."""
        return len(self._results)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the thread (after the batch it is resolving); later lookups answer ``False``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)

    # -- the thread -----------------------------------------------------------------------

    def _put(self, key: OffloadKey, present: bool) -> None:
        self._results[key] = present
        self._results.move_to_end(key)
        while len(self._results) > self.max_results:
            self._results.popitem(last=False)
            self.stats.dropped += 1

    def _run(self) -> None:
        while True:
            keys = self._queue.get()
            if keys is None:
                return
            answers = self._answer(keys)
            with self._idle:
                self.stats.batches += 1
                self.stats.resolved_keys += len(keys)
                for key, present in zip(keys, answers):
                    if key in self._in_flight:  # not overtaken by record() / forget()
                        self._in_flight.discard(key)
                        self._put(key, present)
                self._batches_in_flight -= 1
                self._idle.notify_all()

    def _answer(self, keys: list[OffloadKey]) -> Sequence[bool]:
        """The resolver's answers, or all ``False`` (reported) when it fails."""
        try:
            answers = [bool(a) for a in self._resolve(keys)]
            if len(answers) != len(keys):
                raise ValueError(f"resolver answered {len(answers)} keys of {len(keys)} asked")
        except Exception as exc:
            with self._lock:
                self.stats.errors += 1
                first = self.last_error is None
                self.last_error = exc
            log = logger.warning if first else logger.debug
            log(
                "%s: existence check of %d key(s) failed (%s: %s); they count as misses",
                self.name,
                len(keys),
                type(exc).__name__,
                exc,
            )
            if self._on_error is not None:
                try:
                    self._on_error(exc, keys)
                except Exception:
                    logger.exception("%s: the async lookup's on_error callback raised", self.name)
            return [False] * len(keys)
        if self.last_error is not None:
            with self._lock:
                self.last_error = None
        return answers
