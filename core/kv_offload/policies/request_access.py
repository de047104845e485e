"""A request's cache accesses as vLLM 0.33's manager reports them, rebuilt from kv-offload's
policy callbacks: for policies that must decide exactly as vLLM's own ``lru`` and ``arc`` do.

vLLM's ``CPUOffloadingManager`` keeps a record per request and hands its policy that record:
``on_request_access`` gets each key once per request, and ``on_request_finished`` gets the
request's keys in head-to-tail order with the keys it only inserted and the keys it reused.
kv-offload's manager keeps no per-request record (most policies need none, and it would cost
every request): it reports every key of every ``prepare_load`` / ``prepare_store`` to
``on_request_access`` and calls ``on_request_finished(req_context)``. A policy that wants
vLLM's record keeps a :class:`RequestAccessLog`, which rebuilds it from those callbacks by
vLLM's rules:

* a key counts the first time the request asks for it, in the order asked; a key whose store
  is still in flight (``ref_cnt`` -1) does not count when offered again;
* an absent key offered to ``prepare_store`` counts only if the store goes on to allocate it.
  kv-offload's manager reports the offer before the reuse filter decides, so the access is
  held until ``on_store_miss`` names the keys the store allocates; an access that no
  ``on_store_miss`` follows is settled at the policy's next callback with its absent keys
  dropped (nothing was stored: every absent key was filtered out);
* keys ready when asked for are *reused*, unless this request itself inserted them (a
  tier cascade re-reading a block it stored is not a reuse); keys a store allocated are
  *inserted*; at request end *insertion-only* keys are the inserted ones never reused;
* the head-to-tail order at request end: per KV group (the key's last four bytes), in the
  order first asked for, sorted by the request's key positions when every key of the group
  has one; the groups in index order, then sorted across groups by position when every key
  has one (a stable sort: keys at the same position keep their group order).

The record lives in the request's :class:`~kv_offload.ReqContext` state, as vLLM's does, so a
request that never finishes keeps nothing in the policy; it leaves the context when the
request finishes.
It belongs to one log and one cache generation: after :meth:`RequestAccessLog.clear` (the
manager's ``reset_cache``) a request starts a new record and a record from before ends
silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..block_status import BlockStatus
from ..keys import OffloadKey
from ..types import ReqContext

__all__ = ["FinishedRequest", "RequestAccess", "RequestAccessLog", "head_to_tail"]

_ABSENT, _PENDING, _READY = 0, 1, 2


@dataclass(eq=False)
class RequestAccess:
    """One request's record in one log (``owner``) and cache generation.

    ``groups``: KV group -> the keys asked for, first ask first; ``rank``: free for the owning
    policy (``prefix-lru`` keeps the request's provisional recency rank there).
    """

    owner: object
    generation: int
    groups: dict[int, list[OffloadKey]] = field(default_factory=dict)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted: set[OffloadKey] = field(default_factory=set)
    reused: set[OffloadKey] = field(default_factory=set)
    store_misses: set[OffloadKey] = field(default_factory=set)
    rank: int | None = None
    finished: bool = False


@dataclass(frozen=True)
class FinishedRequest:
    """What a policy learns when a request ends: every key it asked for, head to tail; the
    keys it only inserted; the keys it reused."""

    keys: list[OffloadKey]
    insertion_only: set[OffloadKey]
    reused: set[OffloadKey]


def _group_of(key: OffloadKey) -> int:
    return int.from_bytes(key[-4:], "big")


def head_to_tail(keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
    """``keys`` sorted by the request's key positions if every key has one, else as given."""
    position = req_context.get_offload_key_position
    positions = {}
    for key in keys:
        found = position(key)
        if found is None:
            return list(keys)
        positions[key] = found
    return sorted(keys, key=positions.__getitem__)


class RequestAccessLog:
    """Rebuilds vLLM's per-request access record from kv-offload's policy callbacks.

    ``get`` answers for resident blocks (the policy's own lookup). ``on_new_keys(keys, ctx)``,
    if given, is called with the keys a request asks for the first time, in order, when they
    count: where vLLM's manager would call its policy's ``on_request_access``.

    The owning policy calls :meth:`access` from ``on_request_access``, :meth:`store_miss` from
    ``on_store_miss``, :meth:`inserted` after ``insert_many``, :meth:`finish` from
    ``on_request_finished`` and :meth:`clear` from ``clear``, and :meth:`settle` first in every
    other callback that changes its state (an access held for its store's misses must count
    before anything else happens).
    """

    def __init__(
        self,
        get: Callable[[OffloadKey], BlockStatus | None],
        on_new_keys: Callable[[list[OffloadKey], ReqContext], None] | None = None,
    ) -> None:
        self._get = get
        self._on_new_keys = on_new_keys
        self._generation = 0
        self._held: tuple[list[tuple[OffloadKey, int]], ReqContext] | None = None
        #: The context of the latest access or store miss: the request whose store the next
        #: ``insert_many`` allocates (kv-offload's ``insert_many`` carries no context).
        self.store_context: ReqContext | None = None

    def record_of(self, req_context: ReqContext) -> RequestAccess:
        """The request's current record, a new one if it has none in this log and generation."""
        record = req_context.get_state(RequestAccess)
        if record is None or record.owner is not self or record.generation != self._generation:
            record = RequestAccess(self, self._generation)
            req_context.set_state(record)
        return record

    def access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """``on_request_access``: count the keys now, or hold them if some are absent."""
        self.settle()
        self.store_context = req_context
        get = self._get
        classified = []
        absent = False
        for key in keys:
            block = get(key)
            if block is None:
                classified.append((key, _ABSENT))
                absent = True
            else:
                classified.append((key, _READY if block.ref_cnt >= 0 else _PENDING))
        if absent:
            self._held = (classified, req_context)
        else:
            self._count(classified, req_context, ())

    def store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """``on_store_miss``: settle the held access with ``keys`` allocated; returns the keys
        this request had not missed before (vLLM reports a miss once per request)."""
        held, self._held = self._held, None
        self.store_context = req_context
        record = self.record_of(req_context)
        new = [key for key in keys if key not in record.store_misses]
        record.store_misses.update(new)
        if held is not None:
            self._count(held[0], held[1], set(keys) if held[1] is req_context else ())
        return new

    def settle(self) -> None:
        """Count a held access whose store allocated nothing (its absent keys do not count)."""
        if self._held is not None:
            held, self._held = self._held, None
            self._count(held[0], held[1], ())

    def _count(
        self,
        classified: list[tuple[OffloadKey, int]],
        req_context: ReqContext,
        allocated: set[OffloadKey] | tuple[()],
    ) -> None:
        record = self.record_of(req_context)
        seen = record.seen
        new: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        for key, state in classified:
            if state == _PENDING or (state == _ABSENT and key not in allocated):
                continue
            if state == _READY:
                ready.append(key)
            if key in seen or record.finished:
                continue
            seen.add(key)
            record.groups.setdefault(_group_of(key), []).append(key)
            new.append(key)
        if new and self._on_new_keys is not None:
            self._on_new_keys(new, req_context)
        inserted = record.inserted
        record.reused.update(key for key in ready if key not in inserted)

    def inserted(self, keys: list[OffloadKey]) -> None:
        """``insert_many`` allocated ``keys`` for the request of :attr:`store_context`."""
        if self.store_context is not None:
            self.record_of(self.store_context).inserted.update(keys)

    def finish(self, req_context: ReqContext) -> FinishedRequest | None:
        """``on_request_finished``: the request's keys and classes, or ``None`` when it has no
        record in this log and generation, or finished already."""
        self.settle()
        record = req_context.get_state(RequestAccess)
        if (
            record is None
            or record.owner is not self
            or record.generation != self._generation
            or record.finished
        ):
            return None
        # Dropped at once: a caller may keep its contexts long after their requests end (a
        # replay holds them all), and the record is the bulk of a request's bookkeeping. A
        # second finish, or a late call for the request, finds no record (vLLM's manager keeps
        # a finished record and refuses new keys for it; here a late key starts a new one).
        req_context.pop_state(RequestAccess)
        record.finished = True
        keys: list[OffloadKey] = []
        for group in sorted(record.groups):
            keys.extend(head_to_tail(record.groups[group], req_context))
        keys = head_to_tail(keys, req_context)
        return FinishedRequest(keys, record.inserted - record.reused, record.reused)

    def clear(self) -> None:
        """A new cache generation: every record so far is stale."""
        self._held = None
        self.store_context = None
        self._generation += 1
