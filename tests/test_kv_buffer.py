"""CPUKVBuffer: rows of real bytes indexed by CPU slot id, in process memory, in POSIX shared
memory (attached from other processes) and in a file."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from kv_offload import ConfigError, CPUKVBuffer
from kv_offload.errors import InvalidArgumentError

NUM_BLOCKS = 16
BLOCK = 96


def rand_rows(n: int, seed: int = 0, block: int = BLOCK) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, block), dtype=np.uint8)


@pytest.fixture
def buf() -> CPUKVBuffer:
    return CPUKVBuffer(NUM_BLOCKS, BLOCK)


# -- roundtrips -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slots",
    [
        [0],
        [3, 4, 5, 6],  # a run: the slice fast path
        list(range(NUM_BLOCKS)),  # the whole buffer
        [15, 14],  # descending pair, not a run
        [7, 0, 12, 2, 9],  # scattered
        [1, 2, 4, 5],  # first and last 3 apart, but not consecutive
        [0, 2, 1],  # last - first == 1, not a run
        [5, 6, 8, 7],  # last - first == len - 1, not a run
    ],
    ids=lambda s: "-".join(map(str, s)),
)
def test_write_read_roundtrip(buf: CPUKVBuffer, slots: list[int]) -> None:
    rows = rand_rows(len(slots), seed=len(slots))
    buf.write_blocks(slots, rows)
    np.testing.assert_array_equal(buf.read_blocks(slots), rows)
    # Each row went to its own slot, and nothing else was touched.
    for row, slot in zip(rows, slots):
        np.testing.assert_array_equal(buf.array[slot], row)
    untouched = sorted(set(range(NUM_BLOCKS)) - set(slots))
    assert not buf.array[untouched].any()


def test_read_in_another_order_and_with_repeats(buf: CPUKVBuffer) -> None:
    rows = rand_rows(NUM_BLOCKS, seed=1)
    buf.write_blocks(np.arange(NUM_BLOCKS), rows)
    order = [9, 2, 2, 15, 0]
    np.testing.assert_array_equal(buf.read_blocks(order), rows[order])
    np.testing.assert_array_equal(buf.read_blocks(np.array(order, np.int32)), rows[order])


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "ndarray", "float32", "flat"])
def test_write_accepts_any_buffer(buf: CPUKVBuffer, kind: str) -> None:
    rows = rand_rows(3, seed=2)
    data = {
        "bytes": lambda: rows.tobytes(),
        "bytearray": lambda: bytearray(rows.tobytes()),
        "memoryview": lambda: memoryview(rows.tobytes()),
        "ndarray": lambda: rows,
        "float32": lambda: rows.view(np.float32),  # any dtype: its raw bytes are copied
        "flat": lambda: rows.reshape(-1),
    }[kind]()
    buf.write_blocks([10, 3, 6], data)
    np.testing.assert_array_equal(buf.read_blocks([10, 3, 6]), rows)


def test_read_into_out(buf: CPUKVBuffer) -> None:
    rows = rand_rows(4, seed=3)
    buf.write_blocks([1, 2, 3, 11], rows)
    for slots in ([1, 2, 3, 11], [11, 3, 2, 1]):
        out = np.zeros((4, BLOCK), np.uint8)
        assert buf.read_blocks(slots, out=out) is out
        np.testing.assert_array_equal(out, buf.array[slots])
    with pytest.raises(InvalidArgumentError, match="out must be uint8 of shape"):
        buf.read_blocks([1, 2], out=np.zeros((3, BLOCK), np.uint8))
    with pytest.raises(InvalidArgumentError, match="out must be uint8"):
        buf.read_blocks([1, 2], out=np.zeros((2, BLOCK), np.int16))


def test_read_returns_a_copy(buf: CPUKVBuffer) -> None:
    buf.write_blocks([4, 5], rand_rows(2, seed=4))
    before = buf.array.copy()
    for slots in ([4, 5], [5, 4]):
        got = buf.read_blocks(slots)
        got[:] = 0
    np.testing.assert_array_equal(buf.array, before)


def test_empty_batches(buf: CPUKVBuffer) -> None:
    buf.write_blocks([], b"")
    assert buf.read_blocks([]).shape == (0, BLOCK)
    assert not buf.array.any()


def test_view_is_what_tiers_share(buf: CPUKVBuffer) -> None:
    view = buf.view
    assert isinstance(view, memoryview) and not view.readonly
    assert view.shape == (NUM_BLOCKS, BLOCK) and view.nbytes == NUM_BLOCKS * BLOCK
    rows = rand_rows(2, seed=5)
    np.asarray(view)[[8, 1]] = rows  # a tier writing a promotion...
    np.testing.assert_array_equal(buf.read_blocks([8, 1]), rows)  # ...is what a worker reads
    buf.write_blocks([0], rows[:1])
    assert view.tobytes()[:BLOCK] == rows[0].tobytes()


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, NUM_BLOCKS, NUM_BLOCKS + 7, 2**40])
def test_out_of_range_slot(buf: CPUKVBuffer, bad: int) -> None:
    buf.write_blocks([0, 1], rand_rows(2, seed=6))
    before = buf.array.copy()
    with pytest.raises(InvalidArgumentError, match=rf"slot id {bad} is out of range \[0, 16\)"):
        buf.write_blocks([2, bad], rand_rows(2, seed=7))
    with pytest.raises(InvalidArgumentError, match="out of range"):
        buf.read_blocks([0, bad])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        buf.read_blocks([bad, 3, 4])
    np.testing.assert_array_equal(buf.array, before)  # the valid slot 2 was not written either


def test_wrong_data_size(buf: CPUKVBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match=f"got {BLOCK} bytes for 2 blocks of {BLOCK}"):
        buf.write_blocks([0, 1], bytes(BLOCK))
    with pytest.raises(InvalidArgumentError):
        buf.write_blocks([0], bytes(BLOCK + 1))
    assert not buf.array.any()


@pytest.mark.parametrize(
    "args",
    [(0, 8), (4, 0), (-1, 8), (4, True), (4.0, 8), ("4", 8)],
    ids=str,
)
def test_bad_geometry(args: tuple[object, object]) -> None:
    with pytest.raises(ConfigError, match="must be a positive int"):
        CPUKVBuffer(*args)  # type: ignore[arg-type]


def test_file_and_shm_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        CPUKVBuffer(2, 8, shared=True, path=tmp_path / "kv.bin")


# -- shared memory across processes -------------------------------------------------------------


def _child_check_and_write(name: str, expected: bytes, ready: multiprocessing.Queue) -> None:
    """A multiprocessing child: read rows 1 and 3, then write row 2 (reversed row 0)."""
    buf = CPUKVBuffer.attach(name, NUM_BLOCKS, BLOCK)
    try:
        ok = buf.read_blocks([3, 1]).tobytes() == expected
        buf.write_blocks([2], buf.read_blocks([0])[:, ::-1].copy())
    finally:
        buf.close()
    ready.put(ok)


def test_shared_buffer_multiprocessing_child() -> None:
    rows = rand_rows(NUM_BLOCKS, seed=8)
    with CPUKVBuffer(NUM_BLOCKS, BLOCK, shared=True) as buf:
        assert buf.shm_name
        buf.write_blocks(range(NUM_BLOCKS), rows)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(
            target=_child_check_and_write,
            args=(buf.shm_name, rows[[3, 1]].tobytes(), queue),
        )
        proc.start()
        ok = queue.get(timeout=60)
        proc.join(60)
        assert proc.exitcode == 0
        assert ok, "the child did not see the parent's bytes"
        np.testing.assert_array_equal(buf.read_blocks([2]), rows[[0], ::-1])


ATTACH_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from kv_offload import CPUKVBuffer

    name, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    buf = CPUKVBuffer.attach(name, n, size)
    seen = buf.read_blocks([5, 0, 9]).tobytes().hex()
    rows = np.arange(2 * size, dtype=np.uint8).reshape(2, size)
    buf.write_blocks([12, 4], rows)  # scattered write from the other side
    buf.close()  # an attached buffer never unlinks the segment
    print(json.dumps({"seen": seen}))
    """
)


