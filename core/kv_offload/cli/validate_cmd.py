"""``kv-offload validate``: check a config and print the resolved stack and its memory."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from ..config.env import module_path_forbidden_by_env
from ..config.memory import human, physical_memory_bytes
from ..config.resolve import estimate_memory
from ..plugins.env import module_path_forbidder
from ..policies import CachePolicyFactory
from ..tiering import SecondaryTierFactory
from .default_stack import describe_stack

__all__ = ["cmd_validate"]


def _origin(kind: str, name: str) -> dict[str, Any]:
    """Where a resolved plugin comes from: target, how it was found, distribution, version."""
    registry = CachePolicyFactory.registry if kind == "policy" else SecondaryTierFactory.registry
    info = next((i for i in registry.available() if i.name == name), None)
    if info is None:  # resolved through module_path
        return {"name": name, "kind": kind, "source": "module_path"}
    return {k: v for k, v in asdict(info).items() if k != "error"}


def cmd_validate(args: argparse.Namespace) -> int:
    stack = describe_stack(args)
    described = stack.describe()
    described["plugins"] = [_origin("policy", stack.policy)] + [
        _origin("tier", t.type) for t in stack.tiers
    ]
    selection = stack.hook_selection()
    described["hooks"]["will_load"] = selection.will_load()
    described["hooks"]["environment_overrides"] = list(selection.overrides)
    estimate = estimate_memory(stack)
    described["memory"] = estimate.as_dict()
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    cpu = described["cpu"]
    origins = {(o["kind"], o["name"]): o for o in described["plugins"]}

    def origin(kind: str, name: str) -> str:
        o = origins[(kind, name)]
        dist = f", {o['distribution']} {o['version']}" if o.get("distribution") else ""
        return f"{o.get('target', o['source'])}{dist}"

    print(f"{stack.source}: valid")
    size = f", {cpu['block_size_bytes']} bytes/block" if cpu["block_size_bytes"] else ""
    print(
        f"  CPU tier: {cpu['num_blocks']} blocks{size}, policy {cpu['policy']!r} "
        f"({origin('policy', stack.policy)})" + _admission_line(cpu)
    )
    for index, tier in enumerate(described["tiers"], start=1):
        extra = ", ".join(f"{k}={v!r}" for k, v in tier.items() if k != "type")
        print(
            f"  tier {index}: {tier['type']!r} ({origin('tier', tier['type'])})"
            + (f": {extra}" if extra else "")
        )
    hooks = described["hooks"]
    print(
        f"  hooks: autoload={selection.autoload}, enable={hooks['enable']}, "
        f"block={sorted(selection.block)}; loading: {', '.join(hooks['will_load']) or 'none'}"
        + "".join(
            f"\n  [hooks.{name}]: {table}" for name, table in hooks.get("settings", {}).items()
        )
    )
    for override in selection.overrides:
        print(f"  hooks: environment: {override}")
    physical = physical_memory_bytes()
    of = f" (this machine has {human(physical)})" if physical else ""
    print(f"  memory: {estimate.describe()}{of}")
    if module_path_forbidden_by_env():
        print(f"  module_path imports: forbidden ({module_path_forbidder()})")
    elif not stack.allow_module_path:
        print("  module_path imports: forbidden (allow_module_path = false)")
    return 0


def _admission_line(cpu: dict[str, Any]) -> str:
    """What decides which offered blocks the CPU tier stores, when something does."""
    if cpu.get("admission"):
        options = cpu.get("admission_options") or {}
        shown = f" {options}" if options else ""
        return f", admission {cpu['admission']!r}{shown}"
    if cpu.get("store_threshold", 0) >= 2:
        return f", store_threshold {cpu['store_threshold']} (admission 'store-threshold')"
    return ""
