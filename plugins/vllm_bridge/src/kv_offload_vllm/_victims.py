"""The check of a bridged policy's ``evict`` answer (vLLM's manager trusts it)."""

from __future__ import annotations

from typing import Any

from kv_offload import OffloadKey, PluginError

__all__ = ["checked_victims"]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _problem(
    victims: Any, n: int, protected: set[OffloadKey], chunks: dict[OffloadKey, Any]
) -> tuple[str, list[tuple[OffloadKey, Any]]]:
    """What is wrong with ``victims`` ("" if nothing), and the (key, chunk) pairs checked."""
    evicted: list[tuple[OffloadKey, Any]] = []
    seen: set[OffloadKey] = set()
    try:
        pairs = list(victims)
        if len(pairs) != n:
            return f"{len(pairs)} pair(s)", evicted
        for key, block in pairs:
            chunk = chunks.get(key)
            if chunk is None or key in seen:
                return f"key {_short(key)} is not a resident block (or repeats)", evicted
            if int(block) != int(chunk.chunk_id):
                return (
                    f"key {_short(key)} came with slot {int(block)}, but it lives in slot "
                    f"{int(chunk.chunk_id)}"
                ), evicted
            if chunk.ref_cnt != 0:
                state = "pending (store in flight)" if chunk.ref_cnt < 0 else "pinned"
                return f"key {_short(key)} is {state}, ref_cnt={chunk.ref_cnt}", evicted
            if key in protected:
                return f"key {_short(key)} is protected", evicted
            seen.add(key)
            evicted.append((key, chunk))
    except (TypeError, ValueError):
        return f"{_short(victims)}, not (key, BlockStatus) pairs", evicted
    return "", evicted


def checked_victims(
    victims: Any,
    n: int,
    protected: set[OffloadKey],
    chunks: dict[OffloadKey, Any],
    *,
    policy: str,
    policy_class: type,
    bridged_name: str,
) -> list[tuple[OffloadKey, Any]]:
    """``victims`` as (key, vLLM chunk) pairs, or a :class:`~kv_offload.PluginError`.

    vLLM frees whatever ``evict`` returns; a pinned, pending, protected or unknown victim would
    have its slot overwritten while in use, so the answer is checked the way kv-offload's own
    manager checks it: exactly ``n`` distinct resident blocks, idle and unprotected.
    """
    problem, evicted = _problem(victims, n, protected, chunks)
    if problem:
        raise PluginError(
            f"policy {policy!r} ({policy_class.__module__}.{policy_class.__qualname__}), "
            f"bridged into vLLM as {bridged_name!r}, broke the evict() contract: asked for {n} "
            f"(key, BlockStatus) pairs of idle, unprotected resident blocks, got {problem}; "
            f"fix the policy's evict() (vLLM's manager was not changed, the policy's own state "
            f"is now undefined: restart the engine)",
            kind="policy",
            plugin=policy,
        )
    return evicted
