"""Hook plugins used by the hook tests.

* :class:`RecordingPlugin` implements every hookspec and logs each call with all its
  arguments (generated from the specs, so a new hook or argument is recorded too).
* :class:`NoOpObserver`, :class:`SeenTwiceAdmission` and :data:`EVENT_HOOKS` are the ones
  ``benchmarks/hooks_overhead.py`` measures, from ``benchmarks/hook_observers.py``.
"""

from __future__ import annotations

from typing import Any

from benchmarks.hook_observers import (
    EVENT_HOOKS,
    SPECS,
    NoOpObserver,
    SeenTwiceAdmission,
    plugin_class,
)

__all__ = ["EVENT_HOOKS", "SPECS", "NoOpObserver", "RecordingPlugin", "SeenTwiceAdmission"]


class _Recorder:
    """Logs ``(hook, arguments)`` for every hook (names without ``kv_offload_``), and
    ``("step", label)`` markers from :meth:`step`, so a test sees which call fired what.
    The decision hook answers ``None`` (no opinion)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def step(self, label: str) -> None:
        self.log.append(("step", label))

    def _record(self, hook: str, **arguments: Any) -> None:
        # Copy the key list: a hook must see the batch as it was when the hook fired.
        if "keys" in arguments:
            arguments["keys"] = list(arguments["keys"])
        self.log.append((hook, arguments))


RecordingPlugin = plugin_class(
    "RecordingPlugin", SPECS, _Recorder, body="return self._record({hook!r}, {kwargs})"
)
