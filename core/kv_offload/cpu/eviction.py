"""How the CPU manager chooses slots to free: :class:`Eviction` asks the policy's ``evict()``
for victims and checks the answer, and handles an answer that breaks the contract. It reads
the slot table and talks to the policy; the manager frees the slots, counts and records the
eviction (it owns those), and is told through the ``fail`` callback it hands over when a
policy's answer leaves it unable to trust its cache.

The policy is a plugin, and ``evict()`` removes its victims from the policy's own structures
before the manager sees them, so a broken answer must not leave hidden damage behind. The
answer is checked against what the manager itself knows, whatever the policy implements
(``__len__`` or not): each victim is a ``(key, block)`` pair whose block is resident and idle
and was allocated to that key (the slot table's record of owners), no block is named twice,
no victim is protected, and the policy no longer finds any victim. Then:

* an answer that breaks the contract (pinned, pending, protected or repeated blocks, keys the
  policy does not hold or did not remove, the wrong number) is **undone**: every resident
  block the policy no longer finds is re-inserted under the key the slot table records for it,
  evictable again if idle. The call raises :class:`~kv_offload.PluginError` and the manager is
  as it was: no slot is handed out, pinned keys stay ``HIT``, ``complete_load`` works,
  ``get_stats()`` is unchanged;
* an ``evict()`` that raises, or returns something that is not ``(key, block)`` pairs, may
  have left the policy half-way through a change. The manager is then marked **failed**:
  every later call that reads the cache raises :class:`~kv_offload.ManagerError` naming the
  policy and its error, until ``reset_cache()`` (which empties the cache and the policy) or a
  new manager.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
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
        self._get = policy.fast_get()  # cleared, never replaced (CachePolicy.fast_get)
        #: ``len(policy)`` if the policy can say how many keys it holds (optional: vLLM's
        #: CachePolicy has no ``__len__``): then that its victims left it is one call.
        sized = getattr(policy, "__len__", None)
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
        policy, sized = self._policy, self._len
        held = sized() if sized is not None else 0
        answer: Any  # the policy is a plugin: its answer is checked below, not trusted
        try:
            if self._split:
                answer = policy.evict_split(shortfall, protected)
            else:
                answer = policy.evict(shortfall, protected)
        except Exception as exc:
            raise self._failed(exc) from exc
        if answer is None:
            return None
        try:
            chosen = victims(answer, self._split, shortfall, protected, slots, self._name)
            keys = chosen[0]
            # Each victim left the policy: its size fell by as many, or (no __len__) get()
            # finds none of them. Else a kept victim's slot would be handed out twice.
            if (
                sized() != held - shortfall
                if sized is not None
                else list(map(self._get, keys)) != [None] * shortfall
            ):
                raise check.kept_victims(self._name, keys, self._get, held, sized)
        except PluginError as exc:
            if not _pairs(check.as_pairs(answer) if self._split else answer):
                raise self._failed(exc) from exc
            self._restore()
            raise
        return chosen

    def _restore(self) -> None:
        """Undo a contract-breaking ``evict()`` answer: re-insert every resident block the
        policy no longer finds under the key the slot table records for it (evictable again
        if idle). A pass over the table, on this error path only: it finds the blocks the
        policy removed without naming them, and never inserts a key the answer made up."""
        slots, policy = self._slots, self._policy
        owners, refs = slots.owners, slots.refs
        for slot in slots.resident_slots():
            key = owners[slot]
            if policy.get(key) is None:
                policy.insert(key, slots.status(slot))
                if refs[slot] == 0:
                    policy.mark_evictable(key)

    def _failed(self, error: BaseException) -> PluginError:
        """Fail the manager's cache reads, and return the error to raise now."""
        message = (
            f"policy {self._name!r} broke the evict() contract ({type(error).__name__}: "
            f"{error}); the blocks it removed cannot be named, so the manager is failed: call "
            f"reset_cache() or build a new manager, and fix the policy's evict()"
        )
        self._fail(message)
        return PluginError(message, kind="policy", plugin=self._name)


def _pairs(answer: Any) -> bool:
    """Whether an ``evict()`` answer is a sequence of two-item pairs (the policy returned
    normally with victims it could name, so its own structures are whole)."""
    try:
        return all(len(pair) == 2 for pair in answer)
    except TypeError:
        return False


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
    bytes overwritten while in use, and a block named twice, or under a key that is not the
    one the slot table allocated it to, would be handed to two keys. So the contract is
    checked against the manager's own records, not trusted (that the victims left the policy
    is :meth:`Eviction.choose`'s check): the checks are C-level passes over the victims
    (here, not in
    :mod:`~kv_offload.cpu.validation`, which only builds errors); the error is built there
    when they fail.
    """
    try:
        keys, blocks = answer if split else split_pairs(answer)
        if type(keys) is not list:
            keys = list(keys)
        refs, owners = slots.refs, slots.owners
        if expected == 1:
            block = blocks[0]
            kept = len(keys) == len(blocks) == 1 and not refs[block] and owners[block] == keys[0]
        else:
            pick = itemgetter(*blocks)  # one C-level reader for both tables
            kept = (
                len(keys) == expected == len(blocks)
                and not any(pick(refs))  # idle (raises for a non-slot)
                and pick(owners) == tuple(keys)  # each block named with the key it holds
                and len(set(keys)) == expected  # so no block is named twice either
            )
        kept = kept and protected.isdisjoint(keys)
    except (TypeError, ValueError, IndexError):
        kept = False
    if not kept:
        method = "evict_split" if split else "evict"
        named = check.as_pairs(answer) if split else answer
        got = check.describe_victims(named, slots.refs.__getitem__)
        fault = check.victim_fault(named, expected, protected, slots.refs, slots.owners)
        raise PluginError(
            f"policy {policy_name!r} broke the evict() contract: asked for {expected} "
            f"distinct (key, BlockStatus) pairs of idle, unprotected blocks it held, got "
            f"{got}: {fault}; fix the policy's {method}()",
            kind="policy",
            plugin=policy_name,
        )
    return keys, blocks
