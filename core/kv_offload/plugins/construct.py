"""Constructing a plugin: the one place a plugin's constructor failing becomes an error that
names the plugin.

A plugin may reject its settings with the project's own errors (a
:class:`~kv_offload.errors.ConfigError` naming the option): those pass through unchanged.
Anything else it raises is a bug or an environment problem inside the plugin, reported as a
:class:`~kv_offload.errors.PluginError` naming its kind, name and class, with the original
exception chained, so the user knows which distribution to look at.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..errors import KVOffloadError, PluginError

__all__ = ["construct"]

T = TypeVar("T")


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
