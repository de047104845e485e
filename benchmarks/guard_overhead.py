"""What the managers' entry guard (kv_offload.concurrency) costs the replay, in one process.

The baseline is the same ``CPUOffloadingManager`` with the guard taken out: its module is
parsed, every inline guard (``entry = self._entry`` ... ``try: <body> finally: ...``) is
replaced by its body and every ``@entry_guarded`` line dropped, and the result is compiled next
to the real one. Both replay the bundled trace, interleaved, timed with the process's CPU time
(other work on a shared machine does not count); reported as throughput ratios, best and
median. Separate-process runs of ``benchmarks/replay.py`` against an older checkout measure
the same thing with more noise.

    python benchmarks/guard_overhead.py [--rounds 12] [--capacity 5000] [--policy lru]
"""

from __future__ import annotations

import argparse
import ast
import gc
import inspect
import statistics
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path

import kv_offload.cpu.manager as guarded_module
from kv_offload.replay import replay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import DEFAULT_TRACE, load


class _StripGuards(ast.NodeTransformer):
    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.decorator_list = [
            d
            for d in node.decorator_list
            if not (isinstance(d, ast.Name) and d.id == "entry_guarded")
        ]
        body = node.body
        start = 1 if body and isinstance(body[0], ast.Expr) else 0  # the docstring stays
        rest = body[start:]
        if (
            len(rest) == 3
            and isinstance(rest[0], ast.Assign)
            and ast.unparse(rest[0]) == "entry = self._entry"
            and isinstance(rest[2], ast.Try)
            and rest[2].finalbody
        ):
            node.body = body[:start] + rest[2].body
        return node


def unguarded_class() -> type:
    """``CPUOffloadingManager`` compiled from its own source without the entry guard."""
    tree = ast.parse(inspect.getsource(guarded_module))
    tree = ast.fix_missing_locations(_StripGuards().visit(tree))
    module = types.ModuleType("kv_offload.cpu._unguarded_manager")
    module.__package__ = "kv_offload.cpu"
    sys.modules[module.__name__] = module
    exec(compile(tree, "<unguarded kv_offload.cpu.manager>", "exec"), module.__dict__)
    cls: type = module.CPUOffloadingManager
    source = ast.unparse(tree)
    if "entry.pop()" in source or "@entry_guarded" in source:
        raise SystemExit("could not strip every guard; update _StripGuards")
    return cls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--capacity", type=int, default=5000)
    parser.add_argument("--policy", action="append")
    args = parser.parse_args(argv)
    requests = load(DEFAULT_TRACE)
    blocks = sum(len(keys) for _, keys in requests)
    stacks = {"unguarded": unguarded_class(), "guarded": guarded_module.CPUOffloadingManager}
    print(f"trace: {DEFAULT_TRACE.name}, {blocks} blocks, capacity {args.capacity}")
    for policy in args.policy or ["lru", "arc"]:
        times: dict[str, list[float]] = {name: [] for name in stacks}
        for _ in range(args.rounds):
            for name, cls in stacks.items():
                manager = cls(args.capacity, cache_policy=policy)
                gc.collect()
                start = time.process_time()
                replay(manager, requests)
                times[name].append(time.process_time() - start)
        base_best, base_median = min(times["unguarded"]), statistics.median(times["unguarded"])
        best, median = min(times["guarded"]), statistics.median(times["guarded"])
        print(
            f"{policy}: unguarded {blocks / base_best:,.0f} blocks/s (median "
            f"{blocks / base_median:,.0f}), guarded {blocks / best:,.0f} (median "
            f"{blocks / median:,.0f}); throughput ratio best {base_best / best:.3f}, "
            f"median {base_median / median:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
