"""fs tier throughput against plain file I/O of the same bytes, in the same directory and run.

One batch of ``--blocks`` blocks of ``--block-kib`` KiB (default 256 x 256 KiB = 64 MiB):

* cold store: one ``submit_store`` job of the batch from the CPU buffer into an empty tier,
  polled to completion with ``get_finished`` (a file per block: header, checksum, temporary
  name, rename), against a plain sequential ``write`` of the same rows into one new file
  (``fsync`` at the end when the tier runs with ``fsync = "always"``: the same durability
  when each reports done). The tier is timed once idle, as a while after its start: its I/O
  threads have created empty files ahead of stores (up to ``PRECREATE_FILES``, 256), which
  the stores fill. ``cold_unprepared`` is the same store into a tier that creates none
  (every block creates its file: a sustained stream longer than the pool);
* store: the same into the now full tier (the steady state of a cache: each store evicts,
  and the evicted file is recycled);
* load: one ``submit_load`` job of the batch into other CPU rows (read, header check,
  checksum), against one ``preadv`` per row of the raw file straight into the same rows (one
  thread, one open file, no checksum). Both read what was just written, so both come from
  the page cache.

With ``--vllm-src DIR`` (an unpacked vLLM 0.34 wheel; ``nox -s bench`` downloads one) vLLM's
own fs tier (``vllm/v1/kv_offload/tiering/fs/``: :class:`VllmFsTier`) runs in the same rounds:
its store of the batch into an empty directory (a new file per block) beside the tier's cold
store, its load of the batch into the same rows beside the tier's load (the two loads' order
alternating between rounds), with as many threads, buffered, no checksum; the report gives
the tier / vLLM ratio of each round (best and median).

Each round runs raw and tier side by side for each operation, interleaved so both sides see
the same machine; fresh tier directories and raw files per round (built outside the timing).
The report gives GB/s (best and median of the rounds) and the tier/raw ratio of each round
(best and median), for each ``fsync`` mode; the target is >= 0.8x raw with 4 I/O threads.
Loaded rows are checked to be byte-identical to the stored ones.

Then the restart: ``--restart-blocks`` blocks (default 100,000, of ``--restart-block-kib``
KiB: the start scans names and sizes, so the block size does not matter to it) are stored,
the tier shut down and constructed again; the report gives the construction time and the
index memory per block (tracemalloc, what the constructed tier retains). Writing and deleting
100,000 files takes minutes on a slow disk; ``--restart-blocks 0`` skips it.

``--auth`` adds, in the same rounds, a tier with authenticated blocks (``auth_key_env``, a
random secret, keyed BLAKE3: a MAC computed on store and verified on load, instead of the
checksum) doing the same cold store, store and load, and reports authenticated / plain per
round (best and median; target >= 0.85x).

    python benchmarks/fs_tier.py [--blocks 256] [--block-kib 256] [--threads 4]
        [--rounds 7] [--fsync never|always|both] [--dir DIR] [--restart-blocks 100000]
        [--restart-block-kib 4] [--auth] [--vllm-src DIR] [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from kv_offload import CPUKVBuffer, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, OffloadingConfig
from kv_offload_fs_tier import FileSystemTier

TARGET = 0.8
AUTH_TARGET = 0.85
AUTH_ENV = "KVO_BENCH_AUTH_SECRET"
AUTH_OPS = ("cold_store", "store", "load")
#: vLLM's fs tier's operations, and the tier's operation each is set against: its store
#: writes a new file per block into a tier with room (ours fills files made while idle)
VLLM_OPS = {"store": "cold_store", "load": "load"}
CTX = ReqContext("bench")


class UnpreparedTier(FileSystemTier):
    """The fs tier without files created ahead of stores: every cold store creates its file."""

    precreate_files = 0


def make_tier(
    buffer: CPUKVBuffer, root: Path, capacity: int, cls: type[FileSystemTier] = FileSystemTier,
    **args: Any,
) -> FileSystemTier:  # fmt: skip
    config = OffloadingConfig(buffer.num_blocks, buffer.block_size_bytes)
    return cls(config, buffer.view, "fs", root, capacity_blocks=capacity, **args)


def settle(tier: FileSystemTier, timeout: float = 60.0) -> None:
    """Wait until the tier's I/O threads are idle, as a while after its start: the files it
    creates ahead of stores are there (and their creation is outside every timing)."""
    want = min(tier.precreate_files, tier.get_stats().capacity)
    deadline = time.monotonic() + timeout
    while tier.get_stats().spare_files < want and time.monotonic() < deadline:
        time.sleep(0.005)


def run_job(tier: FileSystemTier, job: JobMetadata) -> None:
    if job.direction is JobDirection.STORE:
        tier.submit_store(job)
    else:
        tier.submit_load(job)
    while True:
        done = tier.get_finished()
        if done:
            if not all(r.success for r in done):
                raise SystemExit(f"fs tier job failed: {done}")
            return
        time.sleep(0.00005)


def raw_store(path: Path, rows: np.ndarray, durable: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for row in rows:
            os.write(fd, row.data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def raw_load(path: Path, rows: np.ndarray) -> None:
    """One ``preadv`` per row, straight into it, from one open file (no checksum)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = rows.shape[1]
        for i, row in enumerate(rows):
            os.preadv(fd, [row.data], i * size)
    finally:
        os.close(fd)


