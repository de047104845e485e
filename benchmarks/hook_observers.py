"""Hook plugins shared by the hooks benchmark and the hook tests.

Not a benchmark itself: ``benchmarks/hooks_overhead.py`` imports it as a sibling module, and
``tests/conftest.py`` puts this folder on ``sys.path`` so the tests measure and check the very
same observers (benchmarks never import test helpers).

* :func:`plugin_class` writes a plugin class with one ``@hookimpl`` per hook, each taking
  exactly the arguments of its hookspec in ``kv_offload.plugins.hookspecs``. pluggy passes a hook
  implementation only the arguments it names, so an observer written by hand that misses an
  argument (or a hook) added to the specs later measures, or records, less than it claims;
  generated ones follow the specs.
* :data:`NoOpObserver` implements every *event* hook with an empty body: what a passive
  observer costs the manager.
* :class:`SeenTwiceAdmission` is vLLM's ``store_threshold`` idea written as a hook plugin.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, TypeVar

from kv_offload import OffloadKey
from kv_offload.plugins import hookimpl, hookspecs

__all__ = [
    "EVENT_HOOKS",
    "SPECS",
    "NoOpObserver",
    "SeenTwiceAdmission",
    "plugin_class",
    "spec_arguments",
]

PREFIX = "kv_offload_"
Base = TypeVar("Base")

#: Every hookspec's name without the ``kv_offload_`` prefix, sorted.
SPECS = sorted(name.removeprefix(PREFIX) for name in dir(hookspecs) if name.startswith(PREFIX))


def _is_decision(hook: str) -> bool:
    marker = getattr(getattr(hookspecs, PREFIX + hook), "kv_offload_spec", None) or {}
    return bool(marker.get("firstresult"))


#: Every hook that reports something that happened: all but the (firstresult) decision hooks.
EVENT_HOOKS = tuple(hook for hook in SPECS if not _is_decision(hook))


def spec_arguments(hook: str) -> tuple[str, ...]:
    """The argument names of hookspec ``kv_offload_<hook>``, in order."""
    return tuple(inspect.signature(getattr(hookspecs, PREFIX + hook)).parameters)


def plugin_class(
    name: str,
    hooks: Iterable[str],
    base: type[Base],
    body: str = "pass",
    doc: str | None = None,
) -> type[Base]:
    """A subclass of ``base`` with a hook implementation per hook in ``hooks``.

    Each method takes the spec's arguments by name; ``body`` is its one statement, formatted
    with ``hook`` (the name without prefix) and ``kwargs`` (``"a=a, b=b"`` for the arguments),
    e.g. ``"self._record({hook!r}, {kwargs})"``. The source is compiled (as ``dataclasses``
    does) because pluggy reads the argument names from the function's code object.
    """
    lines = []
    for hook in hooks:
        arguments = spec_arguments(hook)
        kwargs = ", ".join(f"{a}={a}" for a in arguments)
        lines.append(f"def {PREFIX}{hook}(self, {', '.join(arguments)}):")
        lines.append(f"    {body.format(hook=hook, kwargs=kwargs)}")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<{name} hook implementations>", "exec"), namespace)
    methods = {key: hookimpl(fn) for key, fn in namespace.items() if key.startswith(PREFIX)}
    return type(name, (base,), {"__doc__": doc or base.__doc__, **methods})


NoOpObserver = plugin_class(
    "NoOpObserver",
    EVENT_HOOKS,
    object,
    doc="Implements every event hook, taking every argument of its spec, doing nothing.",
)


class SeenTwiceAdmission:
    """Store a block only the second time it is offered for storing (vLLM's
    ``store_threshold=2``), as a ``kv_offload_store_admission`` hook plugin.

    vLLM counts *lookups* per key; hooks do not see lookups (``lookup`` is the hottest call and
    fires no hook). What this hook does see is every batch ``prepare_store`` is about to
    allocate for (keys already stored are filtered out before it runs), so "seen twice" here
    means "offered for storing twice": a block one request produced and a later request
    produced again. A key's count is dropped once it is admitted, so a block evicted later
    has to earn its place again. At most ``max_tracked`` counts are kept (oldest forgotten
    first), so one-off blocks cannot grow the table without bound.
    """

    def __init__(self, threshold: int = 2, max_tracked: int | None = 1_000_000) -> None:
        self.threshold = threshold
        self.max_tracked = max_tracked
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    @hookimpl
    def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        counts = self.counts
        threshold = self.threshold
        admitted = []
        for key in keys:
            seen = counts.pop(key, 0) + 1
            if seen >= threshold:
                admitted.append(key)
            else:
                counts[key] = seen
        if self.max_tracked is not None:
            while len(counts) > self.max_tracked:
                counts.popitem(last=False)
        return admitted
