"""``kv-offload replay``: one config's stack over a trace, optionally serving metrics."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from importlib import metadata

from ..config import StackConfig, resolve_config
from ..errors import KVOffloadError
from ..plugins import HOOK_ENTRY_POINT_GROUP
from .default_stack import stack_for
from .output import print_replay_report
from .running import Trace, run

__all__ = ["METRICS_PLUGIN", "cmd_replay"]

#: The hook plugin ``--metrics-port`` configures, and the distribution that provides it.
METRICS_PLUGIN = ("prometheus", "kv-offload-prometheus")


def _with_metrics(stack: StackConfig, port: int, addr: str) -> StackConfig:
    """``stack`` with the Prometheus exporter loaded and serving on ``addr:port``."""
    name, dist = METRICS_PLUGIN
    if name not in {ep.name for ep in metadata.entry_points(group=HOOK_ENTRY_POINT_GROUP)}:
        raise KVOffloadError(f"--metrics-port needs the {name!r} hook plugin: pip install {dist}")
    hooks = stack.hooks
    if name in hooks.block:
        raise KVOffloadError(
            f"--metrics-port: {stack.source} blocks the {name!r} hook plugin ([hooks] block)"
        )
    table = {**hooks.settings.get(name, {}), "port": port, "addr": addr}
    enable = hooks.enable if not hooks.enable or name in hooks.enable else (*hooks.enable, name)
    hooks = replace(
        hooks,
        autoload=True,
        enable=enable if hooks.autoload else (name,),  # autoload = false: only the exporter
        settings={**hooks.settings, name: table},
    )
    stack = replace(stack, hooks=hooks)
    resolve_config(stack)
    return stack


def cmd_replay(args: argparse.Namespace) -> int:
    with stack_for(args) as stack:
        if args.metrics_port is not None:
            stack = _with_metrics(stack, args.metrics_port, args.metrics_addr)
            print(
                f"serving metrics at http://{args.metrics_addr}:{args.metrics_port}/metrics "
                "during the replay",
                file=sys.stderr,
            )
        if args.drain_timeout is not None:
            stack = replace(stack, drain_timeout_s=args.drain_timeout)
        trace = Trace(args)
        report = run(stack, trace.requests, args.progress, "replay")
    report.update(trace.describe())
    report.setdefault("incomplete", None)
    status = 0 if report["corrupted_blocks"] == 0 and report["incomplete"] is None else 1
    if args.json:
        print(json.dumps(report, indent=2))
        return status
    print_replay_report(report, args.trace, trace.note())
    return status
