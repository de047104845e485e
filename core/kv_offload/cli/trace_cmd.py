"""``kv-offload trace generate``: write a synthetic multi-turn trace in the Mooncake format
(:mod:`kv_offload.synthetic_trace`; the parameter sets in :mod:`kv_offload.trace_presets`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from ..errors import KVOffloadError
from ..synthetic_trace import generate, write_trace
from ..trace import MOONCAKE_BLOCK_TOKENS
from ..trace_presets import PRESETS, preset

__all__ = ["add_trace_parser", "cmd_trace_generate"]


def add_trace_parser(
    sub: Any, common: argparse.ArgumentParser, positive_int: Any, positive_float: Any
) -> None:
    """The ``trace`` command and its ``generate`` subcommand, on the command's subparsers."""
    trace = sub.add_parser("trace", parents=[common], help="make traces to replay")
    actions = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    presets = "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())
    p = actions.add_parser(
        "generate",
        parents=[common],
        help="write a seeded synthetic multi-turn trace (Mooncake JSONL)",
        description=f"Parameter sets: {presets}.",
    )
    p.add_argument("preset", choices=list(PRESETS), help="the parameter set")
    p.add_argument(
        "--conversations",
        type=positive_int,
        default=2000,
        help="how many conversations (default 2000)",
    )
    p.add_argument("--seed", type=int, default=0, help="the random seed (default 0)")
    p.add_argument(
        "--rate",
        type=positive_float,
        metavar="PER_S",
        help="new conversations per second (default: the parameter set's)",
    )
    p.add_argument(
        "--block-tokens",
        type=positive_int,
        default=MOONCAKE_BLOCK_TOKENS,
        help=f"tokens per hash_ids block (default {MOONCAKE_BLOCK_TOKENS}, Mooncake's)",
    )
    p.add_argument("-o", "--output", type=Path, help="the JSONL file to write (default: stdout)")
    p.set_defaults(func=cmd_trace_generate)


def cmd_trace_generate(args: argparse.Namespace) -> int:
    params = preset(args.preset)
    if args.seed < 0:
        raise KVOffloadError(f"--seed must be >= 0, got {args.seed}")
    if args.rate is not None:
        params = dataclasses.replace(params, conversations_per_s=args.rate)
    if args.output is not None and not args.output.parent.is_dir():
        raise KVOffloadError(f"cannot write {str(args.output)!r}: no such directory")
    requests = generate(
        params, conversations=args.conversations, seed=args.seed, block_tokens=args.block_tokens
    )
    if args.output is None:
        write_trace(requests, sys.stdout)
        return 0
    lines = write_trace(requests, args.output)
    blocks = sum(len(r.hash_ids) for r in requests)
    print(
        f"wrote {lines} requests ({args.conversations} {params.name} conversations, "
        f"{blocks} blocks, seed {args.seed}) to {args.output}",
        file=sys.stderr,
    )
    return 0
