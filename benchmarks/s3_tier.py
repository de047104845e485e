"""S3 clients and the S3 tier on the same objects and threads, against a real Ceph RADOS Gateway.

Why the S3 tier uses boto3: a client must earn its place by measurement. Three sides move the
same ``--blocks`` objects of ``--block-kib`` KiB (default 64 x 256 KiB and 16 x 2 MiB) with
``--threads`` threads (default 4, the tier's ``io_threads``), PUT then GET, every GET's bytes
compared with what was PUT (outside the timing):

* ``boto3``: one client (connection pool of ``--threads``), a thread pool running
  ``put_object`` / ``get_object().read()``, one object per task: the raw pipelined baseline;
* ``obstore`` (Rust's ``object_store``, releases the GIL): one ``S3Store``, the same thread pool
  running ``obstore.put`` / ``obstore.get().bytes()``;
* ``tier``: the S3 tier itself (obstore on its data path), one ``submit_store`` then one
  ``submit_load`` job of all the blocks from / into a CPU buffer, polled with
  ``get_finished`` as an engine polls: its object is the block plus a 60-byte header, its
  load checks the XXH3 checksum.

Each round runs the three sides in turn, their order rotated between rounds so each sees the
same machine; the report gives MB/s (best and median of the rounds), the CPU seconds per GB
moved (the process's, all threads: on a shared 2-core machine the client's CPU is what the
engine loses), and the per-round ratios obstore / boto3, tier / boto3 and tier / obstore
(best and median; the tier's target is >= 0.8x of the raw client it runs on). Then the
time ``lookup`` holds the scheduler (p50, p99, max; target p99 < 100 us), for keys the tier
wrote and for keys it asks the store about in the background.

The gateway is a throw-away one started for the run (tests/s3_tier/_ceph.py: a monitor, a
memstore OSD and radosgw on loopback; needs ``ceph-mon``, ``ceph-osd``, ``radosgw``), or the
endpoint of ``--endpoint`` with the bucket of ``--bucket`` and credentials from the AWS
environment.

    python benchmarks/s3_tier.py [--sizes 256:64,2048:16] [--threads 4] [--rounds 5]
        [--lookup-steps 200] [--endpoint URL --bucket NAME] [--json]
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("boto3", "obstore", "tier")


@contextmanager
def gateway(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(endpoint, bucket): the one named, or a throw-away radosgw for the run."""
    if args.endpoint:
        yield args.endpoint, args.bucket
        return
    sys.path.insert(0, str(ROOT / "tests" / "s3_tier"))
    from _ceph import ACCESS_KEY, BUCKET, PROGRAMS, SECRET_KEY, CephS3

    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        sys.exit(f"{', '.join(missing)} not found: apt-get install -y radosgw ceph-mon ceph-osd")
    with tempfile.TemporaryDirectory(prefix="kvo-s3-bench-") as directory:
        cluster = CephS3(Path(directory), memstore_bytes=2 << 30)
        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        try:
            yield cluster.endpoint, BUCKET
        finally:
            cluster.stop()


class Boto3Side:
    def __init__(self, endpoint: str, bucket: str, threads: int) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=threads,
                          retries={"mode": "standard", "max_attempts": 3},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"),
        )  # fmt: skip

    def put(self, name: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=name, Body=body)

    def get(self, name: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=name)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()


class ObstoreSide:
    def __init__(self, endpoint: str, bucket: str, threads: int) -> None:
        import obstore
        from obstore.store import S3Store

        self._obstore = obstore
        self.store = S3Store(
            bucket, endpoint=endpoint, region="us-east-1",
            access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
            virtual_hosted_style_request=False,
            client_options={"allow_http": True, "pool_max_idle_per_host": str(threads)},
        )  # fmt: skip

    def put(self, name: str, body: bytes) -> None:
        self._obstore.put(self.store, name, body)

    def get(self, name: str) -> bytes:
        return bytes(self._obstore.get(self.store, name).bytes())


