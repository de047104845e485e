"""Reading Mooncake-format request traces (one JSON object per line with ``hash_ids``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, InvalidKeyError
from .keys import OffloadKey, make_offload_key

__all__ = ["TraceRequest", "TraceError", "read_trace"]


class TraceError(ConfigError):
    """A trace file is missing or a line is malformed; the message names file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: its prefix block keys in order, and when it arrived (ms)."""

    req_id: str
    keys: list[OffloadKey]
    timestamp: float | None = None


def read_trace(path: str | Path, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a Mooncake JSONL trace, keys built with ``make_offload_key``.

    Equal ``hash_ids`` become equal keys, so prefix sharing in the trace is preserved.
    """
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
                hash_ids = record["hash_ids"]
                if not isinstance(hash_ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
                ):
                    raise ValueError("'hash_ids' must be a list of integers")
                timestamp = record.get("timestamp")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
                raise TraceError(f"{path}:{lineno}: malformed trace line: {what}") from None
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
            yield TraceRequest(f"req-{lineno}", keys, timestamp)
