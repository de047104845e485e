"""How many of the project's modules one tiered request and one config walk through, and how
often control comes back to a module it had left: a reader following the code has to do the
same. Used for the before/after walks of the internals issues (compare two builds by running
this file with each one's Python).

* *request*: one request through a 4-block CPU tier (LRU) and an fs tier: a lookup promoted
  from disk, a load, a store that evicts and cascades, the finish, a step end. The scheduler
  waits unrecorded for the fs tier's I/O threads (``SETTLE_S``) before it polls, so the walk
  holds the same polls on a quiet or a loaded machine.
* *config*: ``load_config`` of a TOML file with an fs tier and a hook table, then
  ``build_manager`` from it (and its ``shutdown``). The fs tier's I/O threads do background
  work (spare files) for as long as the stack lives: their repeats depend on timing.
* *load*: that ``load_config`` alone (read, parse, resolve the plugins, estimate memory): the
  config package's one-way flow, without the stack it builds.

Every thread is traced: the calling one with ``sys.setprofile`` and every thread started
after it (the tiers' I/O threads) with ``threading.setprofile`` (Python 3.12+:
``threading.setprofile_all_threads``), call events of frames whose module is ``kv_offload*``.
For each walk and each thread:

* the project's modules in the order first entered;
* the *re-entries*, the headline figure: distinct calls (caller function -> callee function)
  that bring the thread back into a module it had already left, a jump back into a file the
  reader had closed. Summed over the threads. A loop making the same call again is the same
  jump; the count with repeats is given too;
* on the scheduler thread, the distinct module-to-module transitions and the *returns*:
  distinct transitions from a module back into one entered before it (counted once per pair);
* the *call-backs*: distinct (caller, callee) module pairs where a module calls into one that
  is still running further down the stack, the cycles a reader has to hold in their head
  (``config`` and ``config_resolve`` calling each other was one).

    python benchmarks/module_walk.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

from kv_offload import LookupResult, ReqContext, build_manager, load_config, make_offload_key

BLOCK = 4096


class Walker:
    """Records, on every thread, the project modules entered while :meth:`record` runs.

    The profile function is installed on the calling thread (``sys.setprofile``) and on every
    thread started afterwards (``threading.setprofile``; with ``setprofile_all_threads`` on
    Python 3.12+ also on threads already running): build the manager inside the ``with``
    block so its I/O threads carry it. Outside :meth:`record`, and on a thread inside
    :meth:`paused`, it returns at once.
    """

    def __init__(self) -> None:
        self.sequences: dict[int, list[str]] = {}
        #: Per thread: the distinct calls that brought control back into a module the thread
        #: had left, as (caller function, callee function) -> how many times.
        self.reentry_calls: dict[int, Counter[tuple[str, str]]] = {}
        self.names: dict[int, str] = {}
        self.callbacks: set[tuple[str, str]] = set()
        self._active = False
        self._paused: set[int] = set()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self._active or event != "call":
            return
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith("kv_offload"):
            return
        ident = threading.get_ident()
        if ident in self._paused:
            return
        sequence = self.sequences.get(ident)
        if sequence is None:
            sequence = self.sequences[ident] = []
            self.reentry_calls[ident] = Counter()
            self.names[ident] = threading.current_thread().name
        caller = frame.f_back
        caller_module = str(caller.f_globals.get("__name__", "")) if caller else ""
        if not sequence or sequence[-1] != module:
            if module in sequence:
                where = f"{caller_module}:{_name(caller)}" if caller else "?"
                self.reentry_calls[ident][(where, f"{module}:{_name(frame)}")] += 1
            sequence.append(module)
        if caller is None or caller_module == module or not caller_module.startswith("kv_offload"):
            return
        below = caller.f_back
        while below is not None:
            if below.f_globals.get("__name__") == module:
                self.callbacks.add((caller_module, module))
                break
            below = below.f_back

    def __enter__(self) -> Walker:
        everywhere = getattr(threading, "setprofile_all_threads", None)
        if everywhere is not None:
            everywhere(self._profile)
        else:
            threading.setprofile(self._profile)
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        everywhere = getattr(threading, "setprofile_all_threads", None)
        if everywhere is not None:
            everywhere(None)
        else:
            threading.setprofile(None)
            sys.setprofile(None)

    def record(self, action: Callable[[], Any]) -> None:
        self._active = True
        try:
            action()
        finally:
            self._active = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """This thread is not recorded inside: the scheduler waiting for the I/O threads
        (which stay recorded) without polling, so the walk does not depend on timing."""
        ident = threading.get_ident()
        self._paused.add(ident)
        try:
            yield
        finally:
            self._paused.discard(ident)

    def result(self) -> dict[str, Any]:
        main = threading.main_thread().ident
        idents = sorted(self.sequences, key=lambda i: (i != main, self.names[i]))
        threads = {self.names[i]: walk_of(self.sequences[i], self.reentry_calls[i]) for i in idents}
        modules: list[str] = []
        for thread in threads.values():
            modules += [m for m in thread["modules"] if m not in modules]
        scheduler = threads.get(threading.main_thread().name, walk_of([], Counter()))
        return {
            "modules": modules,
            "transitions": scheduler["transitions"],
            "returns": scheduler["returns"],
            "return_pairs": scheduler["return_pairs"],
            "reentries": sum(t["reentries"] for t in threads.values()),
            "reentry_events": sum(t["reentry_events"] for t in threads.values()),
            "callbacks": len(self.callbacks),
            "callback_pairs": [f"{a} -> {b}" for a, b in sorted(self.callbacks)],
            "threads": threads,
        }


def _name(frame: FrameType) -> str:
    code = frame.f_code
    return str(getattr(code, "co_qualname", code.co_name))


def walk_of(sequence: list[str], reentry_calls: Counter[tuple[str, str]]) -> dict[str, Any]:
    """One thread's walk: ``sequence`` is the modules it entered, in order, a module repeated
    only after another one came between; ``reentry_calls`` the calls that re-entered one.

    A *re-entry* is a distinct call (caller function -> callee function) that brings control
    back into a module the thread had already left: a jump back into a file the reader had
    closed. A loop making the same call again is the same jump (the reader reads the loop
    once), so re-entries do not depend on how many blocks or polls there were; the raw count
    is ``reentry_events``.
    """
    first: list[str] = []
    for module in sequence:
        if module not in first:
            first.append(module)
    reentered: Counter[str] = Counter()
    for _caller, callee in reentry_calls:
        reentered[callee.split(":", 1)[0]] += 1
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
        "reentries": len(reentry_calls),
        "reentry_events": sum(reentry_calls.values()),
        "reentered": dict(reentered.most_common()),
        "reentry_calls": [f"{a} -> {b}" for a, b in sorted(reentry_calls)],
    }


def walk(action: Callable[[], Any]) -> dict[str, Any]:
    """Run ``action`` under the profiler: the project modules it enters on every thread."""
    with Walker() as walker:
        walker.record(action)
    return walker.result()


def _rows(keys: list[bytes]) -> bytes:
    return b"".join(k.ljust(BLOCK, b"\x5a")[:BLOCK] for k in keys)


#: How long the scheduler waits, unrecorded, for the I/O threads' jobs to finish (4 KiB
#: blocks: milliseconds) before it polls once: the walk then holds one poll, not as many as
#: the machine's load made.
SETTLE_S = 0.5


def request_walk(root: Path) -> dict[str, Any]:
    config = {
        "num_blocks": 4,
        "block_size_bytes": BLOCK,
        "hooks": {"autoload": False},
        "tiers": [{"type": "fs", "root_dir": str(root / "fs"), "capacity_blocks": 64}],
    }
    with Walker() as walker:  # before the manager: its I/O threads carry the profiler
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
        polls = 0

        def one_request() -> None:
            nonlocal polls
            ctx = ReqContext("one-request")
            m.on_new_request(ctx)
            k = make_offload_key(1)
            answer = m.lookup(k, ctx)  # promoted from disk: the fs tier's load job starts
            while answer is LookupResult.PENDING:
                with walker.paused():
                    time.sleep(SETTLE_S)
                polls += 1
                m.on_schedule_end()
                answer = m.lookup(k, ctx)
            spec = m.prepare_load([k], ctx)
            m.kv_buffer.read_blocks(spec.block_ids)
            m.complete_load([k], ctx)
            store([7], ctx)  # evicts, and the victim cascades to the fs tier
            m.on_request_finished(ctx)
            m.on_schedule_end()
            with walker.paused():
                time.sleep(SETTLE_S)  # the cascade's store job on the I/O thread
            m.on_schedule_end()  # its completion

        try:
            walker.record(one_request)
        finally:
            m.shutdown()
    result = walker.result()
    result["polls"] = polls
    return result


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
        threads = result["threads"]
        print(
            f"{name}: {len(result['modules'])} modules on {len(threads)} thread(s), "
            f"{result['reentries']} re-entries into a module the thread had left "
            f"({result['reentry_events']} with repeats); on the "
            f"scheduler thread {result['transitions']} distinct transitions, "
            f"{result['returns']} returns to a module entered before; "
            f"{result['callbacks']} call-backs into a module still running"
            + (f"; {result['polls']} poll(s) for the promotion" if "polls" in result else "")
        )
        for thread, one in threads.items():
            again = ", ".join(f"{m} {n}" for m, n in one["reentered"].items())
            print(
                f"  [{thread}] {len(one['modules'])} modules, {one['reentries']} re-entries "
                f"({one['reentry_events']} with repeats)" + (f": {again}" if again else "")
            )
            for i, module in enumerate(one["modules"], 1):
                print(f"    {i:2d}. {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
