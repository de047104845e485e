"""Load-wait policies: how long a timed replay's engine holds a request back for blocks that a
secondary tier is still promoting (lookups answering ``PENDING``).

An engine cannot wait forever for a disk or a network: every step a request waits is latency
its user sees, yet every block that arrives in time is prefill compute saved. A policy gives
each request a wait budget in wall-clock seconds; the engine asks the request's lookups again
on every step until no block is ``PENDING`` or the budget is spent. Blocks still ``PENDING``
then are misses for that request (counted as *late*: their promotion lands for later requests).

The built-in policies follow SGLang HiCache's prefetch policies:

* ``best_effort``: never wait; take what the CPU tier holds now.
* ``timeout``: wait ``base_s`` plus ``per_1k_tokens_s`` per 1,024 tokens of the request's
  prefix (a long prompt saves more compute per block, so it may wait longer).
* ``wait_complete``: wait until every promotion resolved (the manager's promotion deadline,
  ``promotion_timeout_s``, bounds that wait).

Policies are plugins like every other kind: entry-point group ``kv_offload.load_wait``
(the built-in ones are registered by the ``kv-offload`` distribution itself), or
``module_path`` for one not installed. Settings come from ``--load-wait-option KEY=VALUE``.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError
from .plugins.registry import PluginRegistry

__all__ = [
    "LOAD_WAIT_ENTRY_POINT_GROUP",
    "BestEffort",
    "LoadWaitPolicy",
    "Timeout",
    "WaitComplete",
    "build_load_wait",
    "load_wait_registry",
]

LOAD_WAIT_ENTRY_POINT_GROUP = "kv_offload.load_wait"


class LoadWaitPolicy:
    """How long a request may wait for its ``PENDING`` blocks.

    Subclasses implement :meth:`budget_s`; settings arrive as keyword arguments to
    ``__init__`` (reject unknown ones with :class:`~kv_offload.errors.ConfigError`).
    """

    def budget_s(self, prefix_blocks: int, block_tokens: int) -> float:
        """Wall-clock seconds a request with ``prefix_blocks`` blocks of ``block_tokens``
        tokens may wait for promotions, counted from the first step it found one
        ``PENDING``; ``math.inf`` waits until they resolve, ``0`` never waits."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the replay report."""
        return type(self).__name__


class BestEffort(LoadWaitPolicy):
    """Never wait: blocks not in the CPU tier when the request is scheduled are misses."""

    def budget_s(self, prefix_blocks: int, block_tokens: int) -> float:
        return 0.0

    def describe(self) -> str:
        return "best_effort (no wait)"


class WaitComplete(LoadWaitPolicy):
    """Wait until every promotion resolved (bounded by the manager's promotion deadline)."""

    def budget_s(self, prefix_blocks: int, block_tokens: int) -> float:
        return math.inf

    def describe(self) -> str:
        return "wait_complete (until every promotion resolves)"


class Timeout(LoadWaitPolicy):
    """Wait ``base_s + per_1k_tokens_s * prefix_tokens / 1024`` seconds."""

    def __init__(self, *, base_s: float = 0.2, per_1k_tokens_s: float = 0.02) -> None:
        self.base_s = _non_negative("base_s", base_s)
        self.per_1k_tokens_s = _non_negative("per_1k_tokens_s", per_1k_tokens_s)

    def budget_s(self, prefix_blocks: int, block_tokens: int) -> float:
        return self.base_s + self.per_1k_tokens_s * prefix_blocks * block_tokens / 1024

    def describe(self) -> str:
        return f"timeout ({self.base_s:g} s + {self.per_1k_tokens_s:g} s per 1k prefix tokens)"


def _non_negative(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"load-wait option {key} must be a number of seconds, got {value!r}")
    if not 0 <= value < math.inf:
        raise ConfigError(f"load-wait option {key} must be >= 0 and finite, got {value!r}")
    return float(value)


load_wait_registry: PluginRegistry[LoadWaitPolicy] = PluginRegistry(
    "load-wait policy",
    LOAD_WAIT_ENTRY_POINT_GROUP,
    LoadWaitPolicy,
    "--load-wait NAME",
)


def build_load_wait(
    name: str, options: dict[str, Any] | None = None, module_path: str | None = None
) -> LoadWaitPolicy:
    """The policy called ``name`` (installed, or from ``module_path``) with ``options``; a
    bad option is a :class:`~kv_offload.errors.ConfigError` naming the policy."""
    cls = load_wait_registry.resolve(name, module_path)
    try:
        return cls(**(options or {}))
    except TypeError as exc:
        raise ConfigError(
            f"load-wait policy {name!r} does not take these options {sorted(options or {})}: {exc}"
        ) from None