class VllmFsTier:
    """vLLM 0.34's fs tier (``vllm/v1/kv_offload/tiering/fs/``), run as its
    ``FileSystemTierManager.submit_store`` / ``submit_load`` run it: each job one task of
    ``io.batch_store_block`` / ``io.batch_load_block`` (vLLM's own functions, from the wheel's
    sources) on its ``thread_pool.DualQueueThreadPool``, files named by ``FileMapper``'s
    layout (``<hhh>/<hh>_g<group>/<hash>.bin``). A batch is ``threads`` jobs, one per thread:
    one job is one task in vLLM. Buffered I/O (``use_o_direct=False``: the tier's probe picks
    ``O_DIRECT`` where the filesystem takes it; both sides here read the page cache), no
    checksum (vLLM has none). The manager itself is not built (its ``FileMapper`` imports
    torch): what it does for a job before the pool, the paths and the byte offsets, is done
    here the same way, inside the timing."""

    def __init__(self, root: Path, view: memoryview, block_size: int, threads: int) -> None:
        from vllm.v1.kv_offload import base
        from vllm.v1.kv_offload.tiering.fs import io, thread_pool

        self._io = io
        self._base = base
        self.root = root
        self.view = view
        self.block_size = block_size
        self.threads = threads
        self.pool = thread_pool.DualQueueThreadPool(
            threads - threads // 2, threads // 2, thread_name_prefix="vllm-fs-bench"
        )
        self._jobs = 0

    def path(self, key: bytes) -> str:
        digest = self._base.get_offload_block_hash(key).hex()
        group = self._base.get_offload_group_idx(key)
        return f"{self.root}/{digest[:3]}/{digest[3:5]}_g{group}/{digest}.bin"

    def run(self, direction: JobDirection, keys: list[bytes], rows: np.ndarray) -> None:
        """The batch as ``threads`` jobs, each submitted as ``submit_store``/``submit_load``
        submit one (its paths and byte offsets made at submit time, as they make them),
        polled to completion like the tier's."""
        store = direction is JobDirection.STORE
        batch = self._io.batch_store_block if store else self._io.batch_load_block
        enqueue = self.pool.enqueue_store if store else self.pool.enqueue_load
        per = -(-len(keys) // self.threads)
        ids = set()
        for i in range(0, len(keys), per):
            paths = [self.path(k) for k in keys[i : i + per]]
            offsets = [int(r) * self.block_size for r in rows[i : i + per]]
            self._jobs += 1
            ids.add(self._jobs)
            enqueue(
                self._jobs, 1, [partial(batch, paths, self.view, offsets, self.block_size, False)]
            )
        while ids:
            for job_id, success, _ in self.pool.get_finished():
                if not success:
                    raise SystemExit(f"vLLM's fs tier failed job {job_id}")
                ids.discard(job_id)
            time.sleep(0.00005)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)


