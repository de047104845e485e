"""How managers fire hooks, and what happens when a hook plugin raises.

Dispatch. pluggy's generic ``HookCaller.__call__`` re-checks and repacks the arguments and
runs a general loop on every call, about ten times the cost of a no-op plugin, and event hooks
fire several times per request. So :class:`HookCallers` gives each manager, per hook, either
``None`` (nobody implements it: the hot path pays one attribute read) or a small function that
calls the implementations directly, in pluggy's order and with pluggy's semantics: the most
recently registered first, each with only the arguments it names, ``firstresult`` hooks
stopping at the first non-``None`` answer. A hook with a wrapper (``hookwrapper``/``wrapper``)
needs pluggy's loop, and so does every hook while hook-call monitoring or tracing is on
(``add_hookcall_monitoring``, ``enable_tracing``), so that monitors see every call: then the
function is pluggy's own caller inside the error handling. The functions are rebuilt whenever
the plugin set or the monitoring changes. Benchmark: ``benchmarks/hooks_overhead.py``.

Errors. A plugin's exception becomes :class:`~kv_offload.errors.HookError` naming the plugin. The
rule for event hooks, applied by :class:`HookErrorLog` and nowhere else: the manager call's
effect stands, every other hook and tier result of the call is still processed, and the first
hook error is raised when the call is done, carrying the call's return value in ``result``.
Decision hooks (``store_admission``) raise before anything changed, and their answer is
checked here against the hook's contract (``_ANSWER_CHECKS``), where the plugin that gave it
is known: a broken answer is a :class:`~kv_offload.errors.HookError` naming that plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

import pluggy

from ..concurrency import CALLOUT
from ..errors import HookError, PluginError
from ..keys import is_offload_key
from .loading import HOOK_NAMES, KVOffloadPluginManager

__all__ = ["HookCallers", "HookErrorLog", "Dispatch"]

#: One hook's dispatch function: keyword arguments of the hookspec, the hook's result.
Dispatch = Callable[..., Any]


def _error(hook_name: str, plugin: str, exc: Exception) -> HookError:
    return HookError(
        f"hook plugin {plugin!r} raised in {hook_name}: {type(exc).__name__}: {exc}",
        kind="hook",
        plugin=plugin,
    )


def _admission_answer(hook_name: str, plugin: str, answer: Any) -> None:
    """``kv_offload_store_admission``'s contract: the offered keys to store, or ``None``
    (checked by the caller). A str such as ``"yes"`` is iterable, and taken as keys it
    would reject every block silently."""
    if isinstance(answer, (list, tuple, set, frozenset)) and all(map(is_offload_key, answer)):
        return
    raise HookError(
        f"hook plugin {plugin!r} broke the {hook_name} contract: it returned "
        f"{type(answer).__name__} {answer!r:.80}; it must return a list of the offered keys "
        f"to store (bytes), or None for no opinion. Nothing was stored; fix the plugin's "
        f"{hook_name}()",
        kind="hook",
        plugin=plugin,
    )


#: Per decision hook: the check of a non-``None`` answer, ``(hook name, plugin, answer)``.
_ANSWER_CHECKS: dict[str, Callable[[str, str, Any], None]] = {
    "kv_offload_store_admission": _admission_answer,
}


def _bound(impl: pluggy.HookImpl, spec_args: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    """``impl`` as a function of the call's keyword dict, passing only the arguments it names
    (pluggy's rule); an implementation taking every argument gets the dict as keywords."""
    function = impl.function
    names = tuple(impl.argnames)
    if set(names) == set(spec_args):
        return lambda kwargs: function(**kwargs)
    if not names:
        return lambda kwargs: function()
    get = itemgetter(*names)
    if len(names) == 1:
        return lambda kwargs: function(get(kwargs))
    return lambda kwargs: function(*get(kwargs))


def _direct(caller: pluggy.HookCaller, impls: list[pluggy.HookImpl]) -> Dispatch:
    """Call ``impls`` (no wrappers among them) one by one, as pluggy's loop would."""
    name = caller.name
    spec = caller.spec
    spec_args = tuple(spec.argnames) if spec is not None else ()
    firstresult = bool(spec is not None and spec.opts.get("firstresult"))
    check = _ANSWER_CHECKS.get(name)
    if len(impls) == 1 and set(impls[0].argnames) == set(spec_args):
        # The common case, one plugin taking every argument: no loop, no adapter frame.
        function, plugin = impls[0].function, impls[0].plugin_name

        running = f"{name} (plugin {plugin!r})"

        def dispatch_one(**kwargs: Any) -> Any:
            outer, CALLOUT.hook = CALLOUT.hook, running
            try:
                return function(**kwargs)
            except Exception as exc:
                raise _error(name, plugin, exc) from exc
            finally:
                CALLOUT.hook = outer

        if check is None:
            return dispatch_one

        def decide_one(**kwargs: Any) -> Any:
            answer = dispatch_one(**kwargs)
            if answer is not None:
                check(name, plugin, answer)
            return answer

        return decide_one
    # pluggy calls the last registered first.
    calls = [
        (_bound(impl, spec_args), impl.plugin_name, f"{name} (plugin {impl.plugin_name!r})")
        for impl in reversed(impls)
    ]

    def dispatch(**kwargs: Any) -> Any:
        for call, plugin, running in calls:
            outer, CALLOUT.hook = CALLOUT.hook, running
            try:
                result = call(kwargs)
            except Exception as exc:
                raise _error(name, plugin, exc) from exc
            finally:
                CALLOUT.hook = outer
            if firstresult and result is not None:
                if check is not None:
                    check(name, plugin, result)
                return result
        return None

    return dispatch


def _through_pluggy(caller: pluggy.HookCaller, impls: list[pluggy.HookImpl]) -> Dispatch:
    """pluggy's own caller, so wrappers and monitors see the call.

    pluggy does not say which implementation raised. With one implementation that is it;
    with several, the error names them all.
    """
    name = caller.name
    plugins = sorted({impl.plugin_name for impl in impls})
    culprit = plugins[0] if len(plugins) == 1 else "one of " + ", ".join(plugins)

    check = _ANSWER_CHECKS.get(name)

    running = f"{name} (plugin {culprit!r})" if len(plugins) == 1 else f"{name} ({culprit})"

    def dispatch(**kwargs: Any) -> Any:
        outer, CALLOUT.hook = CALLOUT.hook, running
        try:
            answer = caller(**kwargs)
        except HookError:
            raise
        except Exception as exc:
            raise _error(name, culprit, exc) from exc
        finally:
            CALLOUT.hook = outer
        if check is not None and answer is not None:
            check(name, culprit, answer)
        return answer

    return dispatch


class HookCallers:
    """One manager's view of the hooks: ``callers.blocks_stored`` is a function firing
    ``kv_offload_blocks_stored`` (keyword arguments; raises :class:`HookError`) when a plugin
    implements it, else ``None``."""

    request_started: Dispatch | None
    request_finished: Dispatch | None
    blocks_stored: Dispatch | None
    blocks_loaded: Dispatch | None
    blocks_evicted: Dispatch | None
    store_failed: Dispatch | None
    tier_job_finished: Dispatch | None
    cascade_dropped: Dispatch | None
    cache_reset: Dispatch | None
    shutdown: Dispatch | None
    store_admission: Dispatch | None

    def __init__(self, pm: KVOffloadPluginManager) -> None:
        self.plugin_manager = pm
        self.refresh()
        pm.subscribe(self.refresh)

    def refresh(self) -> None:
        """Rebuild every hook's function (the plugin set or the monitoring changed)."""
        pm = self.plugin_manager
        for name in HOOK_NAMES:
            caller = getattr(pm.hook, "kv_offload_" + name)
            impls = caller.get_hookimpls()
            dispatch: Dispatch | None = None
            if impls:
                wrapped = any(impl.hookwrapper or impl.wrapper for impl in impls)
                if wrapped or pm.monitored:
                    dispatch = _through_pluggy(caller, impls)
                else:
                    dispatch = _direct(caller, impls)
            setattr(self, name, dispatch)


class HookErrorLog:
    """The error channel of one manager call: keep the errors of the hooks and plugins whose
    call took effect while the manager call finishes its work, then raise the first one (the
    call's effect stands; a :class:`HookError`'s ``result`` holds its return value)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[PluginError] = []

    def fire(self, hook: Dispatch | None, **kwargs: Any) -> None:
        """Run an event hook (``None``: nobody implements it); keep its error for later."""
        if hook is not None:
            try:
                hook(**kwargs)
            except HookError as exc:
                self.pending.append(exc)

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a manager call whose effect stands even if its hooks raise; keep the error
        and return the call's result (a :class:`HookError` carries it)."""
        try:
            return function(*args, **kwargs)
        except HookError as exc:
            self.pending.append(exc)
            return exc.result

    def keep(self, error: PluginError) -> None:
        """Keep a plugin's error found during the call (say an admission that broke its
        contract: its blocks were not admitted), raised with the others when the call ends."""
        self.pending.append(error)

    def raise_pending(self, result: object = None) -> None:
        """Raise the first kept error, if any (a hook's with ``result`` attached); forget the
        rest."""
        if self.pending:
            first = self.pending[0]
            self.pending = []
            if result is not None and isinstance(first, HookError):
                first.result = result
            raise first