def test_shared_buffer_attached_by_unrelated_process() -> None:
    """A separate interpreter (not a multiprocessing child) attaches, reads and writes; the
    segment outlives it. (Before the fix, Python < 3.13 registered the attached segment with
    the child's resource tracker, which unlinked it when the child exited.)"""
    rows = rand_rows(NUM_BLOCKS, seed=9)
    buf = CPUKVBuffer(NUM_BLOCKS, BLOCK, shared=True)
    name = buf.shm_name
    assert name is not None
    try:
        buf.write_blocks(range(NUM_BLOCKS), rows)
        # run() returns once every holder of the child's stderr is gone, the child's resource
        # tracker included, so any cleanup it would do has happened by then.
        proc = subprocess.run(
            [sys.executable, "-c", ATTACH_CHILD, name, str(NUM_BLOCKS), str(BLOCK)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "leaked shared_memory" not in proc.stderr, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])["seen"]
        assert bytes.fromhex(seen) == rows[[5, 0, 9]].tobytes()
        written = np.arange(2 * BLOCK, dtype=np.uint8).reshape(2, BLOCK)
        np.testing.assert_array_equal(buf.read_blocks([12, 4]), written)
        # The segment is still there: attachable by name after the child exited.
        with CPUKVBuffer.attach(name, NUM_BLOCKS, BLOCK) as again:
            np.testing.assert_array_equal(again.read_blocks([3]), rows[[3]])
    finally:
        buf.close()  # the creator unlinks: must not fail
    with pytest.raises(FileNotFoundError):
        CPUKVBuffer.attach(name, NUM_BLOCKS, BLOCK)


