"""How the CPU manager chooses slots to free: :class:`Eviction` asks the policy's ``evict()``
for victims and checks the answer, and handles an answer that breaks the contract. It reads
the slot table and talks to the policy; the manager frees the slots, counts and records the
eviction (it owns those), and is told through the ``fail`` callback it hands over when a
policy's answer leaves it unable to trust its cache.

The policy is a plugin, and ``evict()`` removes its victims from the policy's own structures
before the manager sees them, so a broken answer must not leave hidden damage behind:

* victims that break the contract (pinned, pending or protected blocks, a victim named twice,
  a key named with a slot the manager did not give it, the wrong number) are **put back**:
  re-inserted into the policy with their blocks, evictable again if idle. The call raises
  :class:`~kv_offload.PluginError` and the manager is as it was: pinned keys stay ``HIT``,
  ``complete_load`` works, ``get_stats()`` is unchanged. Whether a key was the one a slot
  holds, whatever the policy implements (``__len__`` or not), is told by the slot table's
  record of which key it gave each slot;
* an ``evict()`` that raises, returns something that is not ``(key, block)`` pairs, or drops
  the key of a slot while naming another key with it, may have removed blocks the manager
  cannot name (or put back). The manager is then marked
  **failed**: every later call that reads the cache raises :class:`~kv_offload.ManagerError`
  naming the policy and its error, until ``reset_cache()`` (which empties the cache and the
  policy) or a new manager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..block_status import BlockStatus
from ..errors import PluginError
from ..keys import OffloadKey
from ..policies.base import split_pairs, splits_victims
from . import validation as check

if TYPE_CHECKING:
    from ..policies import CachePolicy
    from .slots import SlotTable

__all__ = ["Eviction", "victims"]


class Eviction:
    """Chooses eviction victims for one CPU manager, from its policy, checked.

    ``fail(message)`` is the manager's: called when a broken answer means the policy removed
    blocks that cannot be named, after which the manager refuses every cache read until
    ``reset_cache()``.
    """

    def __init__(
        self,
        policy: CachePolicy,
        policy_name: str,
        slots: SlotTable,
        fail: Callable[[str], None],
    ) -> None:
        self._policy = policy
        self._name = policy_name
        self._slots = slots
        self._fail = fail
        self._split = splits_victims(type(policy))  # evict_split, or evict's pairs

    def choose(
        self, shortfall: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], list[BlockStatus]] | None:
        """``shortfall`` victims (keys and their blocks, removed from the policy, every one
        idle and unprotected, their slots freed), or ``None`` with nothing changed when not
        enough idle, unprotected blocks exist. A broken answer raises
        :class:`~kv_offload.errors.PluginError` (the victims put back when they can be)."""
        slots = self._slots
        if shortfall > slots.num_evictable:
            return None
        policy, split = self._policy, self._split
        answer: Any  # the policy is a plugin: its answer is checked below, not trusted
        try:
            if split:
                answer = policy.evict_split(shortfall, protected)
            else:
                answer = policy.evict(shortfall, protected)
        except Exception as exc:
            raise self._failed(exc) from exc
        if answer is None:
            return None
        try:
            return victims(answer, split, shortfall, protected, slots, self._name)
        except PluginError as exc:
            lost = self._put_back(check.as_pairs(answer) if split else answer)
            if lost is not None:
                raise self._failed(LookupError(f"{exc}; {lost}")) from exc
            raise

    def _put_back(self, chosen: Any) -> str | None:
        """Re-insert a contract-breaking ``evict()`` answer into the policy: each victim the
        slot table records as its slot's key and the policy no longer holds. ``None`` when
        nothing is lost; else what was (an answer that is not ``(key, block)`` pairs of
        known slots, or a slot whose key the policy dropped while naming another key)."""
        slots = self._slots
        try:
            pairs = [(key, block) for key, block in chosen]
            hash(tuple(pairs))
        except (TypeError, ValueError):
            return "its answer is not (key, block) pairs"
        owners, policy = slots.owners, self._policy
        if not all(isinstance(b, BlockStatus) and 0 <= b < len(owners) for _, b in pairs):
            return "its answer is not (key, BlockStatus) pairs of this manager's slots"
        for key, block in pairs:
            owner = owners[block]
            if owner is None:
                continue  # a slot that holds no block: nothing to put back
            if policy.get(owner) is not None:
                continue  # not removed (a key the policy still holds)
            if owner != key:
                return (
                    f"it dropped key {check.short(owner)} of slot {int(block)} and named "
                    f"{check.short(key)} (not one it held) instead"
                )
            policy.insert(key, block)
            if slots.refs[block] == 0:
                policy.mark_evictable(key)
        return None

    def _failed(self, error: BaseException) -> PluginError:
        """Fail the manager's cache reads, and return the error to raise now."""
        message = (
            f"policy {self._name!r} broke the evict() contract ({type(error).__name__}: "
            f"{error}); the blocks it removed cannot be named, so the manager is failed: call "
            f"reset_cache() or build a new manager, and fix the policy's evict()"
        )
        self._fail(message)
        return PluginError(message, kind="policy", plugin=self._name)


def victims(
    answer: Any,
    split: bool,
    expected: int,
    protected: set[Any],
    slots: SlotTable,
    policy_name: str,
) -> tuple[list[OffloadKey], list[BlockStatus]]:
    """A policy's eviction answer as keys and blocks, checked against the contract and their
    slots freed: ``(keys, blocks)`` from ``evict_split`` when ``split``, else ``evict()``'s
    ``(key, block)`` pairs.

    The policy is a plugin: a victim that is pinned, pending or protected would have its
    bytes overwritten while in use, and a victim named twice, or a key named with a slot that
    is not its own, would give one slot to two keys; so the contract is checked, not trusted.
    The check runs on every eviction, and the slot table's part of it (each slot resident,
    idle and allocated to the key named, none named twice:
    :meth:`~kv_offload.cpu.slots.SlotTable.free_victims`) in the pass that frees the slots,
    whether or not the policy has a ``__len__``. The error is built by
    :mod:`~kv_offload.cpu.validation` when it fails.
    """
    try:
        keys, blocks = answer if split else split_pairs(answer)
        kept = (
            len(keys) == expected == len(blocks)
            and protected.isdisjoint(keys)
            and slots.free_victims(keys, blocks)
        )
    except (TypeError, ValueError, IndexError):
        kept = False
    if not kept:
        method = "evict_split" if split else "evict"
        named = check.as_pairs(answer) if split else answer
        got = check.describe_victims(named, slots.refs.__getitem__, slots.owners)
        raise PluginError(
            f"policy {policy_name!r} broke the evict() contract: asked for {expected} "
            f"(key, BlockStatus) pairs of distinct, idle, unprotected blocks it holds, got "
            f"{got}; fix the policy's {method}()",
            kind="policy",
            plugin=policy_name,
        )
    return keys, blocks
