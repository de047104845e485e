"""A process storing blocks is killed with SIGKILL at a random moment; the next process finds
every block the writer reported stored, byte-identical, serves no torn block and leaves no
temporary file behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _fs import HIT, build_fs_stack, check_no_leaks, promote, temporary_files
from _tiers import key
from kv_offload import ReqContext
from kv_offload_fs_tier import FileSystemTier

BLOCK = 64 * 1024

WRITER = textwrap.dedent(
    """
    import sys
    from _fs import build_fs_stack, store
    from _tiers import key
    from kv_offload import ReqContext

    root, fsync, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = build_fs_stack(root, cpu_blocks=16, block=block, fsync=fsync, capacity_blocks=400)
    ctx = ReqContext("writer")
    print("ready", flush=True)
    start = 0
    while True:  # until killed
        keys = [key(i) for i in range(start, start + 8)]
        store(m, keys, ctx)  # returns once the tier reported the cascade
        assert m.get_stats().tiers[0].failed_cascades == 0
        print(" ".join(str(i) for i in range(start, start + 8)), flush=True)
        start += 8
    """
)


def run_and_kill(root: Path, seed: int, fsync: str) -> list[int]:
    """Start the writer, SIGKILL it after a random delay; the block ids it reported stored."""
    here = Path(__file__).parent
    code = f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n{WRITER}"
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(root), fsync, str(BLOCK)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()  # type: ignore[union-attr]
        first = child.stdout.readline()  # the first batch is in: the kill lands mid-stream
        time.sleep(random.Random(seed).uniform(0.0, 0.5))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=30)
        out = first + out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, err
    return [int(i) for line in out.splitlines() for i in line.split()]


@pytest.mark.parametrize(
    ("seed", "fsync"), [(1, "never"), (2, "never"), (3, "never"), (4, "always"), (5, "never")]
)
def test_sigkill_mid_write_never_serves_a_torn_block(tmp_path: Path, seed: int, fsync: str) -> None:
    root = tmp_path / "fs"
    reported = run_and_kill(root, seed, fsync)
    assert len(reported) >= 8, "the writer was killed before it stored anything"
    m = build_fs_stack(root, cpu_blocks=16, block=BLOCK, capacity_blocks=400)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    assert not temporary_files(root)  # what the killed writer left in tmp/ is gone
    ctx = ReqContext("reader")
    # The tier holds 400 blocks, and the batch of 8 the writer was storing when it was killed
    # made its room first: the 392 last reported blocks are certainly still there.
    present = set(reported[-(400 - 8) :])
    for i in sorted(present):
        assert promote(m, key(i), ctx) is HIT, i  # byte-identical (promote checks)
    # Blocks the writer finished but was killed before reporting are whole too.
    extra = [k for k in tier.stored_keys() if int.from_bytes(k[:8], "big") not in present]
    for k in extra:
        assert promote(m, k, ctx) is HIT
    stats = tier.get_stats()
    assert stats.dropped_blocks == 0 and stats.failed_load_jobs == 0
    check_no_leaks(m)
    m.shutdown()
    assert not any(p.name.endswith(".tmp") for p in root.rglob("*"))
    assert os.listdir(root / "tmp") == []
