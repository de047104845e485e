"""The eviction-policy plugin interface.

A policy owns the organisation of resident blocks (which structure holds them) and the choice
of victims; the manager owns slots, reference counts and events. The interface is vLLM's
``CachePolicy`` so a vLLM policy ports by renaming its imports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from ..block_status import BlockStatus
from ..errors import ConfigError
from ..keys import OffloadKey
from ..types import ReqContext

__all__ = ["CachePolicy", "split_pairs", "splits_victims"]


class CachePolicy(ABC):
    """Organises resident blocks and picks eviction victims.

    Contract the manager relies on:

    * ``get`` answers for resident blocks only (ghost entries are the policy's business);
    * ``evict(n, protected)`` is atomic: exactly ``n`` victims, none in ``protected`` and none
      with ``ref_cnt != 0``, or ``None`` and no state change at all;
    * ``mark_evictable``/``mark_non_evictable`` are called when a block's ``ref_cnt`` moves to
      or away from 0, so a policy may keep evictable blocks apart instead of reading counts;
    * ``on_request_access``/``on_store_miss`` report which keys requests asked for and which
      of them missed. Like every optional callback here, they are looked up once and never
      called when a policy leaves the base class's no-op, so policies that ignore them pay
      nothing.

    * the manager calls :meth:`fast_get` once, when it starts, and the function it returns for
      every key of every call: it must answer exactly as ``get`` does, for the policy's
      lifetime.
    """

    def __init__(self, cache_capacity: int) -> None:
        if isinstance(cache_capacity, bool) or not isinstance(cache_capacity, int):
            raise ConfigError(
                f"{type(self).__name__}: cache_capacity must be an int, "
                f"got {type(cache_capacity).__name__}"
            )
        if cache_capacity <= 0:
            raise ConfigError(
                f"{type(self).__name__}: cache_capacity must be > 0, got {cache_capacity}"
            )
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The status of a resident block, or ``None``."""

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        """The function the manager binds once and calls for every key: ``self.get`` unless
        overridden.

        Lookups are the hottest call of the manager. A policy whose resident blocks are one
        dict returns that dict's bound ``get`` (``return self._blocks.get``), a C method
        that enters no Python frame; the dict must then be cleared and mutated, never
        replaced, or the manager would keep reading the old one.
        """
        return self.get

    @abstractmethod
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """Add a newly allocated (pending) block."""

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Insert a batch in order; override when the structure can take a batch at C speed."""
        for key, block in zip(keys, blocks):
            self.insert(key, block)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget a resident block (a failed store); a no-op for absent keys."""

    @abstractmethod
    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Mark resident blocks as recently used; absent keys are ignored."""

    @abstractmethod
    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """Remove exactly ``n`` evictable blocks not in ``protected`` and return them, or
        return ``None`` without changing anything when that many cannot be found."""

    def evict_split(
        self, n: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], list[BlockStatus]] | None:
        """:meth:`evict`'s answer as two lists, the keys and their blocks in the same order.

        Optional: the manager calls it instead of :meth:`evict` when a policy implements it
        (see :func:`splits_victims`), because a policy that picks keys and blocks as separate
        lists would otherwise pair them up only for the manager to take the pairs apart again:
        two passes over the victims of every eviction. The contract is :meth:`evict`'s. This
        default splits :meth:`evict`'s pairs.
        """
        victims = self.evict(n, protected)
        return None if victims is None else split_pairs(victims)

    @abstractmethod
    def clear(self) -> None:
        """Forget every block, ghost entries and adaptive state included."""

    def mark_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """The block's ``ref_cnt`` became 0."""

    def mark_non_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """The block's ``ref_cnt`` left 0."""

    def on_request_access(  # noqa: B027 - optional hook
        self, keys: list[OffloadKey], req_context: ReqContext
    ) -> None:
        """These keys were requested, resident or not (vLLM 0.33's name).

        The manager calls it with the keys of every ``prepare_load`` (the request's hits,
        after they are pinned) and of every ``prepare_store`` (after validation, before
        anything is stored or evicted, also when the store is then rejected), so a policy sees
        every key a request asked for, including resident keys after the first miss that no
        lookup reached. It keeps no per-request record: a key passed again in a later call of
        the same request is reported again (``req_context`` state can deduplicate). The list
        is the caller's: read it, do not keep or change it.
        """

    def on_store_miss(  # noqa: B027 - optional hook
        self, keys: list[OffloadKey], req_context: ReqContext
    ) -> None:
        """These keys missed and are about to be stored (vLLM 0.33's name).

        Called by ``prepare_store`` with the keys it will allocate, in the caller's order, after
        ``on_request_access`` and the store-admission hook and before ``evict`` and
        ``insert_many``; a key here is not resident. Unlike vLLM's default, which forwards to
        ``touch``, the default is a no-op: a miss is not a use.
        """

    def on_request_finished(self, req_context: ReqContext) -> None:  # noqa: B027
        """A request ended; drop any per-request state."""


def split_pairs(
    victims: Iterable[tuple[OffloadKey, BlockStatus]],
) -> tuple[list[OffloadKey], list[BlockStatus]]:
    """:meth:`~CachePolicy.evict`'s ``(key, block)`` pairs as :meth:`~CachePolicy.evict_split`'s
    two lists (raises ``TypeError`` or ``ValueError`` for anything that is not pairs)."""
    return [key for key, _ in victims], [block for _, block in victims]


def splits_victims(policy_cls: type[CachePolicy]) -> bool:
    """Whether the manager asks ``policy_cls`` for :meth:`~CachePolicy.evict_split` rather than
    :meth:`~CachePolicy.evict`: it implements ``evict_split`` and no subclass below that
    implementation overrides ``evict`` alone (a subclass that wraps ``evict``, say to log
    victims, keeps being called)."""

    def owner(name: str) -> type:
        return next(cls for cls in policy_cls.__mro__ if name in vars(cls))

    split_owner = owner("evict_split")
    return split_owner is not CachePolicy and issubclass(split_owner, owner("evict"))
