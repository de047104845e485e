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
``module_path`` for one not installed (the API's; the command line takes installed names).
Settings come from ``--load-wait-option KEY=VALUE``. A policy that fails to build, raises, or
answers something other than seconds (a number >= 0, ``math.inf`` included; never NaN) is a
:class:`~kv_offload.errors.PluginError` naming it (:func:`checked_budget_s`).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from .errors import ConfigError, KVOffloadError, PluginError
from .plugins.construct import construct, named_instance
from .plugins.registry import PluginRegistry

__all__ = [
    "LOAD_WAIT_ENTRY_POINT_GROUP",
    "BestEffort",
    "LoadWaitPolicy",
    "Timeout",
    "WaitComplete",
    "build_load_wait",
    "checked_budget_s",
    "checked_describe",
    "load_wait_registry",
]

LOAD_WAIT_ENTRY_POINT_GROUP = "kv_offload.load_wait"


class LoadWaitPolicy:
    """How long a request may wait for its ``PENDING`` blocks.

    Subclasses implement :meth:`budget_s`; settings arrive as keyword arguments to
    ``__init__`` (reject unknown ones with :class:`~kv_offload.errors.ConfigError`).
    """

    #: The name it was built by (:func:`build_load_wait`), for errors that name it.
    plugin_name: str = ""

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
    takes_module_path=False,  # the command line selects installed policies only
)

KIND = load_wait_registry.kind


def build_load_wait(
    name: str, options: dict[str, Any] | None = None, module_path: str | None = None
) -> LoadWaitPolicy:
    """The policy called ``name`` (installed, or from ``module_path``) with ``options``. An
    option it does not take, or rejects, is a :class:`~kv_offload.errors.ConfigError`
    naming the policy; a constructor that fails otherwise is a
    :class:`~kv_offload.errors.PluginError`."""
    options = options or {}
    cls = load_wait_registry.resolve(name, module_path)
    _check_options(name, cls, options)
    try:
        policy = construct(KIND, name, cls, **options)
    except ConfigError as exc:  # the policy's own check of an option: say whose it is
        raise ConfigError(f"load-wait policy {name!r}: {exc}", key=exc.key) from exc
    return named_instance(KIND, name, policy, LoadWaitPolicy, "kv_offload.load_wait.LoadWaitPolicy")


def _check_options(name: str, cls: type, options: dict[str, Any]) -> None:
    """Options the constructor does not take are the user's mistake, found before it is
    called (a ``TypeError`` from inside it is the plugin's own bug)."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        takes = ", ".join(sorted(parameters)) or "no options"
        raise ConfigError(
            f"load-wait policy {name!r} does not take the options {unknown}; it takes: {takes}"
        )


def checked_budget_s(policy: LoadWaitPolicy, prefix_blocks: int, block_tokens: int) -> float:
    """``policy.budget_s(prefix_blocks, block_tokens)``, checked: a policy that raises or
    answers anything but seconds >= 0 (``math.inf`` included) is a
    :class:`~kv_offload.errors.PluginError` naming it and the contract it broke (a NaN
    would otherwise make every request give up at once, silently)."""
    name = policy.plugin_name or type(policy).__name__
    try:
        budget: object = policy.budget_s(prefix_blocks, block_tokens)
    except KVOffloadError:
        raise
    except Exception as exc:
        raise PluginError(
            f"load-wait policy {name!r} raised {type(exc).__name__}: {exc} in "
            f"budget_s({prefix_blocks}, {block_tokens}); fix the plugin's budget_s()",
            kind=KIND,
            plugin=name,
        ) from exc
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
        raise PluginError(
            f"load-wait policy {name!r} broke the budget_s() contract: it answered "
            f"{type(budget).__name__} {budget!r:.80} for budget_s({prefix_blocks}, "
            f"{block_tokens}); the answer must be seconds as a number >= 0 (0: never wait, "
            f"math.inf: until the promotions resolve). Fix the plugin's budget_s()",
            kind=KIND,
            plugin=name,
        )
    return float(budget)


def checked_describe(policy: LoadWaitPolicy) -> str:
    """``policy.describe()``, checked: one that raises or answers anything but a string is a
    :class:`~kv_offload.errors.PluginError` naming the policy."""
    name = policy.plugin_name or type(policy).__name__
    try:
        line: object = policy.describe()
    except KVOffloadError:
        raise
    except Exception as exc:
        raise PluginError(
            f"load-wait policy {name!r} raised {type(exc).__name__}: {exc} in describe(); "
            f"fix the plugin's describe()",
            kind=KIND,
            plugin=name,
        ) from exc
    if not isinstance(line, str):
        raise PluginError(
            f"load-wait policy {name!r} broke the describe() contract: it answered "
            f"{type(line).__name__} {line!r:.80}; describe() returns one line of text for "
            f"the report. Fix the plugin's describe()",
            kind=KIND,
            plugin=name,
        )
    return line
