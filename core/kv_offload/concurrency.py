"""Which thread may drive a manager: one at a time, detected; or any, through a lock.

The managers are single-threaded by design: the engine's scheduler thread drives them, and
locking every call would cost every caller for the sake of a few. Instead every request-flow
and whole-cache method takes a non-blocking **entry guard** before it reads or changes
anything, and gives it back when it returns or raises. A second entry while the guard is
taken raises :class:`~kv_offload.ConcurrentUseError` at once, before any state changed:

* from **another thread**: two threads drive one manager. Drive one manager from one thread,
  or wrap it with :func:`synchronized`, which takes a real lock around every call;
* from the **same thread** (re-entry): a hook plugin, called during a manager call, called a
  request-flow method of that manager back. The outer call is half done, so this is refused.
  The hook dispatch records which hook runs on the thread (:data:`CALLOUT`), so the error
  names it; nothing walks the stack.

A manager built over another (the tiered manager over its CPU manager) takes the inner
manager's guard for good when it is handed the inner one (:func:`take_for_good`), and takes
only its own guard on each call: the guard is taken once, in the object the engine holds, and
the inner manager refuses every other caller, naming its owner.

Snapshot reads (``get_stats()``, ``cpu_stats()``, ``tier_stats()``, ``ref_count()``,
``block_id()``, ``num_free_blocks``, ``num_resident_blocks``, ``has_pending_work()``) take no
guard: they may be called from a hook and from any thread (a metrics scrape), and read fields
that may be one operation apart, never a half-built structure.

The guard is a one-element list: ``list.pop()`` and ``list.append()`` are each atomic, so
exactly one caller gets the token, for about 25 ns a call; a ``_thread.lock``'s
``acquire(False)`` plus ``release()`` measured about 190 ns on CPython 3.11 (argument parsing),
more than a whole ``lookup``. The README's Threads section has the figures.

Speed trick, guarded by ``benchmarks/guard_overhead.py`` (the replay with every guarded method
unwrapped, in the same run): :func:`entry_guarded` compiles each wrapper from source with the
method's own parameters (a closure's ``*args, **kwargs`` repacking measured about 200 ns a
call). What it must do, refuse a second entry before any state changed and give the token
back on every exit, is tested in ``tests/cpu/test_cpu_threads.py`` and
``tests/tiering/test_tiering_threads.py``.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from .errors import ConcurrentUseError

__all__ = [
    "ConcurrentUseError",
    "concurrent_use_error",
    "entry_guarded",
    "new_entry_token",
    "take_for_good",
    "unguarded",
]

P = ParamSpec("P")
R = TypeVar("R")

#: How a manager's methods that take the entry guard say "the token is free".
_TOKEN = True
#: Lock-free reads, listed in the error so a hook author knows what is allowed.
SNAPSHOT_READS = "get_stats(), cpu_stats(), tier_stats(), ref_count(), block_id()"


class Guarded(Protocol):
    """A manager with an entry token (see :func:`new_entry_token`)."""

    _entry: list[bool]


G = TypeVar("G", bound=Guarded)


def new_entry_token() -> list[bool]:
    """A free entry guard: a list holding one token, popped on entry, put back on exit."""
    return [_TOKEN]


def take_for_good(manager: Guarded, method: str) -> None:
    """Take ``manager``'s entry guard and never give it back: from now on its guarded methods
    are refused (``CPUOffloadingManager.hand_over``: its owner is its only caller, and
    :func:`concurrent_use_error` names the owner). Refused like an entry while it is taken."""
    try:
        manager._entry.pop()
    except IndexError:
        raise concurrent_use_error(manager, method) from None


class _Callout(threading.local):
    """The hook plugin call running on this thread, if any: set by the hook dispatch
    (:mod:`kv_offload.plugins.dispatch`) around each call of a hook plugin, so a refused entry
    can tell a hook calling a manager back (same thread) from a second thread, without
    looking at the stack. Hooks are the managers' only call-outs that may call back; tiers
    never call the manager."""

    hook: str | None = None


#: This thread's running hook call (see :class:`_Callout`).
CALLOUT = _Callout()


def concurrent_use_error(manager: object, method: str) -> ConcurrentUseError:
    """The error for entering ``manager.method`` while its guard is taken: by the manager it
    was handed over to (``owner``), by a call that fired the hook now running on this thread
    (re-entry), or by another thread."""
    cls = type(manager).__name__
    owner = getattr(manager, "owner", None)
    hook = CALLOUT.hook
    if owner is not None:
        owner_cls = type(owner).__name__
        where = f" (from hook {hook})" if hook is not None else ""
        return ConcurrentUseError(
            f"{cls}.{method}() was called on a {cls} handed over to a {owner_cls}{where}: "
            f"the {owner_cls} is its only caller; call the {owner_cls} instead (from a hook: "
            f"record what the hook needs and act after the manager call returns); only "
            f"{SNAPSHOT_READS} can be called on the {cls}",
            method=method,
            manager=cls,
            reentrant=hook is not None,
            owner=owner_cls,
        )
    if hook is not None:
        return ConcurrentUseError(
            f"{cls}.{method}() was called from hook {hook} while the manager call that fired "
            f"it is running on the same thread; a manager's request-flow methods cannot be "
            f"re-entered from its hooks, only {SNAPSHOT_READS} can: record what the hook "
            f"needs and act after the manager call returns",
            method=method,
            manager=cls,
            reentrant=True,
        )
    return ConcurrentUseError(
        f"{cls}.{method}() was called while another thread is inside a call of the same "
        f"{cls}; managers are single-threaded (the scheduler's thread): drive one manager "
        f"from one thread, or wrap it with kv_offload.synchronized(manager)",
        method=method,
        manager=cls,
        reentrant=False,
    )


#: The wrapper entry_guarded() compiles per method, with the method's own parameters. As for the
#: ``__init__`` that ``dataclasses`` generates, the signature is why it is compiled from source:
#: a closure would take ``*args, **kwargs`` and repack them, measured at about 200 ns a call
#: (the guard itself costs about 25 ns; the compiled wrapper's extra frame about as much).
_WRAPPER = """\
def {name}({params}):
    entry = {self}._entry
    try:
        entry.pop()
    except IndexError:
        raise concurrent_use_error({self}, {name!r}) from None
    try:
        return method({args})
    finally:
        entry.append(True)
