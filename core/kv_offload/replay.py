"""Replaying a request trace through a manager: the request flow of a serving engine.

Per request: ``lookup`` in prefix order until the first non-HIT (a ``PENDING`` block, such as a
promotion from a secondary tier, is waited for by stepping the engine with
``on_schedule_end()`` until it resolves: a tiered manager bounds that wait), ``prepare_load`` /
``complete_load`` of the hits, ``touch``,
``prepare_store`` / ``complete_store`` of the rest, ``on_request_finished``.

With ``data_plane=True`` real bytes move too: each stored block's row of the CPU KV buffer is
filled with bytes derived from its key, and every loaded block is read back and compared, so a
replay through secondary tiers proves that no byte was lost or corrupted on the way.
The loop is tight on purpose: benchmarks time it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .buffer import CPUKVBuffer
from .errors import ConfigError, KVOffloadError
from .keys import OffloadKey
from .types import CPULoadStoreSpec, LookupResult, PrepareStoreOutput, ReqContext

__all__ = ["ReplayResult", "block_bytes", "drain_for_report", "replay"]

#: Scheduler steps a replay takes back to back for a PENDING block before it starts sleeping
#: between steps (a synchronous tier's promotion lands within a step or two).
FAST_PENDING_STEPS = 64
#: Longest sleep between two steps while a block is PENDING (the wait doubles up to it).
MAX_PENDING_SLEEP_S = 0.005
#: A safety net only: a tiered manager resolves every PENDING answer within its
#: ``promotion_timeout_s`` (docs/architecture.md); past this the block counts as a miss.
MAX_PENDING_WAIT_S = 120.0


class Manager(Protocol):
    """What a replay needs: the request flow of docs/architecture.md."""

    @property
    def kv_buffer(self) -> CPUKVBuffer | None: ...

    def on_new_request(self, req_context: ReqContext) -> object: ...
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult: ...
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec: ...
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None: ...
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None: ...
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None: ...
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None: ...
    def on_request_finished(self, req_context: ReqContext) -> None: ...
    def on_schedule_end(self) -> None: ...


@dataclass(frozen=True)
class ReplayResult:
    """What a replay measured: prefix-hit blocks over all blocks, and how fast."""

    requests: int
    blocks: int
    hit_blocks: int
    promoted_hit_blocks: int
    stored_blocks: int
    rejected_stores: int
    verified_blocks: int
    corrupted_blocks: int
    seconds: float
    #: Per rejected store, the blocks it asked for (the request's blocks after its hits):
    #: more than the CPU tier holds can never fit; fewer were refused for pinned blocks.
    rejected_store_sizes: tuple[int, ...] = ()

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def blocks_per_second(self) -> float:
        return self.blocks / self.seconds if self.seconds else 0.0


def block_bytes(keys: list[OffloadKey], size: int) -> npt.NDArray[np.uint8]:
    """Deterministic contents for blocks: each row repeats a digest of its key.

    Written in one pass (a broadcast into the rows): at MiB-sized blocks this pattern is most
    of a replay's own work, and ``np.tile`` would write it twice."""
    digests = b"".join(hashlib.blake2b(key, digest_size=16).digest() for key in keys)
    table = np.frombuffer(digests, np.uint8).reshape(len(keys), 16)
    whole, rest = divmod(size, 16)
    out = np.empty((len(keys), size), np.uint8)
    out[:, : whole * 16].reshape(len(keys), whole, 16)[:] = table[:, None, :]
    out[:, whole * 16 :] = table[:, :rest]
    return out


def _wait_pending(manager: Manager, key: OffloadKey, ctx: ReqContext) -> LookupResult:
    """Step the engine until ``key``'s lookup is no longer ``PENDING``: back to back at first,
    then sleeping (doubling up to :data:`MAX_PENDING_SLEEP_S`) so a disk or network tier's
    promotion has the time it takes; bounded by :data:`MAX_PENDING_WAIT_S`."""
    pending = LookupResult.PENDING
    result = pending
    for _ in range(FAST_PENDING_STEPS):
        manager.on_schedule_end()
        result = manager.lookup(key, ctx)
        if result is not pending:
            return result
    deadline = time.monotonic() + MAX_PENDING_WAIT_S
    delay = 0.0001
    while time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, MAX_PENDING_SLEEP_S)
        manager.on_schedule_end()
        result = manager.lookup(key, ctx)
        if result is not pending:
            return result
    return LookupResult.MISS


def replay(
    manager: Manager,
    requests: Iterable[tuple[ReqContext, list[OffloadKey]]],
    *,
    data_plane: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run every request through ``manager``; see the module docstring for the flow."""
    buffer = manager.kv_buffer if data_plane else None
    if data_plane and buffer is None:
        raise ConfigError("data_plane replay needs a manager with a KV buffer (block_size_bytes)")
    size = buffer.block_size_bytes if buffer is not None else 0
    hit_total = promoted = blocks = stored = count = verified = corrupted = 0
    rejected: list[int] = []
    HIT = LookupResult.HIT
    PENDING = LookupResult.PENDING
    lookup = manager.lookup
    start = time.perf_counter()
    for ctx, keys in requests:
        manager.on_new_request(ctx)
        hits = 0
        for key in keys:
            result = lookup(key, ctx)
            if result is PENDING:
                result = _wait_pending(manager, key, ctx)
                if result is HIT:
                    promoted += 1
            if result is not HIT:
                break
            hits += 1
        if hits:
            hit_keys = keys[:hits]
            spec = manager.prepare_load(hit_keys, ctx)
            if buffer is not None:
                got = buffer.read_blocks(spec.block_ids)
                bad = int(np.count_nonzero((got != block_bytes(hit_keys, size)).any(axis=1)))
                corrupted += bad
                verified += hits
            manager.complete_load(hit_keys, ctx)
            manager.touch(hit_keys, ctx)
        if hits < len(keys):
            out = manager.prepare_store(keys[hits:], ctx)
            if out is None:
                rejected.append(len(keys) - hits)
            elif out.keys_to_store:
                if buffer is not None:
                    buffer.write_blocks(
                        out.store_spec.block_ids, block_bytes(out.keys_to_store, size)
                    )
                manager.complete_store(out.keys_to_store, ctx)
                stored += len(out.keys_to_store)
        manager.on_request_finished(ctx)
        manager.on_schedule_end()  # one request per scheduler step
        hit_total += hits
        blocks += len(keys)
        count += 1
        if progress is not None:
            progress(len(keys))
    return ReplayResult(
        count,
        blocks,
        hit_total,
        promoted,
        stored,
        len(rejected),
        verified,
        corrupted,
        time.perf_counter() - start,
        tuple(rejected),
    )


def drain_for_report(manager: object) -> str | None:
    """Wait for a tiered stack's tier jobs before its figures are read. A tier that never
    reported its jobs makes the report incomplete (the returned reason) rather than failing
    it: the measurements stand. Any other drain error is raised."""
    drain = getattr(manager, "drain", None)
    if drain is None:  # a CPU-only stack has no jobs
        return None
    try:
        drain()
    except KVOffloadError as exc:
        if not manager.has_pending_work():  # type: ignore[attr-defined]
            raise
        return str(exc)
    return None
