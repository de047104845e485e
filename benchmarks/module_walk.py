"""How many of the project's modules one tiered request and one config walk through, and how
often control comes back to a module it had left: a reader following the code has to do the
same. Used for the before/after walks of the internals issues (compare two builds by running
this file with each one's Python).

* *request*: one request through a 4-block CPU tier (LRU) and an fs tier: a lookup promoted
  from disk, a load, a store that evicts and cascades, the finish, a step end.
* *config*: ``load_config`` of a TOML file with an fs tier and a hook table, then
  ``build_manager`` from it (and its ``shutdown``).
* *load*: that ``load_config`` alone (read, parse, resolve the plugins, estimate memory): the
  config package's one-way flow, without the stack it builds.

For each: the project's modules in the order first entered (``sys.setprofile`` call events of
frames whose module is ``kv_offload*``), the distinct module-to-module transitions, the
*returns*: distinct transitions from a module back into one entered before it (counted once
per pair, so polling loops do not change the figure; a driver module calling its own helper
after a call out counts too), and the *call-backs*: distinct (caller, callee) module pairs
where a module calls into one that is still running further down the stack, the cycles a
reader has to hold in their head (``config`` and ``config_resolve`` calling each other was
one).

    python benchmarks/module_walk.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

from kv_offload import LookupResult, ReqContext, build_manager, load_config, make_offload_key

BLOCK = 4096


def walk(action: Callable[[], Any]) -> dict[str, Any]:
    """Run ``action`` under a profiler: the project modules it enters, in first-entry order,
    and how control moved between them."""
    sequence: list[str] = []

    callbacks: set[tuple[str, str]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith("kv_offload"):
            return
        if not sequence or sequence[-1] != module:
            sequence.append(module)
        caller = frame.f_back
        caller_module = str(caller.f_globals.get("__name__", "")) if caller else ""
        if caller is None or caller_module == module or not caller_module.startswith("kv_offload"):
            return
        below = caller.f_back
        while below is not None:
            if below.f_globals.get("__name__") == module:
                callbacks.add((caller_module, module))
                break
            below = below.f_back

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    first: list[str] = []
    for module in sequence:
        if module not in first:
            first.append(module)
    order = {module: i for i, module in enumerate(first)}
    edges = set(pairwise(sequence))
    # A return: control passes from a module back into one entered before it (a reader
    # following the calls goes back to a file already open). Counted once per distinct pair,
    # so polling loops and repeated calls do not change the figure.
    back = sorted((a, b) for a, b in edges if order[b] < order[a])
    return {
        "modules": first,
        "transitions": len(edges),
        "returns": len(back),
        "return_pairs": [f"{a} -> {b}" for a, b in back],
        "callbacks": len(callbacks),
        "callback_pairs": [f"{a} -> {b}" for a, b in sorted(callbacks)],
    }


def _rows(keys: list[bytes]) -> bytes:
    return b"".join(k.ljust(BLOCK, b"\x5a")[:BLOCK] for k in keys)


def request_walk(root: Path) -> dict[str, Any]:
    config = {
        "num_blocks": 4,
        "block_size_bytes": BLOCK,
        "hooks": {"autoload": False},
        "tiers": [{"type": "fs", "root_dir": str(root / "fs"), "capacity_blocks": 64}],
    }
    m: Any = build_manager(config)

    def store(ids: list[int], ctx: ReqContext) -> None:
        keys = [make_offload_key(i) for i in ids]
        out = m.prepare_store(keys, ctx)
        m.kv_buffer.write_blocks(out.store_spec.block_ids, _rows(out.keys_to_store))
        m.complete_store(out.keys_to_store, ctx)

    warm = ReqContext("warm")
    m.on_new_request(warm)
    store([1, 2], warm)
    m.drain()
    store([3, 4, 5, 6], warm)  # evicts 1 and 2: now only on disk
    m.on_request_finished(warm)
    m.drain()

    def one_request() -> None:
        ctx = ReqContext("one-request")
        m.on_new_request(ctx)
        k = make_offload_key(1)
        answer = m.lookup(k, ctx)
        while answer is LookupResult.PENDING:
            m.on_schedule_end()
            answer = m.lookup(k, ctx)
        spec = m.prepare_load([k], ctx)
        m.kv_buffer.read_blocks(spec.block_ids)
        m.complete_load([k], ctx)
        store([7], ctx)
        m.on_request_finished(ctx)
        m.on_schedule_end()

    try:
        return walk(one_request)
    finally:
        m.shutdown()


CONFIG = """
num_blocks = 16
block_size_bytes = 4096
policy = "lru"

[hooks]
autoload = false

[[tiers]]
type = "fs"
root_dir = "{root}"
capacity_blocks = 64
"""


def config_walk(root: Path, build: bool = True) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "stack.toml"
    path.write_text(CONFIG.format(root=root / "cfg-fs"))

    def load_and_build() -> None:
        config = load_config(path)
        if build:
            build_manager(config).shutdown()

    return walk(load_and_build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the walks as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        walks = {
            "request": request_walk(Path(tmp) / "request"),
            "config": config_walk(Path(tmp) / "config"),
            "load": config_walk(Path(tmp) / "load", build=False),
        }
    if args.json:
        print(json.dumps(walks, indent=2))
        return 0
    for name, result in walks.items():
        print(
            f"{name}: {len(result['modules'])} modules, {result['transitions']} distinct "
            f"transitions, {result['returns']} returns to a module entered before, "
            f"{result['callbacks']} call-backs into a module still running"
        )
        for i, module in enumerate(result["modules"], 1):
            print(f"  {i:2d}. {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
