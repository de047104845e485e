"""Per-request context handed to every manager call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import InvalidArgumentError

__all__ = ["ReqContext"]

_T = TypeVar("_T")


@dataclass
class ReqContext:
    """Identifies the request a call is made for.

    ``req_id`` is required: policies group work by request and hooks report it. ``state`` is a
    scratch space keyed by type so a policy, tier or hook can parse request data once (for
    example in ``on_new_request``) and read it back on later calls.
    """

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False, compare=False)

    def __post_init__(self) -> None:
        # Hooks, stats and tiers key per-request work by req_id; an int that equals another
        # request's str id (or None) would merge or drop their state silently.
        if not isinstance(self.req_id, str):
            raise InvalidArgumentError(
                f"ReqContext: req_id must be a str, got {type(self.req_id).__name__} "
                f"{self.req_id!r} (use str({self.req_id!r}))"
            )

    def set_state(self, value: Any) -> None:
        self._state[type(value)] = value

    def get_state(self, cls: type[_T]) -> _T | None:
        return self._state.get(cls)