def test_attach_in_same_process_shares_bytes() -> None:
    with CPUKVBuffer(4, 32, shared=True) as owner:
        assert owner.shm_name is not None
        with CPUKVBuffer.attach(owner.shm_name, 4, 32) as other:
            other.write_blocks([1, 3], rand_rows(2, seed=10, block=32))
            np.testing.assert_array_equal(owner.read_blocks([1, 3]), rand_rows(2, 10, 32))
        # Closing the attached mapping leaves the owner's intact.
        np.testing.assert_array_equal(owner.read_blocks([1, 3]), rand_rows(2, 10, 32))


CLOSE_UNDER_VIEWS_CHILD = textwrap.dedent(
    """
    import gc, json, os, sys
    import numpy as np
    from kv_offload import CPUKVBuffer
    from kv_offload import buffer as kv_buffer

    buf = CPUKVBuffer(4, 4096, shared=True)
    name = buf.shm_name
    buf.write_blocks([1], np.full((1, 4096), 7, np.uint8))
    tier_rows = np.asarray(buf.view)  # what a tier keeps
    buf.close()
    alive = int(tier_rows[1].sum())  # used to read unmapped memory here (SIGSEGV)
    tier_rows[2] = 1  # and to write it
    unlinked = not os.path.exists("/dev/shm/" + name.lstrip("/"))
    lingering = len(kv_buffer._still_mapped)
    del tier_rows
    gc.collect()
    CPUKVBuffer(1, 8, shared=True).close()  # any later close unmaps what nobody views
    print(json.dumps({"alive": alive, "unlinked": unlinked, "lingering": lingering,
                      "after": len(kv_buffer._still_mapped)}))
    """
)


def test_close_shared_buffer_while_a_tier_views_it() -> None:
    """A tier's view of the rows stays valid after close(); the mapping goes once nobody
    views it. Run in a child: the bug this guards against was a segfault."""
    proc = subprocess.run(
        [sys.executable, "-c", CLOSE_UNDER_VIEWS_CHILD], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["alive"] == 7 * 4096
    assert result["lingering"] == 1 and result["after"] == 0
    if sys.platform.startswith("linux"):
        assert result["unlinked"]


# -- file-backed ----------------------------------------------------------------------------------


def test_file_backed_buffer_persists(tmp_path: Path) -> None:
    path = tmp_path / "kv.bin"
    rows = rand_rows(NUM_BLOCKS, seed=11)
    with CPUKVBuffer(NUM_BLOCKS, BLOCK, path=path) as buf:
        assert buf.path == path
        buf.write_blocks([6, 2, 13], rows[[6, 2, 13]])
        buf.write_blocks(range(3, 6), rows[3:6])
    # The bytes are in a real file, at row * block_size.
    raw = path.read_bytes()
    assert len(raw) == NUM_BLOCKS * BLOCK
    for slot in (2, 3, 4, 5, 6, 13):
        assert raw[slot * BLOCK : (slot + 1) * BLOCK] == rows[slot].tobytes()
    assert raw[:BLOCK] == bytes(BLOCK)  # never written: zeros
    # Reopening maps the same file, keeping its bytes.
    with CPUKVBuffer(NUM_BLOCKS, BLOCK, path=path, create=False) as again:
        np.testing.assert_array_equal(again.read_blocks([13, 2, 6]), rows[[13, 2, 6]])
        again.write_blocks([0], rows[[0]])
    with CPUKVBuffer(NUM_BLOCKS, BLOCK, path=path) as third:  # create=True keeps an existing file
        np.testing.assert_array_equal(third.read_blocks([0, 3]), rows[[0, 3]])


def test_file_backed_buffer_seen_by_other_process(tmp_path: Path) -> None:
    path = tmp_path / "kv.bin"
    rows = rand_rows(4, seed=12, block=64)
    with CPUKVBuffer(4, 64, path=path) as buf:
        buf.write_blocks([3, 0, 1, 2], rows)
        code = (
            "import sys; from kv_offload import CPUKVBuffer\n"
            "b = CPUKVBuffer(4, 64, path=sys.argv[1], create=False)\n"
            "print(b.read_blocks([0, 3]).tobytes().hex())\n"
            "b.write_blocks([1], bytes(range(64)))\n"
            "b.close()\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert bytes.fromhex(proc.stdout.strip()) == rows[[1, 0]].tobytes()
        assert buf.read_blocks([1]).tobytes() == bytes(range(64))  # same mapping, live


def test_file_backed_missing_file_without_create(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        CPUKVBuffer(2, 8, path=tmp_path / "absent.bin", create=False)
