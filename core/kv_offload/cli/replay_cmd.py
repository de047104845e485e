"""``kv-offload replay``: one config's stack over a trace, optionally serving metrics."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from importlib import metadata
from typing import Any

from ..config import StackConfig, resolve_config
from ..errors import ConfigError, KVOffloadError
from ..fleet import EngineSettings, build_router, finish_timeout, plan_fleet, run_fleet
from ..geometry import Geometry, apply_geometry, describe_scaling, parse_size
from ..load_wait import build_load_wait, checked_describe
from ..plugins import HOOK_ENTRY_POINT_GROUP
from ..replay_clock import MAX_WALL_S, ClockPlan
from .default_stack import stack_for
from .output import print_fleet_report, print_replay_report
from .running import Clock, Trace, progress_bar, run

__all__ = ["METRICS_PLUGIN", "cmd_replay"]

#: The router of ``--engines N`` without ``--router``: what a plain load balancer does.
DEFAULT_ROUTER = "round-robin"
#: A timed replay planned to take this long (wall seconds) or longer is announced on stderr.
ANNOUNCE_S = 2.0
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


def _clock(args: argparse.Namespace) -> Clock | None:
    """The timed replay's settings, or None for ``--speed max``; load-wait options without a
    timed replay are refused rather than ignored."""
    if args.speed is None:
        given = [o for o in ("load_wait_option",) if getattr(args, o)]
        if given or args.load_wait != "timeout":
            raise ConfigError(
                "--load-wait and --load-wait-option apply to a timed replay: add --speed X "
                "(e.g. --speed 30)"
            )
        if args.max_duration != MAX_WALL_S:
            raise ConfigError("--max-duration applies to a timed replay: add --speed X")
        return None
    policy = build_load_wait(args.load_wait, dict(args.load_wait_option))
    return Clock(args.speed, policy, args.step_ms / 1000.0, args.max_duration)


def _announce_clock(args: argparse.Namespace, trace: Trace) -> None:
    """Say on stderr how long a timed replay will take (from :data:`ANNOUNCE_S` on: a shorter
    one is over before the line would help), before it starts; refuse one longer
    than ``--max-duration`` (a gap of hours in the trace would otherwise sleep silently)."""
    if trace.timed is None:
        return
    plan = ClockPlan.of([r.arrival_s for r in trace.timed], args.speed)
    limit = args.max_duration
    after = plan.gap_after
    lines = trace.lines
    wall = plan.wall_seconds
    allow = f"--max-duration {math.ceil(wall)}" if wall < 1e9 else "a larger --max-duration"
    gap = (
        f"between lines {lines[after]} and {lines[after + 1]} of {args.trace}; timestamps "
        "are milliseconds"
    )
    refused = plan.refusal(
        limit,
        gap if after + 1 < len(lines) else "no gap",
        f"give --speed {plan.speed_for(limit):g} or more, replay it untimed with --speed max, "
        f"or allow it with {allow}",
    )
    if refused is not None:
        raise refused
    if plan.wall_seconds >= ANNOUNCE_S:
        print(f"timed replay: {plan.describe()}", file=sys.stderr)


def _check_fleet_options(args: argparse.Namespace) -> None:
    if args.engines is None:
        if args.router is not None:
            raise ConfigError("--router applies to a fleet: add --engines N (and --speed X)")
        return
    if args.speed is None:
        raise ConfigError(
            "a fleet replay is timed (its engines run side by side in real time): add "
            "--speed X, e.g. --speed 30"
        )
    if args.metrics_port is not None:
        raise ConfigError(
            "--metrics-port serves one process's metrics; a fleet has one per engine: "
            "drop --metrics-port, or configure the prometheus hook plugin per engine"
        )


def _run_fleet(args: argparse.Namespace, stack: StackConfig, trace: Trace) -> dict[str, Any]:
    name = args.router or DEFAULT_ROUTER
    router = build_router(name)
    plan = plan_fleet(stack, args.engines)
    note = plan.note()
    if note is not None and args.json:  # the text report says it too
        print(f"note: {note}", file=sys.stderr)
    settings = EngineSettings(
        load_wait=args.load_wait,
        load_wait_options=dict(args.load_wait_option),
        block_tokens=trace.tokens_per_block,
        step_s=args.step_ms / 1000.0,
        speed=args.speed,
    )
    assert trace.timed is not None  # --speed given: the trace was read with its clock
    with progress_bar(len(trace.timed), args.progress, "fleet", "req") as bar:
        report = run_fleet(
            plan,
            trace.timed,
            router=router,
            settings=settings,
            finish_timeout_s=finish_timeout(stack),
            progress=bar.update,
        )
    report["fleet"]["router"] = name
    report["config"] = stack.source
    report["policy"] = stack.policy
    report["num_blocks"] = stack.num_blocks
    report["load_wait"] = checked_describe(
        build_load_wait(args.load_wait, dict(args.load_wait_option))
    )
    return report


def _geometry(
    args: argparse.Namespace, stack: StackConfig, engines: int
) -> tuple[StackConfig, Geometry]:
    """The stack at ``--block-bytes`` / ``--model`` / ``--cpu-bytes``, scaled to fit (said
    on stderr at once: a scaled replay takes a while and the user should know why)."""
    stack, geometry = apply_geometry(
        stack,
        block_tokens=args.block_tokens,
        block_bytes=None
        if args.block_bytes is None
        else parse_size(args.block_bytes, "--block-bytes"),
        model=args.model,
        cpu_bytes=None if args.cpu_bytes is None else parse_size(args.cpu_bytes, "--cpu-bytes"),
        engines=engines,
    )
    for line in describe_scaling(geometry):
        print(line, file=sys.stderr)
    if stack.tiers or geometry.scaled or args.block_bytes or args.model or args.cpu_bytes:
        resolve_config(stack)  # the scaled stack is checked like a config (memory, tiers)
    return stack, geometry


def cmd_replay(args: argparse.Namespace) -> int:
    clock = _clock(args)
    _check_fleet_options(args)
    if args.engines is not None:
        with stack_for(args) as stack:
            if args.drain_timeout is not None:
                stack = replace(stack, drain_timeout_s=args.drain_timeout)
            stack, geometry = _geometry(args, stack, args.engines)
            trace = Trace(args)
            _announce_clock(args, trace)
            report = _run_fleet(args, stack, trace)
            report["geometry"] = geometry.as_dict()
        report.update(trace.describe())
        failed = report["failed_engines"] or report["incomplete"] is not None
        status = 0 if report["corrupted_blocks"] == 0 and not failed else 1
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_fleet_report(report, args.trace, trace.note())
        return status
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
        stack, geometry = _geometry(args, stack, 1)
        trace = Trace(args)
        _announce_clock(args, trace)
        report = run(stack, trace.requests, args.progress, "replay", clock=clock, trace=trace)
        report["geometry"] = geometry.as_dict()
    report.update(trace.describe())
    report.setdefault("incomplete", None)
    status = 0 if report["corrupted_blocks"] == 0 and report["incomplete"] is None else 1
    if args.json:
        print(json.dumps(report, indent=2))
        return status
    print_replay_report(report, args.trace, trace.note())
    return status
