"""The CPU manager's request flow for the one manager that owns it.

A manager built over a :class:`~kv_offload.CPUOffloadingManager` (the stack's outermost
object, the one the engine holds) takes the entry guard of each call itself, once, and then
drives the CPU manager through :meth:`CPUOffloadingManager.hand_over
<kv_offload.CPUOffloadingManager.hand_over>`'s :class:`CPUCalls`: the same method bodies,
without a second guard (the input is checked once, by the body). From the hand-over on, the
owner is the CPU manager's only caller by construction: the CPU manager's own guard is taken
for good, so any other call of its request flow (a hook calling it back, a test, another
thread) is refused with :class:`~kv_offload.ConcurrentUseError` naming the owner; its
snapshot reads (``get_stats()``, ``ref_count()``, ``block_id()``, the ``num_*`` properties)
stay open.

What the owner may ask that the engine may not (vLLM's ``prepare_read`` / ``prepare_write``
names the same split):

* :attr:`CPUCalls.pin` / :attr:`CPUCalls.unpin`: hold blocks readable for a reader that is not
  the engine (no access is recorded for the request);
* :attr:`CPUCalls.reserve`: slots for blocks the engine did not offer (their bytes come from
  elsewhere), so the admission is not asked;
* :attr:`CPUCalls.start_request`: the owner checks the request's options that name what it
  adds to the CPU cache (a load filter) itself.

The attributes are the bodies bound to the manager, so a call through them costs what the
body costs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial
from types import MethodType
from typing import TYPE_CHECKING, Any

from ..block_status import BlockStatus
from ..concurrency import unguarded
from ..keys import OffloadKey
from ..types import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    PrepareStoreOutput,
    ReqContext,
)

if TYPE_CHECKING:
    from .manager import CPUOffloadingManager

__all__ = ["CPUCalls"]


def _body(method: Callable[..., Any], manager: CPUOffloadingManager) -> Any:
    """``manager``'s body of the guarded ``method``, bound to it (no wrapper frame)."""
    return MethodType(unguarded(method), manager)


class CPUCalls:
    """The request flow of one CPU manager for its owner (see the module docstring)."""

    def __init__(self, manager: CPUOffloadingManager) -> None:
        cls = type(manager)
        self.finish_request: Callable[[ReqContext], None] = _body(cls.on_request_finished, manager)
        self.lookup: Callable[[OffloadKey, ReqContext], LookupResult] = _body(cls.lookup, manager)
        self.prepare_load: Callable[[Collection[OffloadKey], ReqContext], CPULoadStoreSpec] = _body(
            cls.prepare_load, manager
        )
        self.complete_load: Callable[[Collection[OffloadKey], ReqContext], None] = _body(
            cls.complete_load, manager
        )
        #: Hold readable blocks for a reader that is not the engine (``operation`` names it
        #: in errors); their slots, in key order.
        self.pin: Callable[[Collection[OffloadKey], ReqContext, str], list[BlockStatus]] = _body(
            cls.pin, manager
        )
        self.unpin: Callable[[Collection[OffloadKey], ReqContext, str], int] = _body(
            cls.unpin, manager
        )
        self.touch: Callable[[Collection[OffloadKey], ReqContext], None] = _body(cls.touch, manager)
        #: The engine's offer (``protected=`` keyword as in ``prepare_store``).
        self.prepare_store: Callable[..., PrepareStoreOutput | None] = _body(
            cls.prepare_store, manager
        )
        self.complete_store: Callable[[Collection[OffloadKey], ReqContext, bool], None] = _body(
            cls.complete_store, manager
        )
        self.take_events: Callable[[], list[OffloadingEvent]] = _body(cls.take_events, manager)
        self.reset_cache: Callable[[], None] = _body(cls.reset_cache, manager)
        self.shutdown: Callable[[], None] = _body(cls.shutdown, manager)
        #: ``on_new_request`` without the check of the request's load filter (the owner
        #: resolves it).
        self.start_request: Callable[[ReqContext], None] = partial(
            _body(cls.on_new_request, manager), _alone=False
        )
        #: ``prepare_store`` for blocks the engine did not offer (``protected=`` as there): the
        #: admission is not asked, they were admitted when the engine first stored them.
        self.reserve: Callable[..., PrepareStoreOutput | None] = partial(
            _body(cls.prepare_store, manager), _offered=False
        )
