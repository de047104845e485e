"""Reading Mooncake-format request traces (one JSON object per line with ``hash_ids``).

Mooncake hashes a prompt in blocks of :data:`MOONCAKE_BLOCK_TOKENS` tokens and lists the last,
partial block too. A serving engine never offloads a partial block (its KV is not final), so
a faithful replay gives :func:`read_trace` the block size in tokens and gets only the full
blocks of each request (``input_length // block_tokens`` of them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, InvalidKeyError
from .keys import OffloadKey, make_offload_key

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TraceRequest",
    "TraceError",
    "arrival_seconds",
    "read_trace",
]

#: Tokens per ``hash_ids`` block in the Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ConfigError):
    """A trace file is missing or a line is malformed; the message names file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: its prefix block keys in order, and when it arrived (ms).

    ``partial_blocks`` counts the blocks of ``hash_ids`` left out of ``keys`` because they
    are not full (0 unless :func:`read_trace` was given ``block_tokens``).
    """

    req_id: str
    keys: list[OffloadKey]
    timestamp: float | None = None
    partial_blocks: int = 0
    line: int = 0


def read_trace(
    path: str | Path, limit: int | None = None, *, block_tokens: int | None = None
) -> Iterator[TraceRequest]:
    """Yield the requests of a Mooncake JSONL trace, keys built with ``make_offload_key``.

    Equal ``hash_ids`` become equal keys, so prefix sharing in the trace is preserved. With
    ``block_tokens``, a request with an ``input_length`` keeps only its first
    ``input_length // block_tokens`` blocks (the full ones); without, every block is kept.
    """
    if block_tokens is not None and (
        isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens <= 0
    ):
        raise ConfigError(f"block_tokens must be a positive int, got {block_tokens!r}")
    path = Path(path)
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise TraceError(f"trace file {str(path)!r} {what}")
    key_cache: dict[int, OffloadKey] = {}
    # Binary, decoded per line: a line that is not UTF-8 is a malformed line with a number.
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if limit is not None and lineno > limit:
                return
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
                if not isinstance(record, dict):
                    raise ValueError(
                        f"the line is a JSON {type(record).__name__}, not an object "
                        f'(each line is one request: {{"hash_ids": [...], ...}})'
                    )
                hash_ids = record["hash_ids"]
                if not isinstance(hash_ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
                ):
                    raise ValueError("'hash_ids' must be a list of integers")
                timestamp = record.get("timestamp")
                length = record.get("input_length")
                if length is not None and (
                    isinstance(length, bool) or not isinstance(length, int) or length < 0
                ):
                    raise ValueError("'input_length' must be a non-negative integer")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
                raise TraceError(f"{path}:{lineno}: malformed trace line: {what}") from None
            partial = 0
            if block_tokens is not None and length is not None:
                full = length // block_tokens
                if full < len(hash_ids):
                    partial = len(hash_ids) - full
                    hash_ids = hash_ids[:full]
            keys = []
            seen: set[int] = set()
            for h in hash_ids:
                if h in seen:  # a prefix chain names each block once; the manager refuses it
                    raise TraceError(
                        f"{path}:{lineno}: malformed trace line: hash {h} appears twice in "
                        "one request's 'hash_ids'"
                    )
                seen.add(h)
                key = key_cache.get(h)
                if key is None:
                    try:
                        key = key_cache[h] = make_offload_key(h)
                    except InvalidKeyError as exc:
                        raise TraceError(f"{path}:{lineno}: malformed trace line: {exc}") from None
                keys.append(key)
            yield TraceRequest(f"req-{lineno}", keys, timestamp, partial, lineno)


def arrival_seconds(records: list[TraceRequest], path: str | Path) -> list[float]:
    """Each request's arrival in seconds (``timestamp`` is in milliseconds), for a timed
    replay: a request without a timestamp, with one that is not a finite number >= 0, or
    earlier than the request before it is a :class:`TraceError` naming ``file:line``."""
    arrivals: list[float] = []
    previous = 0.0
    for record in records:
        stamp = record.timestamp
        where = f"{path}:{record.line}"
        untimed = "replay it untimed with --speed max"
        if stamp is None:
            raise TraceError(f"{where}: the request has no 'timestamp' (ms); {untimed}")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            raise TraceError(f"{where}: 'timestamp' must be a number of ms, got {stamp!r}")
        if not 0 <= stamp < float("inf"):
            raise TraceError(f"{where}: 'timestamp' must be finite and >= 0, got {stamp!r}")
        if stamp < previous:
            raise TraceError(
                f"{where}: 'timestamp' {stamp:g} goes back in time (the line before says "
                f"{previous:g}); a timed replay needs lines in arrival order: sort the trace "
                f"by timestamp, or {untimed}"
            )
        previous = float(stamp)
        arrivals.append(stamp / 1000.0)
    return arrivals
