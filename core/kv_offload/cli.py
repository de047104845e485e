"""The ``kv-offload`` command: list plugins, validate a config, replay and compare traces.

Every failure a user can cause (missing file, malformed trace line, bad config, broken
plugin) exits with status 2 and one line on stderr; ``--debug`` (before or after the command)
shows the traceback. An unexpected error exits with status 1, also in one line unless
``--debug``. ``--no-module-path`` (before or after the command) forbids every ``module_path``
import whatever the config says, as ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` does. Machine-readable
output (``--json``) goes to stdout; progress bars go to stderr (shown on a terminal;
``--progress`` forces them, ``--no-progress`` hides them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from .base import OffloadingManager
from .bounds import belady, gap_share, infinite
from .build import build_manager
from .config import DEFAULT_CONFIG, StackConfig, load_config, parse_config, resolve_config
from .config_env import ALLOW_MODULE_PATH_ENV, module_path_forbidden_by_env
from .config_memory import human, physical_memory_bytes
from .config_resolve import estimate_memory
from .errors import KVOffloadError
from .plugins import BLOCK_ENV, HOOK_ENTRY_POINT_GROUP, PluginInfo
from .policies import CachePolicyFactory
from .replay import ReplayResult, replay
from .tiering import SecondaryTierFactory, TieringOffloadingManager
from .trace import MOONCAKE_BLOCK_TOKENS, read_trace
from .types import ReqContext

__all__ = ["main"]

logger = logging.getLogger("kv_offload.cli")

EXIT_USAGE = 2
EXIT_INTERNAL = 1

#: The config argument that selects the embedded :data:`~kv_offload.config.DEFAULT_CONFIG`.
DEFAULT_NAME = "default"


def _load(config: str) -> StackConfig:
    """A TOML config path, or ``default`` for the embedded config."""
    if config == DEFAULT_NAME:  # a file of that name: pass ./default
        stack = parse_config(DEFAULT_CONFIG, source="<default config>")
        resolve_config(stack)
        return stack
    return load_config(config)


def _blocked_names() -> set[str]:
    """Hook plugins ``KV_OFFLOAD_BLOCK_PLUGINS`` forbids importing (a listing honours it too)."""
    return {n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip()}


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
    policies = CachePolicyFactory.registry
    tiers = SecondaryTierFactory.registry
    infos = policies.available() + tiers.available() + _hook_plugins(check, blocked)
    rows = []
    for info in infos:
        if info.kind == "hook" and info.name in blocked:
            rows.append((info, f"blocked ({BLOCK_ENV}); not imported"))
            continue
        if check and info.kind != "hook":
            info = (policies if info.kind == "policy" else tiers).check(info)
        if info.error is not None:
            rows.append((info, f"BROKEN: {info.error}"))
        else:
            rows.append((info, "ok" if check else "installed"))
    return rows


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def cmd_plugins(args: argparse.Namespace) -> int:
    rows = _all_plugins(check=args.check)
    if args.json:
        print(json.dumps([{**asdict(i), "status": status} for i, status in rows], indent=2))
        return 0
    table = [
        [i.name, i.kind, i.distribution or "-", i.version or "-", i.source, status]
        for i, status in rows
    ]
    print(_table(table, ["name", "kind", "distribution", "version", "found via", "status"]))
    if not args.check:
        print("(read from metadata; --check imports each plugin to find broken ones)")
    return 0


def _origin(kind: str, name: str) -> dict[str, Any]:
    """Where a resolved plugin comes from: target, how it was found, distribution, version."""
    registry = CachePolicyFactory.registry if kind == "policy" else SecondaryTierFactory.registry
    info = next((i for i in registry.available() if i.name == name), None)
    if info is None:  # resolved through module_path
        return {"name": name, "kind": kind, "source": "module_path"}
    return {k: v for k, v in asdict(info).items() if k != "error"}


def cmd_validate(args: argparse.Namespace) -> int:
    stack = _load(args.config)
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
        f"({origin('policy', stack.policy)})"
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
        print(f"  module_path imports: forbidden ({ALLOW_MODULE_PATH_ENV}=0)")
    elif not stack.allow_module_path:
        print("  module_path imports: forbidden (allow_module_path = false)")
    return 0


class _Trace:
    """A trace's requests as the replay takes them, and what was left out to get them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.block_tokens = None if args.keep_partial_blocks else args.block_tokens
        records = list(read_trace(args.trace, args.limit, block_tokens=self.block_tokens))
        self.requests = [(ReqContext(r.req_id), r.keys) for r in records]
        self.partial_blocks = sum(r.partial_blocks for r in records)

    def describe(self) -> dict[str, Any]:
        return {"block_tokens": self.block_tokens, "partial_blocks_left_out": self.partial_blocks}

    def note(self) -> str:
        if self.block_tokens is None:
            return "partial last blocks included (--keep-partial-blocks)"
        return (
            f"full {self.block_tokens}-token blocks only: {self.partial_blocks} partial last "
            f"blocks neither looked up nor stored (--keep-partial-blocks to include them)"
        )


