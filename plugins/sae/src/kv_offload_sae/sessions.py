"""Which resident block a stored block continues: the request's own key order, remembered per
request from the manager's callbacks.

A trace carries no session id, and neither does an engine's request. What it carries is the
prefix: a request's keys are its prompt's blocks in order, so a block is the continuation of
the block before it in the same request. The manager reports every key a request asks for to
``on_request_access`` (its hits at ``prepare_load``, then the keys it offers to
``prepare_store``), and names the keys a store allocates in ``on_store_miss`` just before
``insert_many``. :class:`TrailBook` keeps, per request, the last key it asked for and the
keys of its latest call, which is all it takes to name each stored key's predecessor: the key
before it in that call, or, for the call's first key, the last key of the call before.

Without the callbacks (a caller that only inserts), the keys of one ``insert_many`` are taken
as one chain whose first key has no predecessor.

The record lives in the request's :class:`~kv_offload.ReqContext` state and belongs to one
book and one cache generation (``clear`` starts a new one), as
:class:`~kv_offload.policies.RequestAccessLog`'s records do.
"""

from __future__ import annotations

from kv_offload import OffloadKey, ReqContext

__all__ = ["RequestTrail", "TrailBook"]


class RequestTrail:
    """One request's record: the keys of its latest call and the last key before them."""

    __slots__ = ("before", "generation", "last", "offered", "owner")

    def __init__(self, owner: object, generation: int) -> None:
        self.owner = owner
        self.generation = generation
        self.before: OffloadKey | None = None
        self.last: OffloadKey | None = None
        self.offered: list[OffloadKey] = []


class TrailBook:
    """Every running request's :class:`RequestTrail`, the one whose store is under way, and
    the request clock.

    ``requests`` counts requests: it advances when a request first asks for keys, and at a
    store or touch that no ``on_request_access`` announced (a caller without the callbacks:
    each such call counts as a request of its own).
    """

    def __init__(self) -> None:
        self.generation = 0
        self.storing: RequestTrail | None = None
        self.requests = 0
        self._announced = False

    def trail(self, req_context: ReqContext) -> RequestTrail:
        trail = req_context.get_state(RequestTrail)
        if trail is None or trail.owner is not self or trail.generation != self.generation:
            trail = RequestTrail(self, self.generation)
            req_context.set_state(trail)
            self.requests += 1
        return trail

    def now(self) -> int:
        """The clock for a store or touch being made."""
        if not self._announced:
            self.requests += 1
        self._announced = False
        return self.requests

    def access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """The request asked for ``keys``, in prefix order."""
        self._announced = True
        if not keys:
            return
        trail = self.trail(req_context)
        trail.before = trail.last
        trail.offered = list(keys)
        trail.last = keys[-1]

    def store_miss(self, req_context: ReqContext) -> None:
        """The next ``insert_many`` stores keys of this request's latest call."""
        self.storing = self.trail(req_context)

    def predecessors(self, keys: list[OffloadKey]) -> list[OffloadKey | None]:
        """Each stored key's predecessor in its request (``None``: none, or not known).

        Consumes the store announced by :meth:`store_miss`; a key its request did not offer
        (or a store nobody announced) continues the key stored before it in the batch.
        """
        trail, self.storing = self.storing, None
        if trail is None:
            return [None, *keys[:-1]] if keys else []
        offered = trail.offered
        index = {key: i for i, key in enumerate(offered)}
        out: list[OffloadKey | None] = []
        previous: OffloadKey | None = None
        for key in keys:
            i = index.get(key)
            if i is None:
                out.append(previous)
            else:
                out.append(offered[i - 1] if i else trail.before)
            previous = key
        return out

    def finish(self, req_context: ReqContext) -> None:
        trail = req_context.get_state(RequestTrail)
        if trail is not None and trail.owner is self:
            req_context.pop_state(RequestTrail)

    def clear(self) -> None:
        self.generation += 1
        self.storing = None
        self.requests = 0
        self._announced = False
