"""The command line: global options (before or after the command), the option groups that
several commands share, and one subparser per command bound to its function."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config.env import ALLOW_MODULE_PATH_ENV
from ..geometry import MODEL_PRESETS
from ..replay_clock import MAX_WALL_S
from ..trace import MOONCAKE_BLOCK_TOKENS
from .compare_cmd import cmd_compare
from .default_stack import DEFAULT_NAME
from .plugins_cmd import cmd_plugins
from .replay_cmd import cmd_replay
from .trace_cmd import add_trace_parser
from .validate_cmd import cmd_validate

__all__ = ["DESCRIPTION", "build_parser"]

DESCRIPTION = (
    "The ``kv-offload`` command: list plugins, validate a config, replay and compare traces, "
    "generate traces."
)
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _speed(text: str) -> float | None:
    """``--speed``: a positive finite multiple of real time, or ``max`` (untimed: None)."""
    if text.strip().lower() == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a number: {text!r} (a multiple of real time such as 30, or max)"
        ) from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive finite multiple of real time (or max), got {text}"
        )
    return value


def _option(text: str) -> tuple[str, object]:
    """``KEY=VALUE``; the value is a number when it reads as one."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parsed: object = value
    for kind in (int, float):
        try:
            parsed = kind(value)
            break
        except ValueError:
            continue
    return key.strip(), parsed


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _shared_options() -> tuple[argparse.ArgumentParser, ...]:
    """Parent parsers: the global options again (after the command), the progress bar
    switches, and the trace's block options."""
    # Global options work after the command too; SUPPRESS keeps them from resetting the above.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    common.add_argument("--no-module-path", action="store_true", default=argparse.SUPPRESS)
    common.add_argument(
        "--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS, help="as before the command"
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
    return common, progress, blocks


def _default_options() -> argparse.ArgumentParser:
    """Where the ``default`` config's fs tier lives, and whether its blocks outlive the run."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help=f"with the {DEFAULT_NAME!r} config: the fs tier's directory, created if missing "
        "(default: a new temporary directory)",
    )
    options.add_argument(
        "--keep",
        action="store_true",
        help=f"with the {DEFAULT_NAME!r} config: keep the fs tier's blocks at the end "
        "(default: deleted)",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kv-offload", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="WARNING",
        help="what kv-offload and plugin loggers print to stderr (hook plugins often log)",
    )
    parser.add_argument(
        "--no-module-path",
        action="store_true",
        help=f"forbid module_path imports whatever the config says ({ALLOW_MODULE_PATH_ENV}=0)",
    )
    common, progress, blocks = _shared_options()
    default = _default_options()
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
        "validate",
        parents=[common, default],
        help="validate a config and print the resolved stack",
    )
    p.add_argument("config", help=f"a TOML config, or {DEFAULT_NAME!r} for the embedded one")
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "replay",
        parents=[common, progress, blocks, default],
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
    clock = p.add_argument_group(
        "clock",
        "a timed replay keeps the trace's timestamps: requests arrive at their time, the "
        "engine steps in real time, tier jobs take the time they take",
    )
    clock.add_argument(
        "--speed",
        type=_speed,
        default=None,
        metavar="X",
        help="replay at X times the trace's real time (30: the bundled 59-minute trace in "
        "2 minutes); max (the default) replays as fast as the stack goes, untimed",
    )
    clock.add_argument(
        "--load-wait",
        default="timeout",
        metavar="NAME",
        help="how long a request waits for blocks a tier is still promoting: best_effort, "
        "timeout (default), wait_complete, or an installed kv_offload.load_wait plugin",
    )
    clock.add_argument(
        "--load-wait-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the load-wait policy (timeout: base_s=0.2, per_1k_tokens_s=0.02)",
    )
    geometry = p.add_argument_group(
        "geometry",
        "the bytes a block really is; a stack that does not fit this machine at that size is "
        "scaled (fewer blocks, same bytes per block) and the report says so",
    )
    geometry.add_argument(
        "--block-bytes",
        metavar="SIZE",
        help="bytes per block (256KiB, 2MiB, ...) instead of the config's block_size_bytes",
    )
    geometry.add_argument(
        "--model",
        metavar="NAME",
        help="bytes per block from a model's KV cache per token x the trace's block tokens: "
        f"{', '.join(MODEL_PRESETS)}",
    )
    geometry.add_argument(
        "--cpu-bytes",
        metavar="SIZE",
        help="size the CPU tier in bytes (16GiB) rather than the config's num_blocks",
    )
    clock.add_argument(
        "--engines",
        type=_positive_int,
        metavar="N",
        help="a fleet: N engine processes, each with its own CPU tier and private tiers, "
        "sharing the stack's shared tiers (Redis); needs --speed",
    )
    clock.add_argument(
        "--router",
        metavar="NAME",
        help="which engine takes each request: round-robin (default), hash (of the first two "
        "blocks: session affinity), least-loaded, or an installed kv_offload.routers plugin",
    )
    clock.add_argument(
        "--max-duration",
        type=_positive_float,
        default=MAX_WALL_S,
        metavar="SECONDS",
        help="refuse a timed replay planned to take longer than this wall time (default "
        f"{MAX_WALL_S:.0f}: {MAX_WALL_S / 3600:g} h); the plan is said on stderr before it starts",
    )
    clock.add_argument(
        "--step-ms",
        type=_positive_float,
        default=10.0,
        metavar="MS",
        help="the engine's step when nothing slows it (default 10 ms)",
    )
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

    add_trace_parser(sub, common, _positive_int, _positive_float)
    return parser
