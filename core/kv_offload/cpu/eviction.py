"""How the CPU manager frees slots: it asks the policy's ``evict()`` for victims and checks the
answer against its own slot table before it frees anything (:func:`evict_for`).

The policy is a plugin, and ``evict()`` removes its victims from the policy's own structures
before the manager sees them, so a broken answer must not leave hidden damage behind. The
slot table remembers which key each slot was handed out for (``SlotTable.owners``), so the
manager can tell a broken answer from a good one, and repair the policy:

* an answer that breaks the contract (a pinned, pending, free or protected block, a key that
  does not own the block it is named with: one the policy never held, a repeated block, the
  wrong number of victims, something that is not victims at all) raises
  :class:`~kv_offload.PluginError` naming the policy **with the manager unchanged**: no slot
  was freed, and every resident key the policy dropped is put back into it with its own
  slot, evictable again if idle. Pinned keys stay ``HIT``, ``complete_load`` works,
  ``get_stats()`` is unchanged;
* an ``evict()`` that raises, and a policy that cannot be repaired (it still holds keys the
  manager did not give it, or holds a key at another slot), leave the policy's own
  structures in a state the manager cannot know. The manager is then marked **failed**:
  every later call that reads the cache raises :class:`~kv_offload.ManagerError` naming the
  policy and its error, until ``reset_cache()`` (which empties the cache and the policy) or a
  new manager.
"""

from __future__ import annotations

from operator import eq
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

__all__ = ["evict_for", "mark_failed", "restore_policy", "victims"]


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
    found = victims(answer, split, shortfall, protected, slots)
    # (Only for a policy whose size is the number of resident blocks, as it was before.)
    if found is None or (
        sized is not None and sized() != held - shortfall and held == slots.num_resident
    ):
        raise broken_answer(manager, answer, split, shortfall, held)
    keys, blocks = found
    slots.release_idle(blocks)
    manager.counters.evictions += shortfall
    if manager.event_log is not None:
        manager.event_log.record(keys, MEDIUM_CPU, True)
    return keys


def victims(
    answer: Any, split: bool, expected: int, protected: set[Any], slots: SlotTable
) -> tuple[list[OffloadKey], list[BlockStatus]] | None:
    """A policy's eviction answer as keys and blocks if it keeps the contract, else ``None``:
    ``(keys, blocks)`` from ``evict_split`` when ``split``, else ``evict()``'s ``(key,
    block)`` pairs; exactly ``expected`` distinct, idle, unprotected blocks, each named with
    the key the slot table handed it out for, none on the free list.

    The policy is a plugin: a victim that is pinned, pending or protected would have its
    bytes overwritten while in use, and a key that does not own its block would give one
    slot to two keys, so the contract is checked, not trusted. The checks are C-level passes
    over the batch (the free list is short whenever the manager evicts)."""
    try:
        keys, blocks = answer if split else split_pairs(answer)
        free = slots.free
        kept = (
            len(keys) == expected == len(blocks)
            and min(blocks, default=0) >= 0
            and not any(map(slots.refs.__getitem__, blocks))  # idle (raises for a non-slot)
            and all(map(eq, map(slots.owners.__getitem__, blocks), keys))
            and protected.isdisjoint(keys)
            and len(set(blocks)) == expected
            and (not free or set(free).isdisjoint(blocks))
        )
    except (TypeError, ValueError, IndexError):
        return None
    return (keys, blocks) if kept else None


def broken_answer(
    manager: CPUManagerState, answer: Any, split: bool, expected: int, held: int
) -> PluginError:
    """The error for a contract-breaking eviction answer, after the policy was repaired (the
    manager is as it was), or the manager marked failed when it cannot be."""
    name = manager.cache_policy_name
    slots = manager._slots
    method = "evict_split" if split else "evict"
    named = check.as_pairs(answer) if split else answer
    got = check.describe_victims(named, slots.refs.__getitem__)
    sized = manager._policy_len
    size = "" if sized is None else f" (its size went from {held} to {sized()})"
    error = PluginError(
        f"policy {name!r} broke the evict() contract: asked for {expected} (key, "
        f"BlockStatus) pairs of idle, unprotected blocks, each named with a key the policy "
        f"held, got {got}{size}; fix the policy's {method}(). Nothing was evicted: the blocks "
        f"it removed are put back",
        kind="policy",
        plugin=name,
    )
    problem = restore_policy(manager)
    if problem is not None:
        return mark_failed(manager, LookupError(f"{error}; but {problem}"))
    return error


def restore_policy(manager: CPUManagerState) -> str | None:
    """Put every resident key the policy dropped back into it, with its own slot (evictable
    again if idle): the policy then holds exactly the manager's resident keys. ``None``, or
    why the policy cannot be repaired. Runs only after a broken answer (a pass over the
    slots)."""
    slots = manager._slots
    policy = manager._policy
    refs = slots.refs
    owners = slots.owners
    free = set(slots.free)
    status = slots.status
    for slot in range(slots.num_allocated):
        if slot in free:
            continue
        key = owners[slot]
        block = policy.get(key)
        if block is None:
            policy.insert(key, status(slot))
            if refs[slot] == 0:
                policy.mark_evictable(key)
        elif block != slot:
            return f"it holds key {check.short(key)} at slot {int(block)}, not its slot {slot}"
    sized = manager._policy_len
    if sized is not None and sized() != slots.num_resident:
        return f"it holds {sized()} keys where {slots.num_resident} blocks are resident"
    return None


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
