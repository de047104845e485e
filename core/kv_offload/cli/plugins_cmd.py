"""``kv-offload plugins``: every installed plugin, from metadata (``--check`` imports them).

Every plugin kind the project resolves by name is listed: each kind's registry is in
:func:`registries`, and the hook plugins are read from their own group.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from importlib import metadata
from typing import Any

from ..admission import admission_registry
from ..fleet import router_registry
from ..load_wait import load_wait_registry
from ..plugins import BLOCK_ENV, HOOK_ENTRY_POINT_GROUP, PluginInfo
from ..plugins.env import env_names
from ..plugins.registry import PluginRegistry
from ..policies import CachePolicyFactory
from ..tiering import SecondaryTierFactory
from ..tiering.backpressure import detector_registry, drop_policy_registry
from .output import table

__all__ = ["LISTED_GROUPS", "cmd_plugins", "registries"]


def registries() -> dict[str, PluginRegistry[Any]]:
    """Every kind of plugin resolved by name, by the one word the listing calls it
    (``"backpressure detector"`` is ``backpressure-detector``: a table's column is one word)."""
    kinds: list[PluginRegistry[Any]] = [
        CachePolicyFactory.registry,
        SecondaryTierFactory.registry,
        admission_registry,
        detector_registry,
        drop_policy_registry,
        load_wait_registry,
        router_registry,
    ]
    return {registry.kind.replace(" ", "-"): registry for registry in kinds}


#: The entry-point groups the listing reads (a test checks every group the project's
#: distributions declare is one of them).
LISTED_GROUPS = (*(r.group for r in registries().values()), HOOK_ENTRY_POINT_GROUP)


def _blocked_names() -> set[str]:
    """Hook plugins ``KV_OFFLOAD_BLOCK_PLUGINS`` forbids importing (a listing honours it too),
    read as the managers read it (names split on commas and whitespace)."""
    return set(env_names(BLOCK_ENV))


def _hook_plugins(check: bool, blocked: set[str]) -> list[PluginInfo]:
    """Installed hook plugins from metadata; with ``check``, each unblocked one is imported."""
    eps = list(metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP))
    claims: dict[str, list[str]] = {}
    for ep in eps:
        dist = ep.dist
        claims.setdefault(ep.name, []).append(
            f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
        )
    infos = []
    for ep in eps:
        error = None
        if len(claims[ep.name]) > 1:
            error = "claimed by " + ", ".join(sorted(claims[ep.name]))
        elif check and ep.name not in blocked:
            try:
                ep.load()
            except Exception as exc:
                error = f"failed to import: {type(exc).__name__}: {exc}"
        infos.append(PluginInfo.from_entry_point(ep, "hook", error))
    return infos


def _all_plugins(check: bool) -> list[tuple[PluginInfo, str]]:
    """Every installed plugin with its status. Listing reads metadata only: importing runs a
    plugin's code, so it happens only with ``check`` and never for a blocked name."""
    blocked = _blocked_names()
    kinds = registries()
    infos = [
        replace(info, kind=kind) for kind, r in kinds.items() for info in r.available()
    ] + _hook_plugins(check, blocked)
    rows = []
    for info in infos:
        if info.kind == "hook" and info.name in blocked:
            rows.append((info, f"blocked ({BLOCK_ENV}); not imported"))
            continue
        if check and info.kind != "hook":
            info = kinds[info.kind].check(info)
        if info.error is not None:
            rows.append((info, f"BROKEN: {info.error}"))
        else:
            rows.append((info, "ok" if check else "installed"))
    return rows


def cmd_plugins(args: argparse.Namespace) -> int:
    rows = _all_plugins(check=args.check)
    if args.json:
        print(json.dumps([{**asdict(i), "status": status} for i, status in rows], indent=2))
        return 0
    cells = [
        [i.name, i.kind, i.distribution or "-", i.version or "-", i.source, status]
        for i, status in rows
    ]
    print(table(cells, ["name", "kind", "distribution", "version", "found via", "status"]))
    if not args.check:
        print("(read from metadata; --check imports each plugin to find broken ones)")
    return 0