def timed(work: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) of ``work``."""
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def client_round(side: Any, pool: ThreadPoolExecutor, names: list[str],
                 rows: np.ndarray) -> dict[str, tuple[float, float]]:  # fmt: skip
    bodies = [rows[i].tobytes() for i in range(len(names))]  # outside the timing
    got: list[bytes] = []

    def put() -> None:
        list(pool.map(side.put, names, bodies))

    def get() -> None:
        got[:] = pool.map(side.get, names)

    out = {"put": timed(put), "get": timed(get)}
    if got != bodies:
        raise RuntimeError(f"{type(side).__name__}: a GET returned other bytes than its PUT")
    return out


class TierSide:
    """The S3 tier over a CPU buffer of twice the blocks (stored from the first half, loaded
    into the second)."""

    def __init__(self, endpoint: str, bucket: str, threads: int, rows: np.ndarray,
                 prefix: str) -> None:  # fmt: skip
        from kv_offload.tiering import OffloadingConfig
        from kv_offload_s3_tier import S3Tier

        n, block = rows.shape
        self.cpu = np.zeros((2 * n, block), np.uint8)
        self.cpu[:n] = rows
        self.tier = S3Tier(
            OffloadingConfig(num_blocks=2 * n, block_size_bytes=block), memoryview(self.cpu),
            "s3", endpoint_url=endpoint, bucket=bucket, prefix=prefix, capacity_blocks=4 * n,
            io_threads=threads, shared_grace_s=0,
        )  # fmt: skip
        self.n = n
        self.job = 0

    def _run(self, direction: Any, keys: list[Any], slots: range) -> None:
        from kv_offload import ReqContext
        from kv_offload.tiering import JobMetadata

        self.job += 1
        job = JobMetadata(self.job, keys, np.array(slots, np.int64), direction,
                          ReqContext(req_id=f"bench{self.job}"))  # fmt: skip
        (self.tier.submit_load if job.is_promotion else self.tier.submit_store)(job)
        while True:
            results = self.tier.get_finished()
            if results:
                (result,) = results
                if not result.success or result.failed_keys:
                    raise RuntimeError(f"tier job failed: {result}")
                return
            time.sleep(0.001)  # an engine polls once per step

    def round(self, keys: list[Any]) -> dict[str, tuple[float, float]]:
        from kv_offload.tiering import JobDirection

        n = self.n
        self.cpu[n:] = 0
        out = {
            "put": timed(lambda: self._run(JobDirection.STORE, keys, range(n))),
            "get": timed(lambda: self._run(JobDirection.LOAD, keys, range(n, 2 * n))),
        }
        if not np.array_equal(self.cpu[:n], self.cpu[n:]):
            raise RuntimeError("the tier loaded other bytes than it stored")
        return out


def measure(endpoint: str, bucket: str, block_kib: int, blocks: int, args: argparse.Namespace,
            ) -> dict[str, Any]:  # fmt: skip
    from kv_offload import OffloadKey

    block = block_kib * 1024
    rng = np.random.default_rng(block_kib)
    rows = rng.integers(0, 256, (blocks, block), dtype=np.uint8)
    run = f"bench-{os.getpid()}-{block_kib}"
    names = [f"{run}/raw/{i:02x}/{i:08d}.kvb" for i in range(blocks)]
    keys = [OffloadKey(i.to_bytes(8, "big") + bytes(24)) for i in range(blocks)]
    sides: dict[str, Any] = {
        "boto3": Boto3Side(endpoint, bucket, args.threads),
        "obstore": ObstoreSide(endpoint, bucket, args.threads),
        "tier": TierSide(endpoint, bucket, args.threads, rows, f"{run}/tier"),
    }
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        s: {"put": [], "get": []} for s in SIDES
    }
    with ThreadPoolExecutor(args.threads) as pool:
        for side in ("boto3", "obstore"):  # warm: connections, the bucket's index shards
            client_round(sides[side], pool, names[:4], rows[:4])
        for r in range(args.rounds + 1):
            order = SIDES[r % 3 :] + SIDES[: r % 3]
            for name in order:
                side = sides[name]
                got = side.round(keys) if name == "tier" else client_round(side, pool, names, rows)
                if r:  # round 0 warms every side
                    for op, sample in got.items():
                        samples[name][op].append(sample)
    sides["tier"].tier.shutdown()
    mb = blocks * block / 1e6
    out: dict[str, Any] = {"block_kib": block_kib, "blocks": blocks, "threads": args.threads,
                           "rounds": args.rounds, "sides": {}, "ratios": {}}  # fmt: skip
    for name in SIDES:
        out["sides"][name] = {
            op: {
                "best_MBps": round(mb / min(w for w, _ in s), 1),
                "median_MBps": round(mb / statistics.median(w for w, _ in s), 1),
                "cpu_s_per_GB": round(statistics.median(c for _, c in s) / (mb / 1e3), 2),
            }
            for op, s in samples[name].items()
        }
    for name, base in (("obstore", "boto3"), ("tier", "boto3"), ("tier", "obstore")):
        for op in ("put", "get"):
            ratios = [b[0] / o[0] for o, b in zip(samples[name][op], samples[base][op])]
            out["ratios"][f"{name}/{base} {op}"] = {
                "best": round(max(ratios), 2), "median": round(statistics.median(ratios), 2)
            }  # fmt: skip
    return out


def report(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"\n{r['blocks']} objects of {r['block_kib']} KiB, {r['threads']} threads, "
              f"{r['rounds']} interleaved rounds")  # fmt: skip
        print(f"{'side':8} {'op':4} {'best MB/s':>10} {'median MB/s':>12} {'CPU s/GB':>9}")
        for name, ops in r["sides"].items():
            for op, v in ops.items():
                print(f"{name:8} {op:4} {v['best_MBps']:>10} {v['median_MBps']:>12} "
                      f"{v['cpu_s_per_GB']:>9}")  # fmt: skip
        for what, v in r["ratios"].items():
            print(f"  {what}: best {v['best']}x, median {v['median']}x")


def lookup_latency(endpoint: str, bucket: str, args: argparse.Namespace) -> dict[str, Any]:
    """How long ``lookup`` holds the scheduler: ``--lookup-steps`` steps, each asking 64 keys
    the tier wrote (answered from its index) and 64 it never saw (first asked: "ask again",
    checked by HEADs in the background after ``on_schedule_end``, then answered from the
    cached result), 2 ms apart as scheduler steps are. Each call timed alone."""
    from kv_offload import OffloadKey, ReqContext

    rows = np.zeros((64, 16 * 1024), np.uint8)
    side = TierSide(endpoint, bucket, args.threads, rows, f"bench-{os.getpid()}-lookup")
    known = [OffloadKey(i.to_bytes(8, "big") + bytes(24)) for i in range(64)]
    side.round(known)  # stored: in the index
    samples: dict[str, list[int]] = {"written by this engine": [], "asked of the store": []}
    for step in range(args.lookup_steps):
        ctx = ReqContext(req_id=f"lookup{step}")
        unknown = [OffloadKey((1 << 40 | step << 8 | i).to_bytes(8, "big") + bytes(24))
                   for i in range(64)]  # fmt: skip
        for _ in range(2):  # first asked, then asked again the next step
            for label, keys in (("written by this engine", known),
                                ("asked of the store", unknown)):  # fmt: skip
                for k in keys:
                    t0 = time.perf_counter_ns()
                    side.tier.lookup(k, ctx)
                    samples[label].append(time.perf_counter_ns() - t0)
            side.tier.on_schedule_end()
            time.sleep(0.002)
        side.tier.on_request_finished(ctx)
    side.tier.shutdown()
    return {
        label: {
            "lookups": len(ns),
            "p50_us": round(float(np.percentile(ns, 50)) / 1e3, 2),
            "p99_us": round(float(np.percentile(ns, 99)) / 1e3, 2),
            "max_us": round(max(ns) / 1e3, 1),
        }
        for label, ns in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256:64,2048:16",
                        help="KIB:OBJECTS pairs, comma separated")  # fmt: skip
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoint")
    parser.add_argument("--bucket", default="kvo-tests")
    parser.add_argument("--lookup-steps", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [tuple(int(x) for x in pair.split(":")) for pair in args.sizes.split(",")]
    with gateway(args) as (endpoint, bucket):
        results = [measure(endpoint, bucket, kib, n, args) for kib, n in sizes]
        lookups = lookup_latency(endpoint, bucket, args) if args.lookup_steps else {}
    if args.json:
        print(json.dumps({"throughput": results, "lookup": lookups}, indent=2))
    else:
        report(results)
        for label, v in lookups.items():
            print(f"lookup, {label}: {v['lookups']} calls, p50 {v['p50_us']} us, "
                  f"p99 {v['p99_us']} us, max {v['max_us']} us (target p99 < 100 us)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