def _progress(total: int, enabled: bool | None, label: str) -> Any:
    """A progress bar on stderr; ``enabled=None`` shows it only when stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="blk",
        unit_scale=True,
        desc=label,
        disable=None if enabled is None else not enabled,  # None: only on a terminal
        file=sys.stderr,
        leave=False,
    )


def _report(stack: StackConfig, manager: OffloadingManager, result: ReplayResult) -> dict[str, Any]:
    cpu = manager.cpu_stats()
    tiers = manager.tier_stats()
    direct_hits = result.hit_blocks - result.promoted_hit_blocks
    return {
        "config": stack.source,
        "policy": stack.policy,
        "num_blocks": stack.num_blocks,
        "requests": result.requests,
        "blocks": result.blocks,
        "hit_ratio": result.hit_ratio,
        "hit_ratio_by_tier": {
            "CPU": direct_hits / result.blocks if result.blocks else 0.0,
            **{t.name: t.promoted_blocks / result.blocks if result.blocks else 0.0 for t in tiers},
        },
        "evictions": cpu.evictions,
        "promotions": sum(t.promoted_blocks for t in tiers),
        "failed_promotions": sum(t.failed_promotions for t in tiers),
        "cascaded_blocks": sum(t.cascaded_blocks for t in tiers),
        "rejected_stores": result.rejected_stores,
        "bytes_moved": {
            "to_tiers": sum(t.bytes_written for t in tiers),
            "from_tiers": sum(t.bytes_read for t in tiers),
        },
        "verified_blocks": result.verified_blocks,
        "corrupted_blocks": result.corrupted_blocks,
        "seconds": result.seconds,
        "blocks_per_second": result.blocks_per_second,
    }


def _run(
    stack: StackConfig,
    requests: list[tuple[ReqContext, list[Any]]],
    show: bool | None,
    label: str,
) -> dict[str, Any]:
    manager = build_manager(stack)
    total = sum(len(keys) for _, keys in requests)
    try:
        with _progress(total, show, label) as bar:
            result = replay(
                manager, requests, data_plane=manager.kv_buffer is not None, progress=bar.update
            )
        report = _report(stack, manager, result)
    except BaseException:
        _shutdown_after_error(manager)
        raise
    try:
        manager.shutdown()
    except KVOffloadError as exc:
        if not (isinstance(manager, TieringOffloadingManager) and manager.has_pending_work()):
            raise
        # A tier never reported its jobs: the measurements stand, marked incomplete.
        report["incomplete"] = str(exc)
    return report


def _shutdown_after_error(manager: Any) -> None:
    """Shut down while an earlier error propagates: that first error is the one reported, so a
    second one from ``shutdown`` (often the same broken hook plugin again) is only logged."""
    try:
        manager.shutdown()
    except Exception as exc:
        logger.warning("also while shutting down after that error: %s: %s", type(exc).__name__, exc)


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
    stack = _load(args.config)
    if args.metrics_port is not None:
        stack = _with_metrics(stack, args.metrics_port, args.metrics_addr)
        print(
            f"serving metrics at http://{args.metrics_addr}:{args.metrics_port}/metrics "
            "during the replay",
            file=sys.stderr,
        )
    if args.drain_timeout is not None:
        stack = replace(stack, drain_timeout_s=args.drain_timeout)
    trace = _Trace(args)
    report = _run(stack, trace.requests, args.progress, "replay")
    report.update(trace.describe())
    report.setdefault("incomplete", None)
    status = 0 if report["corrupted_blocks"] == 0 and report["incomplete"] is None else 1
    if args.json:
        print(json.dumps(report, indent=2))
        return status
    if report["incomplete"] is not None:
        print(f"INCOMPLETE: {report['incomplete']}")
    print(
        f"config {report['config']}: policy {report['policy']!r}, {report['num_blocks']} CPU blocks"
    )
    print(f"trace {args.trace}: {report['requests']} requests, {report['blocks']} blocks")
    print(f"  {trace.note()}")
    print(f"hit ratio        {report['hit_ratio']:.4f}")
    for tier, ratio in report["hit_ratio_by_tier"].items():
        print(f"  from {tier:<10} {ratio:.4f}")
    print(f"evictions        {report['evictions']}")
    print(f"promotions       {report['promotions']} ({report['failed_promotions']} failed)")
    print(f"cascaded blocks  {report['cascaded_blocks']}")
    moved = report["bytes_moved"]
    print(f"bytes moved      {moved['to_tiers']:,} to tiers, {moved['from_tiers']:,} from tiers")
    if report["verified_blocks"]:
        print(
            f"bytes verified   {report['verified_blocks']} blocks read back, "
            f"{report['corrupted_blocks']} corrupted"
        )
    print(
        f"throughput       {report['blocks_per_second']:,.0f} blocks/s ({report['seconds']:.2f} s)"
    )
    return status


def cmd_compare(args: argparse.Namespace) -> int:
    policies = list(dict.fromkeys(args.policy or ["lru", "arc"]))
    if args.bounds and "lru" not in policies:
        policies.insert(0, "lru")  # the baseline of the gap shares
    capacities = list(dict.fromkeys(args.capacity or [5000, 20000]))
    if args.plot:  # fail before replaying, not after
        if not args.plot.parent.is_dir():
            raise KVOffloadError(f"cannot write plot {str(args.plot)!r}: no such directory")
        _pyplot()
    # Every stack is validated before the first replay starts.
    stacks = []
    for capacity in capacities:
        for policy in policies:
            stack = parse_config(
                {"num_blocks": capacity, "policy": policy},
                source=f"--policy {policy} --capacity {capacity}",
            )
            resolve_config(stack)
            stacks.append(stack)
    trace = _Trace(args)
    rows = [
        _run(stack, trace.requests, args.progress, f"{stack.policy}@{stack.num_blocks}")
        for stack in stacks
    ]
    for row in rows:
        row.update(trace.describe())
    if args.bounds:
        rows = _with_bounds(rows, [keys for _, keys in trace.requests], capacities)
    if args.plot:
        _plot(rows, args.plot, args.trace)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ["policy", "CPU blocks", "hit ratio", "evictions", "blocks/s"]
    if args.bounds:
        header.append("LRU-to-Belady gap closed")
    print(
        _table(
            [
                [
                    r["policy"],
                    str(r["num_blocks"]),
                    f"{r['hit_ratio']:.4f}",
                    "-" if r["evictions"] is None else str(r["evictions"]),
                    "-" if r["blocks_per_second"] is None else f"{r['blocks_per_second']:,.0f}",
                ]
                + ([_share(r.get("gap_share"))] if args.bounds else [])
                for r in rows
            ],
            header,
        )
    )
    print(f"trace {args.trace}: {trace.note()}")
    if args.bounds:
        print(
            "belady: offline eviction of the block whose next use comes last; infinite: a "
            "cache that never evicts (same access model)"
        )
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _with_bounds(
    rows: list[dict[str, Any]], requests: list[list[Any]], capacities: list[int]
) -> list[dict[str, Any]]:
    """The rows, grouped by capacity, each group followed by its Belady and infinite rows;
    every policy row gains its share of that capacity's LRU-to-Belady gap."""
    unbounded = infinite(requests)
    out: list[dict[str, Any]] = []
    for capacity in capacities:
        group = [r for r in rows if r["num_blocks"] == capacity]
        optimum = belady(requests, capacity)
        lru = next(r["hit_ratio"] for r in group if r["policy"] == "lru")
        for row in group:
            row["gap_share"] = gap_share(row["hit_ratio"], lru, optimum.hit_ratio)
        out += group
        for bound, evictions in ((optimum, optimum.evictions), (unbounded, None)):
            out.append(
                {
                    "policy": bound.name,
                    "num_blocks": capacity,
                    "bound": True,
                    "blocks": bound.blocks,
                    "hit_ratio": bound.hit_ratio,
                    "evictions": evictions,
                    "blocks_per_second": None,
                }
            )
    return out


