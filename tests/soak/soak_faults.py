"""The soak's fault kinds: each one starts a fault on the running stack and clears it.

A fault is a pair of callables on the :class:`Environment` (the stack, its Redis Cluster
processes, its fs root): ``start`` injects the fault, ``clear`` ends it. The schedule runs
each kind for a phase of requests, clears it, then measures how many requests the hit ratio
takes to come back to the fault-free run's. Every kind uses a real component: ``SIGKILL``,
``SIGSTOP``/``SIGCONT`` and failover of real ``redis-server`` processes, a real full disk
(a small tmpfs where mounting is allowed, else the faulty wrapper's injected ``ENOSPC``), a
real removed directory, a hook plugin that raises.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _redis_servers import RedisServer, slot_owners
from kv_offload import TieringOffloadingManager
from kv_offload.plugins import hookimpl
from kv_offload_faulty_tier import FaultyTier


class BrokenHooks:
    """A hook plugin that raises from ``blocks_stored``: the manager's calls still take effect."""

    @hookimpl
    def kv_offload_blocks_stored(self, manager: Any, keys: Any, medium: Any, req_context: Any):  # type: ignore[no-untyped-def]
        raise RuntimeError("soak: broken hook plugin")


@dataclass
class Environment:
    """What the faults act on."""

    manager: TieringOffloadingManager
    nodes: list[RedisServer]
    fs_root: Path
    disk: Path | None  # a small tmpfs holding fs_root, if one could be mounted
    state: dict[str, Any] = field(default_factory=dict)

    def tier(self, name: str) -> FaultyTier:
        tier = next(e.tier for e in self.manager.entries if e.name == name)
        assert isinstance(tier, FaultyTier)
        return tier

    def masters(self) -> list[RedisServer]:
        owners = set(slot_owners(self.live_node()).values())
        return [n for n in self.nodes if n.address in owners]

    def live_node(self) -> RedisServer:
        return next(n for n in self.nodes if n.process is not None and n.process.poll() is None)


@dataclass(frozen=True)
class FaultKind:
    name: str
    start: Callable[[Environment], None]
    clear: Callable[[Environment], None]


def _tier_errors(env: Environment) -> None:
    for name in ("fs", "redis"):
        env.tier(name).set_faults(fail_rate=0.3, raise_rate=0.2, lookup_raise_rate=0.1)


def _tier_errors_clear(env: Environment) -> None:
    for name in ("fs", "redis"):
        env.tier(name).set_faults(fail_rate=0.0, raise_rate=0.0, lookup_raise_rate=0.0)


def _slow(env: Environment) -> None:
    env.tier("fs").set_faults(seconds_per_mib=0.2)  # ~10x slower than the tmpfs/page cache


def _slow_clear(env: Environment) -> None:
    env.tier("fs").set_faults(seconds_per_mib=0.0)


def _master_kill(env: Environment) -> None:
    victim = env.masters()[0]
    env.state["killed"] = victim
    victim.kill()


def _master_restart(env: Environment) -> None:
    victim: RedisServer = env.state.pop("killed")
    victim.start()


def _master_stop(env: Environment) -> None:
    victim = env.masters()[-1]
    env.state["stopped"] = victim
    assert victim.process is not None
    os.kill(victim.process.pid, signal.SIGSTOP)


def _master_cont(env: Environment) -> None:
    victim: RedisServer = env.state.pop("stopped")
    assert victim.process is not None
    os.kill(victim.process.pid, signal.SIGCONT)


def _failover(env: Environment) -> None:
    """Kill a master and wait until its replica owns its slots."""
    victim = env.masters()[0]
    env.state["failed_over"] = victim
    victim.kill()
    seed = env.live_node()
    deadline = time.monotonic() + 30
    while victim.address in slot_owners(seed).values():
        if time.monotonic() > deadline:
            raise AssertionError("soak: no replica took over the killed master within 30 s")
        time.sleep(0.1)


def _failover_clear(env: Environment) -> None:
    env.state.pop("failed_over").start()  # comes back as a replica of its replacement


def _disk_full(env: Environment) -> None:
    if env.disk is not None:  # fill the real tmpfs with a ballast file
        ballast = env.disk / "ballast"
        with open(ballast, "wb") as out:
            try:
                while True:
                    out.write(b"\0" * (1 << 20))
                    out.flush()
            except OSError:
                pass
        env.state["ballast"] = ballast
    else:
        env.tier("fs").set_faults(fail_rate=1.0)  # no mount here: every store fails


def _disk_full_clear(env: Environment) -> None:
    ballast = env.state.pop("ballast", None)
    if ballast is not None:
        ballast.unlink()
    else:
        env.tier("fs").set_faults(fail_rate=0.0)


def _root_removed(env: Environment) -> None:
    while env.fs_root.exists():  # the I/O threads may be creating spare files meanwhile
        shutil.rmtree(env.fs_root, ignore_errors=True)


def _root_recreated(env: Environment) -> None:
    env.fs_root.mkdir(parents=True, exist_ok=True)


def _broken_hook(env: Environment) -> None:
    plugin = BrokenHooks()
    env.manager.plugin_manager.register(plugin, name="soak-broken-hook")
    env.state["hook"] = plugin


def _broken_hook_clear(env: Environment) -> None:
    env.manager.plugin_manager.unregister(env.state.pop("hook"))


KINDS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind("tier_errors", _tier_errors, _tier_errors_clear),
        FaultKind("slow_tier", _slow, _slow_clear),
        FaultKind("master_sigkill", _master_kill, _master_restart),
        FaultKind("master_sigstop", _master_stop, _master_cont),
        FaultKind("replica_failover", _failover, _failover_clear),
        FaultKind("disk_full", _disk_full, _disk_full_clear),
        FaultKind("fs_root_removed", _root_removed, _root_recreated),
        FaultKind("broken_hook", _broken_hook, _broken_hook_clear),
    )
}


def mount_small_disk(point: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``point`` (root only); ``False`` where mounting is refused."""
    if os.geteuid() != 0:
        return False
    point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
        check=False,
        capture_output=True,
    )
    return done.returncode == 0


def unmount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
