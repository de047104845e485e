"""Routers: which engine of a fleet takes each request.

A router sees the request (its prefix keys) and each live engine's load (requests sent to it
and not finished yet) and names an engine. Built in, as entry points of the ``kv-offload``
distribution (group ``kv_offload.routers``, like every other plugin kind):

* ``round-robin``: engines in turn, what a plain load balancer does;
* ``hash``: by the request's first blocks (``prefix_blocks``, default 2), so a session's
  turns, which share their prefix, meet their own cached blocks on one engine: session
  affinity. Two blocks, not one: in the bundled Mooncake trace every request starts with the
  same block (a shared system prompt), and hashing it alone sends the whole trace to one
  engine;
* ``least-loaded``: the engine with the fewest unfinished requests (the lowest index on a
  tie).

A router is constructed as ``cls()`` (:func:`build_router`) and its :meth:`Router.route` is
called once per request, in arrival order, on the fleet's dispatcher, which bounds each call
and checks its answer (:mod:`kv_offload.fleet.dispatch`): a router that fails to build,
raises, answers anything but an index into ``loads``, or does not answer in time stops the
run with a :class:`~kv_offload.errors.PluginError` naming it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from ..errors import ConfigError
from ..keys import OffloadKey
from ..plugins.construct import construct, named_instance
from ..plugins.registry import PluginRegistry

__all__ = [
    "ROUTER_ENTRY_POINT_GROUP",
    "LeastLoaded",
    "PrefixHash",
    "RoundRobin",
    "Router",
    "build_router",
    "router_registry",
]

ROUTER_ENTRY_POINT_GROUP = "kv_offload.routers"


class Router:
    """Picks an engine for each request of a fleet replay."""

    #: The name it was built by (:func:`build_router`), for errors that name it.
    plugin_name: str = ""

    def route(self, keys: Sequence[OffloadKey], loads: Sequence[int]) -> int:
        """The index into ``loads`` (one entry per live engine: its unfinished requests) of
        the engine that takes a request whose prefix blocks are ``keys``."""
        raise NotImplementedError


class RoundRobin(Router):
    """Live engines in turn."""

    def __init__(self) -> None:
        self._next = 0

    def route(self, keys: Sequence[OffloadKey], loads: Sequence[int]) -> int:
        index = self._next % len(loads)
        self._next = index + 1
        return index


class PrefixHash(Router):
    """By a stable hash of the first ``prefix_blocks`` blocks (CRC-32: the same engine in
    every run and process, unlike Python's salted ``hash``)."""

    def __init__(self, *, prefix_blocks: int = 2) -> None:
        if isinstance(prefix_blocks, bool) or not isinstance(prefix_blocks, int):
            raise ConfigError(f"router 'hash': prefix_blocks must be an int, got {prefix_blocks!r}")
        if prefix_blocks < 1:
            raise ConfigError(f"router 'hash': prefix_blocks must be >= 1, got {prefix_blocks}")
        self.prefix_blocks = prefix_blocks

    def route(self, keys: Sequence[OffloadKey], loads: Sequence[int]) -> int:
        return zlib.crc32(b"".join(keys[: self.prefix_blocks])) % len(loads)


class LeastLoaded(Router):
    """The live engine with the fewest unfinished requests."""

    def route(self, keys: Sequence[OffloadKey], loads: Sequence[int]) -> int:
        return min(range(len(loads)), key=loads.__getitem__)


router_registry: PluginRegistry[Router] = PluginRegistry(
    "router",
    ROUTER_ENTRY_POINT_GROUP,
    Router,
    "--router NAME",
    takes_module_path=False,  # the command line selects installed routers only
)


def build_router(name: str) -> Router:
    """The installed router called ``name``; one that fails to build is a
    :class:`~kv_offload.errors.PluginError` naming it."""
    cls = router_registry.resolve(name)
    router = construct("router", name, cls)
    return named_instance("router", name, router, Router, "kv_offload.fleet.Router")
