"""docs/architecture.md's "tiered request flow" is what the code does: one request through a
CPU tier and an fs tier (a promotion from disk, a store that evicts and cascades), with every
function entered recorded by ``sys.setprofile``; the modules of the project it enters, in
first-entry order, must be the list in the document. On a change the test fails and prints the
new list.

The tiered manager is the only one calling the CPU tier. How far a reader has to jump back
and forth on every thread is measured, not bounded here: ``benchmarks/module_walk.py``
counts the re-entries of one tiered request; which module may import which is stated as
import-linter contracts (pyproject.toml, ``nox -s lint``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from _tiers import block_bytes, key
from kv_offload import LookupResult, ReqContext, TieringOffloadingManager, build_manager

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BEGIN, END = "<!-- tiered-flow:begin -->", "<!-- tiered-flow:end -->"
BLOCK = 4096


def _rows(keys: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(block_bytes(k, BLOCK) for k in keys), np.uint8).reshape(-1, BLOCK)


def _store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, _rows(out.keys_to_store))
    m.complete_store(out.keys_to_store, ctx)


def traced_modules(
    tmp_path: Path, watch: Callable[[FrameType, str, Any], None] | None = None
) -> list[str]:
    config = {
        "num_blocks": 4,
        "block_size_bytes": BLOCK,
        "hooks": {"autoload": False},
        "tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs"), "capacity_blocks": 64}],
    }
    m = build_manager(config)
    assert isinstance(m, TieringOffloadingManager)
    warm = ReqContext("warm")
    m.on_new_request(warm)
    _store(m, [1, 2], warm)
    m.drain()
    _store(m, [3, 4, 5, 6], warm)  # evicts 1 and 2: now only on disk
    m.on_request_finished(warm)
    m.drain()

    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if watch is not None:
            watch(frame, event, arg)
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("kv_offload") and module not in seen:
            seen.append(module)

    ctx = ReqContext("one-request")
    sys.setprofile(profile)
    try:  # one request: lookups (a promotion from disk), load, store of the rest, finish
        m.on_new_request(ctx)
        answer = m.lookup(key(1), ctx)
        assert answer is LookupResult.PENDING  # promoted from disk
        while answer is LookupResult.PENDING:
            m.on_schedule_end()
            answer = m.lookup(key(1), ctx)
        assert answer is LookupResult.HIT
        spec = m.prepare_load([key(1)], ctx)
        m.kv_buffer.read_blocks(spec.block_ids)
        m.complete_load([key(1)], ctx)
        _store(m, [7], ctx)  # evicts one block, cascades 7
        m.on_request_finished(ctx)
        m.on_schedule_end()
    finally:
        sys.setprofile(None)
    m.shutdown()
    return seen


def documented() -> list[str]:
    text = DOC.read_text()
    match = re.search(re.escape(BEGIN) + r"\n```\n(.*?)```\n" + re.escape(END), text, re.S)
    assert match, f"{DOC} has no {BEGIN} ... {END} block"
    return [line.split()[1] for line in match.group(1).splitlines() if line.strip()]


def test_the_documented_tiered_request_flow_is_the_code(tmp_path: Path) -> None:
    actual = traced_modules(tmp_path)
    block = "\n".join(f"{i:2d}. {name}" for i, name in enumerate(actual, 1))
    assert actual == documented(), (
        f"docs/architecture.md's tiered request flow is out of date; replace the block "
        f"between {BEGIN} and {END} with:\n```\n{block}\n```"
    )


def test_only_the_tiered_manager_calls_the_cpu_tier(tmp_path: Path) -> None:
    """Every entry into the CPU tier's modules during a tiered request comes from the tiered
    manager (or from the CPU tier itself): the job table and the request scope decide, the
    manager acts. Entry-guard wrappers (compiled, no module name) and ``HookErrorLog.call``
    (it runs the call it is handed, collecting hook errors) are looked through."""
    callers: set[str] = set()

    def module(frame: FrameType) -> str:
        return str(frame.f_globals.get("__name__", ""))

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not module(frame).startswith("kv_offload.cpu."):
            return
        caller = frame.f_back
        while caller is not None and (
            module(caller).startswith(("kv_offload.cpu.", "kv_offload.plugins.dispatch"))
            or not module(caller)
        ):
            caller = caller.f_back
        if caller is not None and module(caller).startswith("kv_offload"):
            callers.add(module(caller))

    traced_modules(tmp_path, profile)
    assert callers == {"kv_offload.tiering.manager"}
