"""A throw-away Ceph cluster with an S3 gateway on loopback ports, for the S3 tier tests.

:class:`CephS3` starts one monitor, one OSD with ``osd objectstore = memstore`` (object data in
the OSD's memory, pools of size 1, no manager) and ``radosgw`` with the beast frontend, all
bound to 127.0.0.1 on ports the kernel picked free, all state in one temporary directory. It
creates an S3 user and a bucket and stops every daemon by the PID it started, in reverse
order (``SIGKILL`` after a short grace: the data is thrown away). No Docker, systemd or
cephadm. ``radosgw`` can be killed, restarted on the same port, stopped (``SIGSTOP``) and
continued, for the fault tests.

Nothing is installed here: when the Ceph programs are missing the tests skip, saying how to
install them; when ``CI`` is set they fail instead. Every daemon gets ``SIGKILL`` when the test
process dies (``PR_SET_PDEATHSIG``), so a killed test run leaks nothing on a shared machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

__all__ = ["ACCESS_KEY", "BUCKET", "PROGRAMS", "SECRET_KEY", "CephS3", "need_ceph"]

PROGRAMS = (
    "ceph-mon",
    "ceph-osd",
    "radosgw",
    "radosgw-admin",
    "ceph",
    "ceph-authtool",
    "monmaptool",
)
ACCESS_KEY = "KVOTESTACCESSKEY0001"
SECRET_KEY = "kvo-test-secret-key-0000000000000000000001"
BUCKET = "kvo-tests"
#: A second user, with no grant on the tests' bucket (the "permission refused" tests).
STRANGER_ACCESS_KEY = "KVOTESTSTRANGER00001"
STRANGER_SECRET_KEY = "kvo-test-stranger-secret-000000000000000001"
INSTALL_HINT = (
    "install them to run the S3 tier tests: `apt-get install -y --no-install-recommends "
    "radosgw ceph-mon ceph-osd ceph-common` (Debian/Ubuntu; .ci/run does it)"
)


def need_ceph() -> None:
    """Fail under CI, skip elsewhere, when a Ceph program is missing."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        message = f"{', '.join(missing)} not found on PATH; {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {message}", pytrace=False)
        pytest.skip(message)


def _die_with_parent() -> None:
    """Linux: the daemon gets SIGKILL when the test process dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready, timeout: float, log: Path | None = None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} did not come up within {timeout:.0f} s\n{tail}")
        time.sleep(0.1)


class CephS3:
    """One mon, one memstore OSD and radosgw under ``directory``; ``endpoint`` is its S3 URL."""

    def __init__(self, directory: Path, *, memstore_bytes: int = 1 << 30) -> None:
        need_ceph()
        started = time.monotonic()
        self.directory = directory.resolve()
        self.conf = self.directory / "ceph.conf"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopped_rgw = False
        d = self.directory
        for sub in ("mon/ceph-a", "osd/ceph-0", "run", "log", "rgw"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.mon_port = _free_port()
        self.rgw_port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.rgw_port}"
        fsid = str(uuid.uuid4())
        self.conf.write_text(
            _CONF.format(
                fsid=fsid,
                dir=d,
                mon_port=self.mon_port,
                rgw_port=self.rgw_port,
                memstore_bytes=memstore_bytes,
            )
        )
        try:
            self._start(fsid)
        except BaseException:
            self.stop()
            raise
        #: seconds from nothing to a bucket that answers PUT/GET (measured per session)
        self.start_seconds = time.monotonic() - started

    # -- admin ----------------------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = 30.0, stdin: bytes | None = None) -> str:
        """A Ceph admin command against this cluster (bounded: without a mgr some hang)."""
        done = subprocess.run(
            [argv[0], "-c", str(self.conf), *argv[1:]],
            input=stdin, capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()

    def _daemon(self, name: str, *argv: str) -> None:
        log = open(self.directory / "log" / f"{name}.stdout", "ab")  # noqa: SIM115
        with log:
            self._procs[name] = subprocess.Popen(
                [argv[0], "-c", str(self.conf), *argv[1:], "-f"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )  # fmt: skip

    def _start(self, fsid: str) -> None:
        d = self.directory
        keyrings = {
            "mon.": ("--cap", "mon", "allow *"),
            "client.admin": (
                "--cap", "mon", "allow *", "--cap", "osd", "allow *",
                "--cap", "mds", "allow *", "--cap", "mgr", "allow *",
            ),
            "osd.0": ("--cap", "mon", "allow profile osd", "--cap", "mgr", "allow profile osd",
                      "--cap", "osd", "allow *"),
            "client.rgw.a": ("--cap", "mon", "allow rw", "--cap", "osd", "allow rwx",
                             "--cap", "mgr", "allow rw"),
        }  # fmt: skip
        parts = []
        for name, caps in keyrings.items():
            path = d / f"{'mon' if name == 'mon.' else name}.keyring"
            subprocess.run(
                ["ceph-authtool", "--create-keyring", str(path), "--gen-key", "-n", name, *caps],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
            parts.append(path.read_bytes())
        # the mon's initial auth database holds every key: no `ceph auth add` round trips
        (d / "mkfs.keyring").write_bytes(b"".join(parts))
        shutil.copy(d / "mkfs.keyring", d / "mon.a.keyring")
        monmap = d / "monmap"
        subprocess.run(
            ["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
             f"[v2:127.0.0.1:{self.mon_port}]", str(monmap)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap),
                  "--keyring", str(d / "mkfs.keyring"))  # fmt: skip
        self._daemon("mon", "ceph-mon", "-i", "a")

        def mon_up() -> bool:
            try:
                self._run("ceph", "--connect-timeout", "3", "mon", "stat", timeout=5)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            return True

        _wait("ceph-mon", mon_up, 30, d / "log" / "mon.a.log")
        osd_uuid = str(uuid.uuid4())
        osd_key = subprocess.run(
            ["ceph-authtool", "-p", "-n", "osd.0", str(d / "osd.0.keyring")],
            check=True, capture_output=True, timeout=30,
        ).stdout.decode().strip()  # fmt: skip
        secret = json.dumps({"cephx_secret": osd_key}).encode()
        osd_id = self._run("ceph", "osd", "new", osd_uuid, "0", "-i", "-", stdin=secret).strip()
        if osd_id != "0":
            raise RuntimeError(f"unexpected osd id {osd_id!r}")
        self._run("ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid, timeout=60)
        self._daemon("osd", "ceph-osd", "-i", "0")
        _wait(
            "ceph-osd",
            lambda: any(
                line.startswith("osd.0 up") for line in self._run("ceph", "osd", "dump").split("\n")
            ),
            60,
            d / "log" / "osd.0.log",
        )
        self.start_rgw()
        self._run(
            "radosgw-admin", "user", "create", "--uid=kvo-test", "--display-name=kvo-test",
            f"--access-key={ACCESS_KEY}", f"--secret-key={SECRET_KEY}",
        )  # fmt: skip
        self._run(
            "radosgw-admin", "user", "create", "--uid=kvo-stranger", "--display-name=stranger",
            f"--access-key={STRANGER_ACCESS_KEY}", f"--secret-key={STRANGER_SECRET_KEY}",
        )  # fmt: skip
        # The first bucket, object and multipart upload each make radosgw create a pool
        # (about 2 s apiece): pay for them here, once, rather than in the first test.
        client = self.client()
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="warm-up", Body=b"x")
        upload = client.create_multipart_upload(Bucket=BUCKET, Key="warm-up-mp")["UploadId"]
        client.upload_part(Bucket=BUCKET, Key="warm-up-mp", UploadId=upload, PartNumber=1,
                           Body=b"x")  # fmt: skip
        client.abort_multipart_upload(Bucket=BUCKET, Key="warm-up-mp", UploadId=upload)
        client.delete_object(Bucket=BUCKET, Key="warm-up")

    # -- radosgw, for the fault tests -----------------------------------------------------

    def _rgw_answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # it answered (403 for an anonymous request)
        except OSError:
            return False
        return True

    def start_rgw(self) -> None:
        """Start (or restart, on the same port) radosgw and wait until it answers HTTP."""
        self._daemon("rgw", "radosgw", "-n", "client.rgw.a")
        proc = self._procs["rgw"]

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"radosgw exited with {proc.returncode}; see {self.directory}")
            return self._rgw_answers()

        _wait("radosgw", ready, 60, self.directory / "log" / "client.rgw.a.log")

    def kill_rgw(self) -> None:
        """SIGKILL radosgw (a crash); :meth:`start_rgw` brings it back on the same port."""
        self._signal_stop("rgw", signal.SIGKILL)

    def pause_rgw(self) -> None:
        """SIGSTOP radosgw: connections are accepted by the kernel, nothing answers. Returns
        once every thread of it is stopped: the signal only asks, and on a loaded machine a
        thread that is not scheduled yet would still answer the next request."""
        proc = self._procs["rgw"]
        proc.send_signal(signal.SIGSTOP)

        def stopped() -> bool:
            states = []
            for task in Path(f"/proc/{proc.pid}/task").iterdir():
                try:
                    # "pid (comm) S ...": the state follows the last ')'
                    states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
                except (FileNotFoundError, IndexError):
                    continue  # a thread that just exited
            return bool(states) and all(state in ("T", "t") for state in states)

        if sys.platform.startswith("linux"):
            _wait("radosgw stopped (SIGSTOP)", stopped, 10)

    def resume_rgw(self) -> None:
        self._procs["rgw"].send_signal(signal.SIGCONT)

    def ensure_rgw(self) -> None:
        """radosgw running and answering again, whatever a fault test did to it."""
        proc = self._procs.get("rgw")
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            _wait("radosgw", self._rgw_answers, 30)
            return
        self._procs.pop("rgw", None)
        self.start_rgw()

    # -- clients --------------------------------------------------------------------------

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):  # type: ignore[no-untyped-def]
        """A boto3 S3 client of the test user (path-style addressing, as Ceph needs)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          connect_timeout=5, read_timeout=30),
        )  # fmt: skip

    def admin(self, *argv: str) -> str:
        """``radosgw-admin ARGV`` against this cluster (quotas, users)."""
        return self._run("radosgw-admin", *argv)

    # -- stopping -------------------------------------------------------------------------

    def _signal_stop(self, name: str, sig: signal.Signals) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        if name == "rgw":
            proc.send_signal(signal.SIGCONT)  # a stopped process never handles SIGTERM
        proc.send_signal(sig)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop every daemon this cluster started, by PID, newest first; delete its state."""
        for name in ("rgw", "osd", "mon"):
            self._signal_stop(name, signal.SIGTERM)
        shutil.rmtree(self.directory, ignore_errors=True)


_CONF = """\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
public addr = 127.0.0.1
public network = 127.0.0.0/8
cluster network = 127.0.0.0/8
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {dir}/$name.keyring
run dir = {dir}/run
admin socket = {dir}/run/$name.asok
pid file = {dir}/run/$name.pid
log file = {dir}/log/$name.log
log to stderr = false
err to stderr = true
crash dir = {dir}/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.05
paxos min wait = 0.01
mon max pg per osd = 1000

[mon]
mon data = {dir}/mon/ceph-$id

[osd]
osd data = {dir}/osd/ceph-$id
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd memory target = 536870912
osd crush update on start = true
osd op num shards = 1
osd op num threads per shard = 2

[client.rgw.a]
rgw data = {dir}/rgw
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw dns name = 127.0.0.1
rgw enable usage log = false
rgw thread pool size = 32
"""