def load_vllm(src: Path) -> None:
    """Make ``import vllm.*`` load the unpacked vLLM wheel at ``src`` as the nox ``vllm``
    session's smoke route does (tests/vllm_bridge/_vllm_smoke.py: the wheel's own files, no
    package ``__init__`` run, torch and vLLM's logger stubbed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm_bridge"))
    from _vllm_smoke import install

    install(src)


#: CPU seconds (this process, all threads) of the last ``timed`` call, by name when given
CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], None], cpu_name: str | None = None) -> float:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    if cpu_name is not None:
        CPU.setdefault(cpu_name, []).append(time.process_time() - start_cpu)
    return time.perf_counter() - start


OPS = ("cold_store", "cold_unprepared", "store", "load")


def run_signed(
    signed: FileSystemTier, jobs: list[JobMetadata], dst: np.ndarray, src: np.ndarray, fsync: str
) -> dict[str, float]:
    """A round's jobs through the authenticated tier (before the plain tier's in odd rounds,
    after them in even ones, so neither always runs on a warmer machine); then it stops, so
    that its idle threads do not run during the other timings."""
    measured = {
        "auth_cold_store": timed(partial(run_job, signed, jobs[0]), f"{fsync} auth_cold_store"),
        "auth_store": timed(partial(run_job, signed, jobs[1]), f"{fsync} auth_store"),
    }
    dst[:] = 0
    measured["auth_load"] = timed(partial(run_job, signed, jobs[2]), f"{fsync} auth_load")
    if not np.array_equal(dst, src) or signed.get_stats().auth_failures:
        raise SystemExit("the authenticated fs tier loaded different bytes")
    signed.shutdown()
    shutil.rmtree(signed.root_dir)
    return measured


def throughput(
    base: Path,
    blocks: int,
    block_size: int,
    threads: int,
    rounds: int,
    fsync: str,
    auth: bool = False,
    vllm: bool = False,
) -> dict[str, Any]:
    buffer = CPUKVBuffer(2 * blocks, block_size)
    rows = buffer.array
    rows[:blocks] = np.random.default_rng(0).integers(0, 256, (blocks, block_size), np.uint8)
    src, dst = rows[:blocks], rows[blocks:]
    src_ids = np.arange(blocks, dtype=np.int64)
    dst_ids = src_ids + blocks
    durable = fsync == "always"
    times: dict[str, list[float]] = {f"{side}{op}": [] for op in OPS for side in ("", "raw_")}
    times.update({f"auth_{op}": [] for op in AUTH_OPS})
    times.update({f"vllm_{op}": [] for op in VLLM_OPS})
    if auth:
        os.environ[AUTH_ENV] = os.urandom(32).hex()
    for r in range(rounds + 1):  # round 0 warms up, untimed
        root, raw = base / f"tier-{fsync}-{r}", base / f"raw-{fsync}-{r}"
        raw2 = base / f"raw2-{fsync}-{r}"
        tier = make_tier(buffer, root, blocks, fsync=fsync, io_threads=threads)
        bare = make_tier(
            buffer, base / f"bare-{fsync}-{r}", blocks, UnpreparedTier, fsync=fsync,
            io_threads=threads,
        )  # fmt: skip
        signed = None
        if auth:
            signed = make_tier(
                buffer, base / f"auth-{fsync}-{r}", blocks, fsync=fsync, io_threads=threads,
                auth_key_env=AUTH_ENV,
            )  # fmt: skip
            settle(signed)
        settle(tier)
        first = [make_offload_key(2 * r * blocks + i) for i in range(blocks)]
        second = [make_offload_key((2 * r + 1) * blocks + i) for i in range(blocks)]
        jobs = [
            JobMetadata(3 * r, first, src_ids, JobDirection.STORE, CTX),
            # the tier is full: each block evicts one, whose file is recycled
            JobMetadata(3 * r + 1, second, src_ids, JobDirection.STORE, CTX),
            JobMetadata(3 * r + 2, second, dst_ids, JobDirection.LOAD, CTX),
        ]
        measured: dict[str, float] = {}
        vtier = None
        if vllm:
            vtier = VllmFsTier(base / f"vllm-{fsync}-{r}", buffer.view, block_size, threads)

        if signed is not None and r % 2:
            measured |= run_signed(signed, jobs, dst, src, fsync)
        measured |= {
            "raw_cold_store": timed(partial(raw_store, raw, src, durable)),  # a new file
            "cold_store": timed(
                partial(run_job, tier, jobs[0]), f"{fsync} cold_store"
            ),  # files made while idle
            "raw_cold_unprepared": timed(partial(raw_store, raw2, src, durable)),  # a new file
            "cold_unprepared": timed(partial(run_job, bare, jobs[0])),  # a new file per block
            "raw_store": timed(partial(raw_store, raw, src, durable)),  # the file again
            "store": timed(partial(run_job, tier, jobs[1]), f"{fsync} store"),
        }
        if vtier is not None:  # into an empty directory: a new file per block, as vLLM does
            measured["vllm_store"] = timed(partial(vtier.run, JobDirection.STORE, second, src_ids))
        dst[:] = 0
        measured["raw_load"] = timed(partial(raw_load, raw, dst))
        if not np.array_equal(dst, src):
            raise SystemExit("raw read back different bytes")
        loads = [("load", partial(run_job, tier, jobs[2]))]
        if vtier is not None:  # the order alternates: neither always runs second
            loads.insert(
                r % 2, ("vllm_load", partial(vtier.run, JobDirection.LOAD, second, dst_ids))
            )
        for name, load in loads:
            dst[:] = 0
            measured[name] = timed(load, f"{fsync} {name}")
            if not np.array_equal(dst, src):
                raise SystemExit(f"{name}: loaded different bytes")
        if vtier is not None:
            vtier.shutdown()
            shutil.rmtree(vtier.root)
        # Stopped before the authenticated tier runs: their idle threads would create files
        # ahead of stores on this machine's cores during its timings.
        tier.shutdown()
        bare.shutdown()
        if signed is not None and r % 2 == 0:
            measured |= run_signed(signed, jobs, dst, src, fsync)
        shutil.rmtree(root)
        shutil.rmtree(base / f"bare-{fsync}-{r}")
        raw.unlink()
        raw2.unlink()
        if r:
            for name, t in measured.items():
                times[name].append(t)
    nbytes = blocks * block_size
    result: dict[str, Any] = {"fsync": fsync, "threads": threads, "bytes": nbytes}
    for op in OPS:
        tier_t, raw_t = times[op], times[f"raw_{op}"]
        result[op] = {
            "tier_gb_s_best": nbytes / min(tier_t) / 1e9,
            "tier_gb_s_median": nbytes / statistics.median(tier_t) / 1e9,
            "raw_gb_s_best": nbytes / min(raw_t) / 1e9,
            "raw_gb_s_median": nbytes / statistics.median(raw_t) / 1e9,
            # raw time / tier time of the same round: both saw the same machine
            "ratio_best": max(r / t for r, t in zip(raw_t, tier_t)),
            "ratio_median": statistics.median(r / t for r, t in zip(raw_t, tier_t)),
            "target": TARGET,
        }
    if vllm:
        result["vs_vllm"] = {
            op: {
                "vllm_gb_s_best": nbytes / min(times[f"vllm_{op}"]) / 1e9,
                "vllm_gb_s_median": nbytes / statistics.median(times[f"vllm_{op}"]) / 1e9,
                # vLLM's time / the tier's time in the same round
                "ratio_best": max(v / t for v, t in zip(times[f"vllm_{op}"], times[ours])),
                "ratio_median": statistics.median(
                    v / t for v, t in zip(times[f"vllm_{op}"], times[ours])
                ),
                "tier_op": ours,
            }
            for op, ours in VLLM_OPS.items()
        }
    if auth:
        result["auth_vs_plain"] = {
            op: {
                "auth_gb_s_median": nbytes / statistics.median(times[f"auth_{op}"]) / 1e9,
                "ratio_best": max(p / a for p, a in zip(times[op], times[f"auth_{op}"])),
                "ratio_median": statistics.median(
                    p / a for p, a in zip(times[op], times[f"auth_{op}"])
                ),
                # this process's CPU seconds per GB (all threads, kernel copies included)
                "cpu_s_per_gb": statistics.median(CPU[f"{fsync} {op}"][1:]) / (nbytes / 1e9),
                "auth_cpu_s_per_gb": statistics.median(CPU[f"{fsync} auth_{op}"][1:])
                / (nbytes / 1e9),
            }
            for op in AUTH_OPS
        }
    buffer.close()
    return result


def restart(base: Path, count: int, block_size: int, threads: int) -> dict[str, Any]:
    buffer = CPUKVBuffer(1024, block_size)
    root = base / "restart"
    tier = make_tier(buffer, root, count, io_threads=threads)
    ids = np.arange(1024, dtype=np.int64)
    start = time.perf_counter()
    for job, first in enumerate(range(0, count, 1024)):
        keys = [make_offload_key(i) for i in range(first, min(first + 1024, count))]
        run_job(tier, JobMetadata(job, keys, ids[: len(keys)], JobDirection.STORE, CTX))
    write_s = time.perf_counter() - start
    tier.shutdown()
    start = time.perf_counter()
    tier = make_tier(buffer, root, count, io_threads=threads)
    seconds = time.perf_counter() - start
    found = len(tier)
    tier.shutdown()
    tracemalloc.start()  # a second start, traced: what the constructed tier retains
    before = tracemalloc.get_traced_memory()[0]
    tier = make_tier(buffer, root, count, io_threads=threads)
    retained = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    tier.shutdown()
    shutil.rmtree(root)
    buffer.close()
    if found != count:
        raise SystemExit(f"restart found {found} of {count} blocks")
    return {
        "blocks": count,
        "block_size": block_size,
        "store_seconds": write_s,
        "restart_seconds": seconds,
        "index_bytes_per_block": retained / count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=256)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fsync", choices=["never", "always", "both"], default="both")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument("--restart-blocks", type=int, default=100_000)
    parser.add_argument("--restart-block-kib", type=int, default=4)
    parser.add_argument("--auth", action="store_true", help="also an authenticated tier")
    parser.add_argument(
        "--vllm-src",
        type=Path,
        default=None,
        help="an unpacked vLLM 0.34 wheel: also its fs tier, in the same rounds",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 below a target")
    args = parser.parse_args(argv)
    if args.vllm_src is not None:
        load_vllm(args.vllm_src)
    base = Path(tempfile.mkdtemp(prefix="kv-fs-bench-", dir=args.dir))
    try:
        modes = ["never", "always"] if args.fsync == "both" else [args.fsync]
        results = [
            throughput(
                base,
                args.blocks,
                args.block_kib * 1024,
                args.threads,
                args.rounds,
                m,
                args.auth,
                args.vllm_src is not None,
            )
            for m in modes
        ]
        restarted = (
            restart(base, args.restart_blocks, args.restart_block_kib * 1024, args.threads)
            if args.restart_blocks
            else None
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps({"throughput": results, "restart": restarted}, indent=2))
    else:
        print(
            f"fs tier vs plain file I/O: {args.blocks} x {args.block_kib} KiB, "
            f"{args.threads} I/O threads, {args.rounds} interleaved rounds (best / median)"
        )
        header = f"{'fsync':<7}{'op':<16}{'tier GB/s':>16}{'raw GB/s':>16}{'ratio':>16}  target"
        print(header)
        print("-" * len(header))
        for res in results:
            for op in OPS:
                r = res[op]
                print(
                    f"{res['fsync']:<7}{op:<16}"
                    f"{r['tier_gb_s_best']:>8.2f} / {r['tier_gb_s_median']:<5.2f}"
                    f"{r['raw_gb_s_best']:>8.2f} / {r['raw_gb_s_median']:<5.2f}"
                    f"{r['ratio_best']:>8.2f} / {r['ratio_median']:<5.2f}  "
                    + (f">= {TARGET}" if r["target"] else "-")
                )
        for res in results:
            for op, r in res.get("vs_vllm", {}).items():
                print(
                    f"{res['fsync']:<7}vLLM 0.34 fs tier {op}: "
                    f"{r['vllm_gb_s_best']:.2f} / {r['vllm_gb_s_median']:.2f} GB/s; tier "
                    f"{r['tier_op']} / vLLM {r['ratio_best']:.2f} / {r['ratio_median']:.2f}"
                )
        for res in results:
            for op, r in res.get("auth_vs_plain", {}).items():
                verdict = "ok" if r["ratio_median"] >= AUTH_TARGET else "BELOW TARGET"
                print(
                    f"{res['fsync']:<7}authenticated / plain {op}: {r['ratio_best']:.2f}x best, "
                    f"{r['ratio_median']:.2f}x median ({r['auth_gb_s_median']:.2f} GB/s; "
                    f"target >= {AUTH_TARGET}: {verdict}); cpu {r['cpu_s_per_gb']:.2f} -> "
                    f"{r['auth_cpu_s_per_gb']:.2f} s/GB"
                )
        if restarted:
            print(
                f"restart with {restarted['blocks']} blocks: "
                f"{restarted['restart_seconds']:.2f} s; index "
                f"{restarted['index_bytes_per_block']:.0f} bytes per block "
                f"(stored in {restarted['store_seconds']:.1f} s)"
            )
    if args.check:
        below = [
            f"{res['fsync']} {op}"
            for res in results
            for op in ("store", "load")
            if res[op]["ratio_best"] < TARGET
        ]
        if below:
            print("below target: " + ", ".join(below), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