def _share(share: float | None) -> str:
    return "" if share is None else f"{share:.1%}"


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (the optional ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KVOffloadError("--plot needs matplotlib: pip install 'kv-offload[plot]'") from None
    return plt


def _plot(rows: list[dict[str, Any]], path: Path, trace: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"belady": ("--", "black"), "infinite": (":", "grey")}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        points = sorted((r["num_blocks"], r["hit_ratio"]) for r in rows if r["policy"] == policy)
        bound = any(r.get("bound") for r in rows if r["policy"] == policy)
        if bound:  # reference lines, not policies
            style, color = styles.get(policy, ("--", "black"))
            ax.plot(*zip(*points), linestyle=style, color=color, label=f"{policy} (bound)")
        else:
            ax.plot(*zip(*points), marker="o", label=policy)
    ax.set_xlabel("CPU tier capacity (blocks)")
    ax.set_ylabel("prefix hit ratio")
    ax.set_title(f"hit ratio vs capacity: {trace.name}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as exc:
        raise KVOffloadError(f"cannot write plot {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kv-offload", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="WARNING",
        help="what kv-offload and plugin loggers print to stderr (hook plugins often log)",
    )
    parser.add_argument(
        "--no-module-path",
        action="store_true",
        help=f"forbid module_path imports whatever the config says ({ALLOW_MODULE_PATH_ENV}=0)",
    )
    # Global options work after the command too; SUPPRESS keeps them from resetting the above.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    common.add_argument("--no-module-path", action="store_true", default=argparse.SUPPRESS)
    common.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default=argparse.SUPPRESS,
        help="as before the command",
    )
    progress = argparse.ArgumentParser(add_help=False)
    shown = progress.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default=None,
        help="always show the progress bar on stderr (default: only on a terminal)",
    )
    shown.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, help="never show it"
    )
    blocks = argparse.ArgumentParser(add_help=False)
    blocks.add_argument(
        "--block-tokens",
        type=_positive_int,
        default=MOONCAKE_BLOCK_TOKENS,
        help="tokens per trace block; a request's partial last block (input_length not a "
        f"multiple of it) is neither looked up nor stored (default {MOONCAKE_BLOCK_TOKENS})",
    )
    blocks.add_argument(
        "--keep-partial-blocks",
        action="store_true",
        help="replay every block of hash_ids, the partial last one too (the old behaviour)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "plugins", parents=[common], help="list installed policy, tier and hook plugins"
    )
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.add_argument(
        "--check",
        action="store_true",
        help="import each plugin (never a blocked hook plugin) to find broken ones",
    )
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser(
        "validate", parents=[common], help="validate a config and print the resolved stack"
    )
    p.add_argument("config", help=f"a TOML config, or {DEFAULT_NAME!r} for the embedded one")
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "replay",
        parents=[common, progress, blocks],
        help="replay a Mooncake JSONL trace through a config's stack",
    )
    p.add_argument("config", help=f"a TOML config, or {DEFAULT_NAME!r} for the embedded one")
    p.add_argument("trace", type=Path)
    p.add_argument(
        "--drain-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="how long to wait for tier jobs at the end (default: the config's drain_timeout_s)",
    )
    p.add_argument("--limit", type=_positive_int, help="replay only the first N lines")
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.add_argument(
        "--metrics-port",
        type=_positive_int,
        metavar="PORT",
        help="serve Prometheus metrics on PORT during the replay (needs kv-offload-prometheus)",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port binds (default 127.0.0.1)",
    )
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "compare",
        parents=[common, progress, blocks],
        help="replay one trace across policies and capacities",
    )
    p.add_argument("trace", type=Path)
    p.add_argument("--policy", action="append", help="policy name (repeatable; lru, arc)")
    p.add_argument(
        "--capacity",
        type=_positive_int,
        action="append",
        help="CPU tier size in blocks (repeatable; 5000, 20000)",
    )
    p.add_argument("--limit", type=_positive_int, help="replay only the first N lines")
    p.add_argument("--plot", type=Path, help="write a PNG of hit ratio vs capacity")
    p.add_argument(
        "--bounds",
        action="store_true",
        help="add Belady (offline optimum) and infinite-cache rows per capacity, and each "
        "policy's share of the LRU-to-Belady gap (adds lru if missing)",
    )
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.no_module_path:  # the process's own setting, so every import check sees it
        os.environ[ALLOW_MODULE_PATH_ENV] = "0"
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except (KVOffloadError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # `kv-offload ... | head`: not an error
            _silence_stdout()
            return 0
        if args.debug:
            traceback.print_exc()
        message = str(exc) if isinstance(exc, KVOffloadError) else _os_error(exc)
        print(f"kv-offload {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, or a plugin's: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"kv-offload {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _os_error(exc: OSError) -> str:
    where = f" {str(exc.filename)!r}" if exc.filename is not None else ""
    return f"{exc.strerror or exc}{':' if where else ''}{where}"


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at devnull so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
