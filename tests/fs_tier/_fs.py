"""Helpers of the fs-tier tests: stacks over real directories, stores and promotions with bytes
checked, and the files a tier left on disk."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from _tiers import block_bytes, expected_rows, key
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
)
from kv_offload.tiering import OffloadingConfig
from kv_offload_fs_tier import FileSystemTier

__all__ = [
    "BLOCK",
    "all_modes",
    "block_files",
    "build_fs_stack",
    "check_no_leaks",
    "evict_from_cpu",
    "key",
    "promote",
    "standalone_tier",
    "store",
    "temporary_files",
    "tmp_entries",
]

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 4096


def build_fs_stack(
    root: Path, *, cpu_blocks: int = 8, policy: str = "lru", block: int = BLOCK, **tier: Any
) -> TieringOffloadingManager:
    """CPU tier -> one fs tier, built from a config as users do (entry point ``fs``)."""
    tier.setdefault("capacity_blocks", 1000)
    manager = build_manager(
        {
            "num_blocks": cpu_blocks,
            "block_size_bytes": block,
            "policy": policy,
            "tiers": [{"type": "fs", "root_dir": str(root), **tier}],
        }
    )
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def standalone_tier(
    root: Path, cpu: CPUOffloadingManager | None = None, block: int = BLOCK, **args: Any
) -> FileSystemTier:
    if "capacity_bytes" not in args:
        args.setdefault("capacity_blocks", 1000)
    if cpu is None:
        cpu = CPUOffloadingManager(16, block_size_bytes=block)
    assert cpu.kv_buffer is not None
    return FileSystemTier(
        OffloadingConfig(cpu.kv_buffer.num_blocks, block), cpu.kv_buffer.view, "fs", root, **args
    )


def store(m: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
    """Store ``keys`` in the CPU tier (bytes from :func:`block_bytes`), cascade, drain."""
    out = m.prepare_store(list(keys), ctx)
    assert out is not None
    if out.keys_to_store:
        size = m.kv_buffer.block_size_bytes
        m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows(out.keys_to_store, size))
        m.complete_store(out.keys_to_store, ctx)
    m.drain()


def evict_from_cpu(m: TieringOffloadingManager, ctx: ReqContext, start: int = 10**6) -> None:
    """Fill the CPU tier with other blocks, so what it held must come back from a tier."""
    capacity = m.get_stats().cpu.capacity
    store(m, [key(start + i) for i in range(capacity)], ctx)


def promote(m: TieringOffloadingManager, k: OffloadKey, parent: ReqContext) -> LookupResult:
    """Look ``k`` up, in a request of its own, until it settles; on a HIT check its bytes.
    Returns HIT or MISS."""
    ctx = ReqContext(f"{parent.req_id}/{k.hex()}")
    m.on_new_request(ctx)
    try:
        return _promote(m, k, ctx)
    finally:
        m.on_request_finished(ctx)


def _promote(m: TieringOffloadingManager, k: OffloadKey, ctx: ReqContext) -> LookupResult:
    answer = m.lookup(k, ctx)
    for _ in range(200):
        if answer is not PENDING:
            break
        m.on_schedule_end()
        m.drain()
        answer = m.lookup(k, ctx)
    assert answer is not PENDING, f"{k!r} still PENDING"
    if answer is HIT:
        spec = m.prepare_load([k], ctx)
        got = m.kv_buffer.read_blocks(spec.block_ids)[0].tobytes()
        m.complete_load([k], ctx)
        assert got == block_bytes(k, m.kv_buffer.block_size_bytes), f"wrong bytes for {k!r}"
    return answer


def block_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "blocks").rglob("*") if p.is_file())


def temporary_files(root: Path) -> list[Path]:
    """What ``tmp/`` holds besides a live tier's empty spare files (created ahead of
    stores): blocks being written, recycled files, or what a killed writer left."""
    found = []
    for path in (root / "tmp").iterdir():
        try:
            empty_spare = path.name.startswith("spare-") and path.stat().st_size == 0
        except FileNotFoundError:  # a store took it meanwhile
            continue
        if not empty_spare:
            found.append(path)
    return sorted(found)


def tmp_entries(root: Path) -> list[Path]:
    """Everything in ``tmp/``: nothing once the tier is shut down."""
    return sorted((root / "tmp").iterdir())


def check_no_leaks(m: TieringOffloadingManager) -> None:
    stats = m.get_stats()
    assert stats.cpu.pinned_blocks == 0
    assert stats.cpu.pending_blocks == 0
    assert stats.jobs_in_flight == 0
    assert not m.has_pending_work()


def all_modes(path: Path) -> Iterable[tuple[Path, int]]:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            yield p, os.lstat(p).st_mode & 0o777
