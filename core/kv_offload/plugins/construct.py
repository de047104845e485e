"""Constructing a plugin: the one place a plugin's constructor failing becomes an error that
names the plugin.

A plugin may reject its settings with the project's own errors (a
:class:`~kv_offload.errors.ConfigError` naming the option): those pass through unchanged.
Anything else it raises is a bug or an environment problem inside the plugin, reported as a
:class:`~kv_offload.errors.PluginError` naming its kind, name and class, with the original
exception chained, so the user knows which distribution to look at. A constructor that
returns something other than the kind's base class is caught here too (:func:`named_instance`).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ..errors import KVOffloadError, PluginError

__all__ = ["construct", "named_instance"]

T = TypeVar("T")


class _Named(Protocol):
    plugin_name: str


N = TypeVar("N", bound=_Named)


def construct(kind: str, name: str, cls: type[T], *args: Any, where: str = "", **kwargs: Any) -> T:
    """``cls(*args, **kwargs)``, the plugin ``name`` of ``kind`` (``"policy"``, ``"tier"``,
    ``"admission"``); ``where`` (``"for tier 'fs'"``) says which slot it was built for."""
    try:
        return cls(*args, **kwargs)
    except KVOffloadError:
        raise
    except Exception as exc:
        place = f" {where}" if where else ""
        raise PluginError(
            f"{kind} {name!r} ({cls.__module__}.{cls.__qualname__}){place} failed to "
            f"initialise: {type(exc).__name__}: {exc}",
            kind=kind,
            plugin=name,
        ) from exc


def named_instance(
    kind: str, name: str, built: object, base: type[N], subclass: str, who: str = ""
) -> N:
    """``built`` (what the plugin ``name`` of ``kind`` constructed), checked to be a ``base``
    (else a :class:`~kv_offload.errors.PluginError` naming it and ``subclass``, the public
    path of ``base``), with its ``plugin_name`` set to ``name``. ``who`` (default
    ``"<kind> '<name>'"``) begins the message."""
    if not isinstance(built, base):
        article = "an" if base.__name__[:1].lower() in "aeiou" else "a"
        raise PluginError(
            f"{who or f'{kind} {name!r}'} built a {type(built).__name__}, not {article} "
            f"{base.__name__}; subclass {subclass}",
            kind=kind,
            plugin=name,
        )
    built.plugin_name = name
    return built