"""


def entry_guarded(
    method: Callable[Concatenate[G, P], R],
) -> Callable[Concatenate[G, P], R]:
    """``method`` behind the manager's entry guard, as a wrapper with ``method``'s own
    signature; the wrapper's source shows in tracebacks as ``<entry guard of ...>``."""
    name = method.__name__
    params, args = [], []
    namespace: dict[str, Any] = {"method": method, "concurrent_use_error": concurrent_use_error}
    star = False
    for param in inspect.signature(method).parameters.values():
        default = ""
        if param.default is not param.empty:
            namespace[f"_default_{param.name}"] = param.default
            default = f"=_default_{param.name}"
        if param.kind is param.VAR_POSITIONAL:
            params.append(f"*{param.name}")
            args.append(f"*{param.name}")
            star = True
        elif param.kind is param.VAR_KEYWORD:
            params.append(f"**{param.name}")
            args.append(f"**{param.name}")
        elif _hidden(param):
            continue  # the body's own (an owner passes it: cpu/handover.py); left at its default
        elif param.kind is param.KEYWORD_ONLY:
            if not star:
                params.append("*")
                star = True
            params.append(param.name + default)
            args.append(f"{param.name}={param.name}")
        else:
            params.append(param.name + default)
            args.append(param.name)
    first = next(iter(inspect.signature(method).parameters))
    source = _WRAPPER.format(name=name, self=first, params=", ".join(params), args=", ".join(args))
    filename = f"<entry guard of {method.__qualname__}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    guarded: Callable[Concatenate[G, P], R] = functools.update_wrapper(namespace[name], method)
    signature = inspect.signature(method)
    shown = [p for p in signature.parameters.values() if not _hidden(p)]
    if len(shown) < len(signature.parameters):  # the caller's signature, without the body's own
        guarded.__signature__ = signature.replace(parameters=shown)  # type: ignore[attr-defined]
    return guarded


def _hidden(param: inspect.Parameter) -> bool:
    """A keyword-only parameter named ``_...``: the body's own, left at its default by the
    wrapper (an owner passes it to the body: cpu/handover.py)."""
    return param.kind is param.KEYWORD_ONLY and param.name.startswith("_")


def unguarded(method: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R]:
    """The body of an :func:`entry_guarded` method, for a guarded caller of the same manager
    (``shutdown()`` resets the cache while it holds the guard)."""
    inner: Callable[Concatenate[G, P], R] = getattr(method, "__wrapped__", method)
    return inner
