"""How the CPU manager frees slots: it asks the policy's ``evict()`` for victims and checks the
answer (:func:`evict_for`), and what it does when the answer breaks the contract.

The policy is a plugin, and ``evict()`` removes its victims from the policy's own structures
before the manager sees them, so a broken answer must not leave hidden damage behind:

* victims that break the contract (pinned, pending or protected blocks, the wrong number) are
  **put back**: re-inserted into the policy with their blocks, evictable again if idle. The
  call raises :class:`~kv_offload.PluginError` and the manager is as it was: pinned keys stay
  ``HIT``, ``complete_load`` works, ``get_stats()`` is unchanged;
* an ``evict()`` that raises, or returns something that is not ``(key, block)`` pairs, may
  have removed any number of blocks the manager cannot name. The manager is then marked
  **failed**: every later call that reads the cache raises :class:`~kv_offload.ManagerError`
  naming the policy and its error, until ``reset_cache()`` (which empties the cache and the
  policy) or a new manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from ..block_status import BlockStatus
from ..errors import ManagerError, PluginError
from ..keys import OffloadKey
from ..policies.base import split_pairs
from . import validation as check
from .state import MEDIUM_CPU

if TYPE_CHECKING:
    from .slots import SlotTable
    from .state import CPUManagerState

__all__ = ["evict_for", "mark_failed", "put_back", "victims"]


def evict_for(
    manager: CPUManagerState, shortfall: int, protected: set[OffloadKey]
) -> list[OffloadKey] | None:
    """Free ``shortfall`` slots: the evicted keys (their slots are free, the event recorded),
    or ``None`` with nothing changed when not enough idle, unprotected blocks exist."""
    slots = manager._slots
    if shortfall > slots.num_evictable:
        return None
    policy = manager._policy
    split = manager._policy_splits
    sized = manager._policy_len
    held = sized() if sized is not None else -1
    answer: Any  # the policy is a plugin: its answer is checked below, not trusted
    try:
        if split:
            answer = policy.evict_split(shortfall, protected)
        else:
            answer = policy.evict(shortfall, protected)
    except Exception as exc:
        raise mark_failed(manager, exc) from exc
    if answer is None:
        return None
    try:
        keys, blocks = victims(
            answer, split, shortfall, protected, slots, manager.cache_policy_name
        )
    except PluginError as exc:
        if not put_back(manager, check.as_pairs(answer) if split else answer):
            raise mark_failed(manager, exc) from exc
        raise
    # (Only for a policy whose size is the number of resident blocks, as it was before.)
    if sized is not None and sized() != held - shortfall and held == slots.num_resident:
        # It named a key it did not hold (or kept one it named): some victim slot is still
        # some resident key's, and handing it out would give one slot to two keys. Which
        # keys it removed cannot be told, so nothing can be put back: fail the manager.
        named = check.describe_victims(
            check.as_pairs(answer) if split else answer, slots.refs.__getitem__
        )
        raise mark_failed(
            manager,
            LookupError(
                f"it named {shortfall} victim(s) but its size went from {held} to {sized()}, "
                f"so some named key was not one it held (or was not removed): {named}"
            ),
        )
    if (sink := manager.eviction_sink) is not None:
        sink(keys, blocks)  # before the slots are freed: the victims' bytes are still intact
    slots.release_idle(blocks)
    manager.counters.evictions += shortfall
    if manager.event_log is not None:
        manager.event_log.record(keys, MEDIUM_CPU, True)
    return keys


def victims(
    answer: Any,
    split: bool,
    expected: int,
    protected: set[Any],
    slots: SlotTable,
    policy_name: str,
) -> tuple[list[OffloadKey], list[BlockStatus]]:
    """A policy's eviction answer as keys and blocks, checked against the contract: ``(keys,
    blocks)`` from ``evict_split`` when ``split``, else ``evict()``'s ``(key, block)`` pairs.

    The policy is a plugin: a victim that is pinned, pending or protected would have its
    bytes overwritten while in use, so the contract is checked, not trusted. The check runs
    on every eviction (here, not in :mod:`~kv_offload.cpu.validation`, which only builds
    errors); the error is built there when it fails.
    """
    try:
        keys, blocks = answer if split else split_pairs(answer)
        kept = (
            len(keys) == expected == len(blocks)
            and not any(map(slots.refs.__getitem__, blocks))  # idle (raises for a non-slot)
            and protected.isdisjoint(keys)
        )
    except (TypeError, ValueError, IndexError):
        kept = False
    if not kept:
        method = "evict_split" if split else "evict"
        named = check.as_pairs(answer) if split else answer
        got = check.describe_victims(named, slots.refs.__getitem__)
        raise PluginError(
            f"policy {policy_name!r} broke the evict() contract: asked for {expected} "
            f"(key, BlockStatus) pairs of idle, unprotected blocks, got {got}; fix the "
            f"policy's {method}()",
            kind="policy",
            plugin=policy_name,
        )
    return keys, blocks


def put_back(manager: CPUManagerState, chosen: Any) -> bool:
    """Re-insert a contract-breaking ``evict()`` answer into the policy; ``False`` when the
    answer is not ``(key, block)`` pairs of known slots (nothing can be put back)."""
    slots = manager._slots
    try:
        pairs = [(key, block) for key, block in chosen]
        hash(tuple(key for key, _ in pairs))
    except (TypeError, ValueError):
        return False
    if not all(isinstance(b, BlockStatus) and 0 <= b < slots.num_blocks for _, b in pairs):
        return False
    policy = manager.policy
    for key, block in pairs:
        if policy.get(key) is not None:
            continue  # not removed (a key the policy still holds)
        policy.insert(key, block)
        if slots.refs[block] == 0:
            policy.mark_evictable(key)
    return True


def mark_failed(manager: CPUManagerState, error: BaseException) -> PluginError:
    """Make every later cache read raise, and return the error to raise now."""
    name = manager.cache_policy_name
    message = (
        f"policy {name!r} broke the evict() contract ({type(error).__name__}: {error}); "
        f"the blocks it removed cannot be named, so the manager is failed: call "
        f"reset_cache() or build a new manager, and fix the policy's evict()"
    )

    def failed(key: Any) -> NoReturn:
        raise ManagerError(message)

    manager._get = failed
    return PluginError(message, kind="policy", plugin=name)
