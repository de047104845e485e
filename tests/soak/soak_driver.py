"""The engine side of the soak: a seeded stream of requests with shared prefixes, run through a
tiered stack as a serving engine runs them, every loaded byte checked.

Requests draw one of ``prefixes`` prefix chains (Zipf-like popularity) and a private tail, so
the hit ratio of a fault-free run is stationary: after a fault clears, the soak can tell when
the stack is back to it. Block bytes derive from the key and the run's salt (blake2b), so a
byte read back is checked against what the soak wrote, never against a tier's own checksum.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from kv_offload import (
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
    make_offload_key,
)
from kv_offload.errors import HookError

HIT, PENDING = LookupResult.HIT, LookupResult.PENDING


def block_bytes(keys: list[OffloadKey], size: int, salt: bytes) -> npt.NDArray[np.uint8]:
    """What the soak writes for ``keys``: each row repeats a keyed digest of its key."""
    digests = b"".join(hashlib.blake2b(k, digest_size=32, key=salt).digest() for k in keys)
    table = np.frombuffer(digests, np.uint8).reshape(len(keys), 32)
    return np.tile(table, (1, -(-size // 32)))[:, :size]


@dataclass
class Workload:
    """The seeded request stream: ``prefixes`` popular chains of ``prefix_blocks`` blocks."""

    seed: int
    prefixes: int = 400
    prefix_blocks: int = 12
    tail_blocks: int = 4
    _rng: random.Random = field(init=False)
    _weights: list[float] = field(init=False)
    _next_tail: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._weights = [1.0 / (rank + 1) ** 0.9 for rank in range(self.prefixes)]

    def next_request(self) -> list[OffloadKey]:
        rng = self._rng
        (prefix,) = rng.choices(range(self.prefixes), self._weights)
        depth = rng.randint(self.prefix_blocks // 2, self.prefix_blocks)
        keys = [make_offload_key((prefix << 20) | i) for i in range(depth)]
        for _ in range(rng.randint(1, self.tail_blocks)):
            self._next_tail += 1
            keys.append(make_offload_key((1 << 60) | self._next_tail))
        return keys


@dataclass
class StepFigures:
    """What one request did."""

    blocks: int = 0
    hits: int = 0
    verified: int = 0
    wrong: int = 0
    stored: int = 0
    pending_steps: int = 0
    pending_seconds: float = 0.0
    hook_errors: int = 0


class Engine:
    """Drives ``manager`` one request at a time, as a scheduler would, checking every byte."""

    def __init__(self, manager: TieringOffloadingManager, salt: bytes) -> None:
        self.manager = manager
        self.salt = salt
        self.size = manager.kv_buffer.block_size_bytes
        self._count = 0

    def _call(self, figures: StepFigures, fn: Callable[..., object], *args: object) -> object:
        """A manager call; a hook plugin's error (the call's effect stands) is counted."""
        try:
            return fn(*args)
        except HookError as exc:
            figures.hook_errors += 1
            return exc.result

    def request(self, keys: list[OffloadKey], pending_limit_s: float) -> StepFigures:
        m = self.manager
        figures = StepFigures(blocks=len(keys))
        self._count += 1
        ctx = ReqContext(req_id=f"soak-{self._count}")
        self._call(figures, m.on_new_request, ctx)
        hits = 0
        for key in keys:
            started = time.monotonic()
            result = m.lookup(key, ctx)
            while result is PENDING:
                figures.pending_steps += 1
                waited = time.monotonic() - started
                if waited > pending_limit_s:
                    raise AssertionError(
                        f"lookup PENDING for {waited:.1f} s, past the bound {pending_limit_s} s"
                    )
                self._call(figures, m.on_schedule_end)
                time.sleep(0.0005)
                result = m.lookup(key, ctx)
            figures.pending_seconds = max(figures.pending_seconds, time.monotonic() - started)
            if result is not HIT:
                break
            hits += 1
        if hits:
            found = keys[:hits]
            spec = m.prepare_load(found, ctx)
            rows = m.kv_buffer.read_blocks(spec.block_ids)
            expected = block_bytes(found, self.size, self.salt)
            figures.wrong += int(np.count_nonzero((rows != expected).any(axis=1)))
            figures.verified += hits
            m.complete_load(found, ctx)
            self._call(figures, m.touch, found, ctx)
        if hits < len(keys):
            out = self._call(figures, m.prepare_store, keys[hits:], ctx)
            if out is not None and out.keys_to_store:  # type: ignore[attr-defined]
                store = out.keys_to_store  # type: ignore[attr-defined]
                m.kv_buffer.write_blocks(
                    out.store_spec.block_ids,  # type: ignore[attr-defined]
                    block_bytes(store, self.size, self.salt),
                )
                self._call(figures, m.complete_store, store, ctx)
                figures.stored += len(store)
        self._call(figures, m.on_request_finished, ctx)
        self._call(figures, m.on_schedule_end)
        figures.hits = hits
        return figures
