"""How the CPU manager chooses slots to free: :class:`Eviction` asks the policy's ``evict()``
for victims and checks the answer, and handles an answer that breaks the contract. It reads
the slot table and talks to the policy; the manager frees the slots, counts and records the
eviction (it owns those), and is told through the ``fail`` callback it hands over when a
policy's answer leaves it unable to trust its cache.

The policy is a plugin, and ``evict()`` removes its victims from the policy's own structures
before the manager sees them, so a broken answer must not leave hidden damage behind:

* victims that break the contract (pinned, pending or protected blocks, a victim named twice,
  the wrong number) are **put back**: re-inserted into the policy with their blocks,
  evictable again if idle. The call raises :class:`~kv_offload.PluginError` and the manager
  is as it was: pinned keys stay ``HIT``, ``complete_load`` works, ``get_stats()`` is
  unchanged;
* an ``evict()`` that raises, or returns something that is not ``(key, block)`` pairs, may
  have removed any number of blocks the manager cannot name. The manager is then marked
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
        #: ``len(policy)`` if the policy can say how many keys it holds: then every victim
        #: it names is checked to have been one it held.
        sized = getattr(policy, "__len__", None)  # optional: not part of vLLM's CachePolicy
        self._len: Callable[[], int] | None = sized if callable(sized) else None

    def choose(
        self, shortfall: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], list[BlockStatus]] | None:
        """``shortfall`` victims (keys and their blocks, removed from the policy, every one
        idle and unprotected), or ``None`` with nothing changed when not enough idle,
        unprotected blocks exist. A broken answer raises
        :class:`~kv_offload.errors.PluginError` (the victims put back when they can be)."""
        slots = self._slots
        if shortfall > slots.num_evictable:
            return None
        policy, split, sized = self._policy, self._split, self._len
        held = sized() if sized is not None else -1
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
            keys, blocks = victims(answer, split, shortfall, protected, slots, self._name)
        except PluginError as exc:
            if not self._put_back(check.as_pairs(answer) if split else answer):
                raise self._failed(exc) from exc
            raise
        # (Only for a policy whose size is the number of resident blocks, as it was before.)
        if sized is not None and sized() != held - shortfall and held == slots.num_resident:
            # It named a key it did not hold (or kept one it named): some victim slot is
            # still some resident key's, and handing it out would give one slot to two keys.
            # Which keys it removed cannot be told, so nothing can be put back.
            named = check.describe_victims(
                check.as_pairs(answer) if split else answer, slots.refs.__getitem__
            )
            raise self._failed(
                LookupError(
                    f"it named {shortfall} victim(s) but its size went from {held} to "
                    f"{sized()}, so some named key was not one it held (or was not removed): "
                    f"{named}"
                )
            )
        return keys, blocks

    def _put_back(self, chosen: Any) -> bool:
        """Re-insert a contract-breaking ``evict()`` answer into the policy; ``False`` when
        the answer is not ``(key, block)`` pairs of known slots (nothing can be put back)."""
        slots = self._slots
        try:
            pairs = [(key, block) for key, block in chosen]
            hash(tuple(key for key, _ in pairs))
        except (TypeError, ValueError):
            return False
        if not all(isinstance(b, BlockStatus) and 0 <= b < slots.num_blocks for _, b in pairs):
            return False
        policy = self._policy
        for key, block in pairs:
            if policy.get(key) is not None:
                continue  # not removed (a key the policy still holds)
            policy.insert(key, block)
            if slots.refs[block] == 0:
                policy.mark_evictable(key)
        return True

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
            and (expected == 1 or len(set(keys)) == expected)  # no victim named twice
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
