"""What a tier declares about itself and what a request may ask of the tiers.

* :class:`Medium` and :class:`Locality`: a secondary tier's storage medium (class attribute
  ``medium``) and where it lives (``locality``, set from the ``[[tiers]]`` key of the same
  name; it also picks the backpressure defaults, see :mod:`kv_offload.tiering.backpressure`).
* :class:`TierFilter`: which tiers a request's ``lookup`` may ask (``ReqContext.load_tier_filter``),
  by name and/or by medium and locality (vLLM's ``TierFilter``/``TierMatcher``).
* :class:`OffloadPolicy` and :class:`RequestOffloadingContext`: what a tier's
  ``on_new_request`` answers; ``REQUEST_LEVEL`` asks for every block of the request, not only
  the newly computed ones.

This module imports nothing from the managers, so :mod:`kv_offload.types` can use it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from .errors import InvalidArgumentError

__all__ = [
    "Locality",
    "Medium",
    "OffloadPolicy",
    "RequestOffloadingContext",
    "TierFilter",
    "TierMatcher",
]


class Medium(enum.Enum):
    """The storage medium of a tier (vLLM's values)."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(enum.Enum):
    """Where a tier's storage lives relative to this engine: ``LOCAL`` (its own RAM or disk)
    or ``REMOTE`` (a network filesystem, an object store, another host)."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"

    @classmethod
    def parse(cls, value: object, where: str) -> Locality:
        """``"local"``/``"remote"`` in any case (or a :class:`Locality`); else a clear error."""
        if isinstance(value, Locality):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise InvalidArgumentError(f'{where}: locality must be "local" or "remote", got {value!r}')


@dataclass(frozen=True)
class TierMatcher:
    """Matches tiers by medium and locality; ``None`` on either side matches anything."""

    medium: Medium | None = None
    locality: Locality | None = None

    def matches(self, medium: Medium | None, locality: Locality | None) -> bool:
        return (self.medium is None or medium is None or self.medium is medium) and (
            self.locality is None or locality is None or self.locality is locality
        )


@dataclass(frozen=True)
class TierFilter:
    """The tiers a request's lookups may ask: those matching one of ``matchers`` and, when
    ``tiers`` is set, named in it (vLLM's ``TierFilter``, plus names).

    ``TierFilter.ALL`` (the default: one matcher matching anything) allows every tier;
    ``TierFilter(matchers=())`` none, as in vLLM (the CPU tier only). A filter naming a tier
    the stack does not have is refused by the tiered manager
    (:class:`~kv_offload.errors.InvalidArgumentError`) rather than silently matching nothing.
    """

    matchers: tuple[TierMatcher, ...] = (TierMatcher(),)
    tiers: frozenset[str] | None = None

    ALL: ClassVar[TierFilter]

    def __post_init__(self) -> None:
        if self.tiers is not None and not isinstance(self.tiers, frozenset):
            if isinstance(self.tiers, str) or not isinstance(self.tiers, Iterable):
                raise InvalidArgumentError(
                    f"TierFilter: tiers must be a collection of tier names, got {self.tiers!r}"
                )
            object.__setattr__(self, "tiers", frozenset(self.tiers))
        if not isinstance(self.matchers, tuple) or not all(
            isinstance(m, TierMatcher) for m in self.matchers
        ):
            raise InvalidArgumentError(
                f"TierFilter: matchers must be a tuple of TierMatcher, got {self.matchers!r}"
            )

    @classmethod
    def only(cls, *names: str) -> TierFilter:
        """A filter allowing exactly the tiers called ``names``."""
        return cls(tiers=frozenset(names))

    def allows(self, name: str, medium: Medium | None, locality: Locality | None) -> bool:
        if self.tiers is not None and name not in self.tiers:
            return False
        return any(m.matches(medium, locality) for m in self.matchers)


TierFilter.ALL = TierFilter()


class OffloadPolicy(enum.Enum):
    """``CHUNK_LEVEL`` (the default): cascade the blocks this request computes.
    ``REQUEST_LEVEL``: every block of the request, prefix hits already in the CPU tier too."""

    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass(frozen=True)
class RequestOffloadingContext:
    """A tier's (or the tiered manager's) answer to ``on_new_request``."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
