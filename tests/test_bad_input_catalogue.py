"""A catalogue of bad inputs through the API and the CLI.

Each API case runs against a manager holding blocks in every state (idle, pinned, pending)
and checks three things: the exception class (always from kv-offload's hierarchy), that the
message names the offending value or key, and that nothing changed: ``get_stats()`` and every
key's ref count and slot are the same afterwards. Each CLI case checks exit status 2, one line
on stderr naming the problem, and nothing on stdout.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kv_offload import (
    ConcurrentUseError,
    ConfigError,
    CPUOffloadingManager,
    KVOffloadError,
    ManagerError,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    make_offload_key,
)
from kv_offload.errors import (
    InvalidArgumentError,
    InvalidKeyError,
    KeyStateError,
    PluginNotFoundError,
)
from kv_offload.plugins import create_plugin_manager
from kv_offload.policies import CachePolicyFactory
from kv_offload.tiering import OffloadingConfig, SecondaryTierFactory
from test_cli import assert_one_line_error, kvo

BLOCK = 64
CTX = ReqContext(req_id="catalogue")


def k(i: int) -> bytes:
    return make_offload_key(i)


IDLE, PINNED, PENDING, MISSING = k(1), k(2), k(3), k(99)
KEYS = [IDLE, PINNED, PENDING, k(4), k(5), MISSING]


def populated_cpu() -> CPUOffloadingManager:
    """Blocks in every state: IDLE and k(4), k(5) stored, PINNED loading, PENDING storing."""
    manager = CPUOffloadingManager(8, block_size_bytes=BLOCK)
    out = manager.prepare_store([IDLE, PINNED, k(4), k(5)], CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.prepare_load([PINNED], CTX)
    assert manager.prepare_store([PENDING], CTX) is not None
    return manager


def populated_filtered() -> CPUOffloadingManager:
    """The same states in a CPU manager with the reuse filter on (each key offered twice)."""
    manager = CPUOffloadingManager(8, block_size_bytes=BLOCK, store_threshold=2)
    for keys in ([IDLE, PINNED, k(4), k(5)], [PENDING]):
        skipped = manager.prepare_store(keys, CTX)
        assert skipped is not None and skipped.keys_to_store == []
    out = manager.prepare_store([IDLE, PINNED, k(4), k(5)], CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.prepare_load([PINNED], CTX)
    assert manager.prepare_store([PENDING], CTX) is not None
    return manager


def populated_tiered() -> TieringOffloadingManager:
    manager = build_manager(
        {"num_blocks": 8, "block_size_bytes": BLOCK, "tiers": [{"type": "example"}]}
    )
    assert isinstance(manager, TieringOffloadingManager)
    out = manager.prepare_store([IDLE, PINNED, k(4), k(5)], CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.on_schedule_end()
    manager.prepare_load([PINNED], CTX)
    assert manager.prepare_store([PENDING], CTX) is not None
    return manager


#: The stacks every misuse case runs on ("filtered": the CPU manager with the reuse filter on).
POPULATED: dict[str, Callable[[], Any]] = {
    "cpu": populated_cpu,
    "filtered": populated_filtered,
    "tiered": populated_tiered,
}


def snapshot(manager: Any) -> tuple[Any, ...]:
    cpu = manager.primary if isinstance(manager, TieringOffloadingManager) else manager
    return (
        manager.get_stats(),
        [cpu.ref_count(key) for key in KEYS],
        [cpu.block_id(key) for key in KEYS],
        None if cpu.admission is None else list(cpu.admission.counts.items()),
    )


def cleared_ctx() -> ReqContext:
    ctx = ReqContext(req_id="x")
    ctx.req_id = None  # type: ignore[assignment]
    return ctx


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Any], object]
    error: type[KVOffloadError]
    names: str


def while_held(call: Callable[[Any], object]) -> Callable[[Any], object]:
    """``call`` while the manager's entry guard is taken, as when another thread is inside
    one of its calls (tests/cpu/test_cpu_threads.py does it with a real thread)."""

    def run(manager: Any) -> object:
        manager._entry.pop()
        try:
            return call(manager)
        finally:
            manager._entry.append(True)

    return run


MANAGER_CASES = [
    Case(
        "lookup while another thread is inside",
        while_held(lambda m: m.lookup(IDLE, CTX)),
        ConcurrentUseError,
        "lookup() was called while another thread",
    ),
    Case(
        "store while another thread is inside",
        while_held(lambda m: m.prepare_store([k(7)], CTX)),
        ConcurrentUseError,
        "prepare_store() was called while another thread",
    ),
    Case(
        "complete load while another thread is inside",
        while_held(lambda m: m.complete_load([PINNED], CTX)),
        ConcurrentUseError,
        "kv_offload.synchronized(manager)",
    ),
    Case("lookup unhashable key", lambda m: m.lookup([1], CTX), InvalidKeyError, "[1]"),
    # Issue 37 #6: a hashable value that is not bytes answered MISS silently.
    Case("lookup str key", lambda m: m.lookup("str-key", CTX), InvalidKeyError, "'str-key'"),
    Case("lookup None key", lambda m: m.lookup(None, CTX), InvalidKeyError, "None is a NoneType"),
    Case("lookup tuple key", lambda m: m.lookup((1, 2), CTX), InvalidKeyError, "(1, 2) is a tuple"),
    Case("load str key", lambda m: m.prepare_load(["k"], CTX), InvalidKeyError, "'k' is a str"),
    Case("lookup without context", lambda m: m.lookup(IDLE, None), InvalidArgumentError, "None"),
    Case("lookup str context", lambda m: m.lookup(IDLE, "req"), InvalidArgumentError, "req"),
    Case(
        "lookup cleared req_id",
        lambda m: m.lookup(IDLE, cleared_ctx()),
        InvalidArgumentError,
        "req_id",
    ),
    Case(
        "load missing key", lambda m: m.prepare_load([MISSING], CTX), KeyStateError, repr(MISSING)
    ),
    Case("load pending key", lambda m: m.prepare_load([PENDING], CTX), KeyStateError, "pending"),
    Case(
        "load duplicate keys",
        lambda m: m.prepare_load([IDLE, IDLE], CTX),
        InvalidArgumentError,
        "more than once",
    ),
    Case(
        "load single key", lambda m: m.prepare_load(IDLE, CTX), InvalidArgumentError, "pass [key]"
    ),
    Case("load non-iterable", lambda m: m.prepare_load(5, CTX), InvalidArgumentError, "5"),
    Case(
        "load idle + missing",
        lambda m: m.prepare_load([IDLE, MISSING], CTX),
        KeyStateError,
        "prepare_load",
    ),
    Case(
        "complete unpinned load",
        lambda m: m.complete_load([IDLE], CTX),
        KeyStateError,
        "complete_load",
    ),
    Case(
        "complete missing load",
        lambda m: m.complete_load([MISSING], CTX),
        KeyStateError,
        "complete_load",
    ),
    Case(
        "complete load pending",
        lambda m: m.complete_load([PENDING], CTX),
        KeyStateError,
        "complete_load",
    ),
    Case(
        "complete load pinned+idle",
        lambda m: m.complete_load([PINNED, IDLE], CTX),
        KeyStateError,
        "complete_load",
    ),
    Case(
        "complete load duplicates",
        lambda m: m.complete_load([PINNED, PINNED], CTX),
        InvalidArgumentError,
        "more than once",
    ),
    Case(
        "complete store never prepared",
        lambda m: m.complete_store([IDLE], CTX),
        KeyStateError,
        "complete_store",
    ),
    Case(
        "complete store missing",
        lambda m: m.complete_store([MISSING], CTX),
        KeyStateError,
        "complete_store",
    ),
    Case(
        "complete store duplicates",
        lambda m: m.complete_store([PENDING, PENDING], CTX),
        InvalidArgumentError,
        "more than once",
    ),
    Case(
        "complete store pending+idle",
        lambda m: m.complete_store([PENDING, IDLE], CTX),
        KeyStateError,
        "complete_store",
    ),
    Case(
        "complete store single key",
        lambda m: m.complete_store(PENDING, CTX),
        InvalidArgumentError,
        "pass [key]",
    ),
    Case("touch unhashable", lambda m: m.touch([[1]], CTX), InvalidKeyError, "[1]"),
    Case("touch single key", lambda m: m.touch(IDLE, CTX), InvalidArgumentError, "pass [key]"),
    Case(
        "store unhashable",
        lambda m: m.prepare_store([k(7), {1: 2}], CTX),
        InvalidKeyError,
        "{1: 2}",
    ),
    # Issue 37 #6: accepted, keys_to_store [k(7), 42] (a tier's job then failed on 42).
    Case(
        "store int key",
        lambda m: m.prepare_store([k(7), 42], CTX),
        InvalidKeyError,
        "key 42 is a int",
    ),
    Case(
        "store resident + str key",
        lambda m: m.prepare_store([IDLE, "k"], CTX),
        InvalidKeyError,
        "key 'k' is a str",
    ),
    Case(
        "store duplicates",
        lambda m: m.prepare_store([k(7), k(7)], CTX),
        InvalidArgumentError,
        "more than once",
    ),
    Case(
        "store single key", lambda m: m.prepare_store(k(7), CTX), InvalidArgumentError, "pass [key]"
    ),
    Case("store non-iterable", lambda m: m.prepare_store(7, CTX), InvalidArgumentError, "7"),
    Case(
        "store bad context",
        lambda m: m.prepare_store([k(7)], object()),
        InvalidArgumentError,
        "object",
    ),
    Case(
        "new request without context",
        lambda m: m.on_new_request(None),
        InvalidArgumentError,
        "None",
    ),
    Case(
        "store protected not a collection",
        lambda m: m.prepare_store([k(7)], CTX, protected=5),
        InvalidArgumentError,
        "protected",
    ),
    Case(
        "store protected unhashable",
        lambda m: m.prepare_store([k(7)], CTX, protected=[[1]]),
        InvalidKeyError,
        "[[1]]",
    ),
    Case(
        "complete store success not bool",
        lambda m: m.complete_store([PENDING], CTX, success="no"),
        InvalidArgumentError,
        "'no'",
    ),
    Case(
        "finish request bad context",
        lambda m: m.on_request_finished(object()),
        InvalidArgumentError,
        "object",
    ),
]


#: Cases that still fail on one stack: strict, so fixing the defect flips them to an error here.
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


def _manager_params() -> list[Any]:
    params = []
    for stack in POPULATED:
        for case in MANAGER_CASES:
            reason = KNOWN_DEFECTS.get((stack, case.name))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(stack, case, id=f"{stack}-{case.name}", marks=marks))
    return params


@pytest.mark.parametrize(("stack", "case"), _manager_params())
def test_manager_misuse_leaves_state_intact(stack: str, case: Case) -> None:
    manager = POPULATED[stack]()
    before = snapshot(manager)
    with pytest.raises(case.error) as raised:
        case.call(manager)
    assert case.names in str(raised.value), str(raised.value)
    assert snapshot(manager) == before
    manager.shutdown()


BUFFER_CASES = [
    ("read str slot", lambda b: b.read_blocks(["a"]), InvalidArgumentError, "'a'"),
    ("read float slot", lambda b: b.read_blocks([1.7]), InvalidArgumentError, "1.7"),
    ("read slot out of range", lambda b: b.read_blocks([99]), InvalidArgumentError, "99"),
    ("read negative slot", lambda b: b.read_blocks([-1]), InvalidArgumentError, "-1"),
    ("write wrong size", lambda b: b.write_blocks([0], b"xx"), InvalidArgumentError, "2 bytes"),
    (
        "write float slot",
        lambda b: b.write_blocks([0.5], bytes(BLOCK)),
        InvalidArgumentError,
        "0.5",
    ),
    (
        "read into wrong out",
        lambda b: b.read_blocks([0], out=np.empty(3, np.uint8)),
        InvalidArgumentError,
        "(3,)",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "names"), BUFFER_CASES, ids=[c[0] for c in BUFFER_CASES]
)
def test_buffer_misuse_leaves_bytes_intact(name: str, call: Any, error: Any, names: str) -> None:
    manager = populated_cpu()
    buffer = manager.kv_buffer
    assert buffer is not None
    buffer.write_blocks(list(range(8)), np.arange(8 * BLOCK, dtype=np.uint64).astype(np.uint8))
    before = buffer.read_blocks(list(range(8))).copy()
    with pytest.raises(error) as raised:
        call(buffer)
    assert names in str(raised.value), str(raised.value)
    assert (buffer.read_blocks(list(range(8))) == before).all()


@pytest.mark.parametrize("stack", ["cpu", "tiered"])
@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("lookup", lambda m: m.lookup(IDLE, CTX)),
        ("on_new_request", lambda m: m.on_new_request(CTX)),
        ("prepare_store", lambda m: m.prepare_store([k(7)], CTX)),
        # Issue 37: these two passed silently on a shut-down CPU manager.
        ("touch", lambda m: m.touch([IDLE], CTX)),
        ("on_request_finished", lambda m: m.on_request_finished(CTX)),
    ],
)
def test_calls_after_shutdown_raise(stack: str, operation: str, call: Any) -> None:
    """After shutdown() the cache is gone: a lookup answering MISS would be a silent lie."""
    manager = populated_cpu() if stack == "cpu" else populated_tiered()
    manager.complete_load([PINNED], CTX)
    manager.complete_store([PENDING], CTX)
    manager.shutdown()
    stats = manager.get_stats()
    with pytest.raises(ManagerError, match=f"{operation}: the manager was shut down"):
        call(manager)
    assert manager.get_stats() == stats


def test_plugin_manager_of_the_wrong_type() -> None:
    with pytest.raises(InvalidArgumentError, match=r"KVOffloadPluginManager.*got object"):
        CPUOffloadingManager(4, plugin_manager=object())  # type: ignore[arg-type]


@contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def under(name: str, value: str, call: Callable[[], object]) -> Callable[[], object]:
    """``call`` with the environment variable ``name`` set to ``value``."""

    def run() -> object:
        with environment(name, value):
            return call()

    return run


VALUE_CASES = [
    (
        "policy module_path forbidden by the environment",
        under(
            "KV_OFFLOAD_ALLOW_MODULE_PATH",
            "0",
            lambda: CPUOffloadingManager(8, cache_policy="Mine", cache_policy_module_path="kvo_x"),
        ),
        ConfigError,
        "cache_policy_module_path='kvo_x'",
    ),
    (
        "tier module_path forbidden by the environment",
        under(
            "KV_OFFLOAD_ALLOW_MODULE_PATH",
            "false",
            lambda: SecondaryTierFactory.get_tier_class({"type": "T", "module_path": "kvo_t"}),
        ),
        ConfigError,
        "module_path='kvo_t'",
    ),
    (
        "module_path switch not a boolean",
        under(
            "KV_OFFLOAD_ALLOW_MODULE_PATH",
            "sometimes",
            lambda: CachePolicyFactory.get_cache_policy_cls("Mine", "kvo_x"),
        ),
        ConfigError,
        "KV_OFFLOAD_ALLOW_MODULE_PATH='sometimes'",
    ),
    (
        "autoload switch not a boolean",
        under("KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD", "maybe", create_plugin_manager),
        ConfigError,
        "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD='maybe'",
    ),
    (
        "detector module_path forbidden by the environment",
        under(
            "KV_OFFLOAD_ALLOW_MODULE_PATH",
            "0",
            lambda: build_manager(
                {
                    "num_blocks": 8,
                    "block_size_bytes": 64,
                    "tiers": [
                        {
                            "type": "example",
                            "backpressure": {"detector": "D", "detector_module_path": "kvo_d"},
                        }
                    ],
                }
            ),
        ),
        ConfigError,
        "detector_module_path",
    ),
    ("key from str", lambda: make_offload_key("abc"), InvalidKeyError, "'abc'"),
    ("key from None", lambda: make_offload_key(None), InvalidKeyError, "None"),  # type: ignore[arg-type]
    ("key over 64 bits", lambda: make_offload_key(2**64), InvalidKeyError, str(2**64)),
    ("key negative group", lambda: make_offload_key(1, -1), InvalidKeyError, "-1"),
    ("key float", lambda: make_offload_key(1.5), InvalidKeyError, "1.5"),  # type: ignore[arg-type]
    ("context int id", lambda: ReqContext(req_id=123), InvalidArgumentError, "123"),  # type: ignore[arg-type]
    ("context None id", lambda: ReqContext(req_id=None), InvalidArgumentError, "None"),  # type: ignore[arg-type]
    ("zero blocks", lambda: CPUOffloadingManager(0), ConfigError, "0"),
    ("negative blocks", lambda: CPUOffloadingManager(-3), ConfigError, "-3"),
    ("str blocks", lambda: CPUOffloadingManager("10"), ConfigError, "'10'"),  # type: ignore[arg-type]
    (
        "unknown policy",
        lambda: CPUOffloadingManager(8, cache_policy="nope"),
        PluginNotFoundError,
        "nope",
    ),
    ("zero block size", lambda: CPUOffloadingManager(8, block_size_bytes=0), KVOffloadError, "0"),
    (
        "negative store threshold",
        lambda: CPUOffloadingManager(8, store_threshold=-1),
        ConfigError,
        "store_threshold must be >= 0",
    ),
    (
        "str store threshold",
        lambda: CPUOffloadingManager(8, store_threshold="2"),  # type: ignore[arg-type]
        ConfigError,
        "'2'",
    ),
    (
        "zero tracker size",
        lambda: CPUOffloadingManager(8, store_threshold=2, max_tracker_size=0),
        ConfigError,
        "max_tracker_size must be > 0",
    ),
    (
        "float tracker size",
        lambda: CPUOffloadingManager(8, max_tracker_size=1e5),  # type: ignore[arg-type]
        ConfigError,
        "100000.0",
    ),
    (
        "unknown policy class",
        lambda: CachePolicyFactory.get_cache_policy_cls("nope"),
        PluginNotFoundError,
        "nope",
    ),
    (
        "unknown tier class",
        lambda: SecondaryTierFactory.get_tier_class({"type": "nope"}),
        PluginNotFoundError,
        "nope",
    ),
    (
        "tier config not a mapping",
        lambda: SecondaryTierFactory.get_tier_class("example"),
        ConfigError,
        "'example'",
    ),  # type: ignore[arg-type]
    (
        "tier without type",
        lambda: SecondaryTierFactory.get_tier_class({"capacity_blocks": 3}),
        ConfigError,
        "type",
    ),
    (
        "tier bad argument",
        lambda: SecondaryTierFactory.create_secondary_tier(
            {"type": "example", "size": 3}, memoryview(bytearray(64)), OffloadingConfig(1, 64)
        ),
        ConfigError,
        "size",
    ),
    (
        "tier bad capacity",
        lambda: SecondaryTierFactory.create_secondary_tier(
            {"type": "example", "capacity_blocks": -3},
            memoryview(bytearray(64)),
            OffloadingConfig(1, 64),
        ),
        ConfigError,
        "-3",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "names"), VALUE_CASES, ids=[c[0] for c in VALUE_CASES]
)
def test_bad_values_are_clear_errors(name: str, call: Any, error: Any, names: str) -> None:
    with pytest.raises(error) as raised:
        call()
    assert names in str(raised.value), str(raised.value)


#: An fs tier directory no case creates (validation refuses the config before building).
FS_ROOT = str(Path(tempfile.gettempdir()) / "kv-offload-catalogue-never-created")


def _tier(tier: dict[str, Any]) -> dict[str, Any]:
    return {"num_blocks": 8, "block_size_bytes": 64, "tiers": [tier]}


CONFIG_CASES = [
    ("unknown key", {"num_blocks": 8, "polcy": "lru"}, "polcy"),
    ("zero blocks", {"num_blocks": 0}, "num_blocks"),
    ("str blocks", {"num_blocks": "many"}, "num_blocks"),
    ("policy not a str", {"num_blocks": 8, "policy": 5}, "policy"),
    ("unknown policy", {"num_blocks": 8, "policy": "nope"}, "nope"),
    (
        "tiers without block size",
        {"num_blocks": 8, "tiers": [{"type": "example"}]},
        "block_size_bytes",
    ),
    ("tier without type", {"num_blocks": 8, "block_size_bytes": 64, "tiers": [{}]}, "type"),
    (
        "unknown tier",
        {"num_blocks": 8, "block_size_bytes": 64, "tiers": [{"type": "nope"}]},
        "nope",
    ),
    (
        "tier bad argument",
        {"num_blocks": 8, "block_size_bytes": 64, "tiers": [{"type": "example", "size": 1}]},
        "size",
    ),
    (
        "tiers not a list",
        {"num_blocks": 8, "block_size_bytes": 64, "tiers": {"type": "example"}},
        "tiers",
    ),
    ("hooks enable not a list", {"num_blocks": 8, "hooks": {"enable": 5}}, "enable"),
    ("unknown hooks key", {"num_blocks": 8, "hooks": {"enabel": []}}, "enabel"),
    ("negative block size", {"num_blocks": 8, "block_size_bytes": -64}, "block_size_bytes"),
    # The fs and Redis tiers' validate_arguments / validate_for_stack (nothing created).
    ("fs tier without root_dir", _tier({"type": "fs", "capacity_blocks": 10}), "root_dir"),
    (
        "fs tier root_dir under a file",
        _tier({"type": "fs", "root_dir": str(Path(__file__) / "fs"), "capacity_blocks": 10}),
        "cannot be created",
    ),
    (
        "fs tier two capacities",
        _tier({"type": "fs", "root_dir": FS_ROOT, "capacity_blocks": 1, "capacity_bytes": 9999}),
        "exactly one of capacity_bytes or capacity_blocks",
    ),
    (
        "fs tier capacity below one block",
        _tier({"type": "fs", "root_dir": FS_ROOT, "capacity_bytes": 100}),
        "capacity_bytes 100",
    ),
    (
        "fs tier unknown fsync",
        _tier({"type": "fs", "root_dir": FS_ROOT, "capacity_blocks": 1, "fsync": "daily"}),
        "'daily'",
    ),
    ("redis tier not a redis url", _tier({"type": "redis", "url": "http://h:1"}), "redis://"),
    ("redis tier zero batch", _tier({"type": "redis", "batch_blocks": 0}), "batch_blocks"),
    (
        "redis tier retry bounds reversed",
        _tier({"type": "redis", "retry_after_s": 9, "max_retry_after_s": 1}),
        "max_retry_after_s",
    ),
    ("negative store threshold", {"num_blocks": 8, "store_threshold": -1}, "store_threshold"),
    ("bool store threshold", {"num_blocks": 8, "store_threshold": True}, "store_threshold"),
    ("zero tracker size", {"num_blocks": 8, "max_tracker_size": 0}, "max_tracker_size"),
    ("str tracker size", {"num_blocks": 8, "max_tracker_size": "64k"}, "max_tracker_size"),
    (
        "detector module_path with allow_module_path = false",
        {
            "allow_module_path": False,
            "num_blocks": 8,
            "block_size_bytes": 64,
            "backpressure": {"detector": "D", "detector_module_path": "kvo_d"},
            "tiers": [{"type": "example"}],
        },
        "backpressure.detector_module_path",
    ),
]


@pytest.mark.parametrize(
    ("name", "config", "names"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_bad_configs_name_the_key(name: str, config: dict[str, Any], names: str) -> None:
    with pytest.raises(KVOffloadError) as raised:
        build_manager(config)
    assert names in str(raised.value), str(raised.value)


CLI_CASES: list[tuple[str, list[str], dict[str, str], str]] = [
    # name, arguments ({dir} is a scratch directory), files to write there, fragment
    ("missing config", ["validate", "{dir}/none.toml"], {}, "none.toml"),
    ("bad TOML", ["validate", "{dir}/bad.toml"], {"bad.toml": "num_blocks = = 3\n"}, "bad.toml"),
    (
        "unknown key",
        ["validate", "{dir}/c.toml"],
        {"c.toml": "num_blocks = 8\npolcy = 'lru'\n"},
        "c.toml:2",
    ),
    ("missing trace", ["replay", "default", "{dir}/none.jsonl"], {}, "none.jsonl"),
    ("trace not JSON", ["replay", "default", "{dir}/t.jsonl"], {"t.jsonl": "{oops\n"}, "t.jsonl:1"),
    (
        "trace hash_ids not a list",
        ["replay", "default", "{dir}/t.jsonl"],
        {"t.jsonl": '{"hash_ids": 3}\n'},
        "t.jsonl:1",
    ),
    (
        "trace hash too big",
        ["replay", "default", "{dir}/t.jsonl"],
        {"t.jsonl": '{"hash_ids": [18446744073709551616]}\n'},
        "t.jsonl:1",
    ),
    (
        "trace repeated hash",
        ["replay", "default", "{dir}/t.jsonl"],
        {"t.jsonl": '{"hash_ids": [1, 1]}\n'},
        "t.jsonl:1",
    ),
    (
        "validate fs capacity below one block",
        ["validate", "{dir}/c.toml"],
        {
            "c.toml": 'num_blocks = 8\nblock_size_bytes = 64\n[[tiers]]\ntype = "fs"\n'
            'root_dir = "kvo-never-created"\ncapacity_bytes = 100\n'
        },
        "c.toml:6",
    ),
    (
        "validate redis url not redis",
        ["validate", "{dir}/c.toml"],
        {
            "c.toml": 'num_blocks = 8\nblock_size_bytes = 64\n[[tiers]]\ntype = "redis"\nurl = "http://h"\n'
        },
        "c.toml:5",
    ),
    (
        "compare unknown policy",
        ["compare", "{dir}/t.jsonl", "--policy", "nope"],
        {"t.jsonl": '{"hash_ids": [1]}\n'},
        "nope",
    ),
]


@pytest.mark.parametrize(
    ("name", "args", "files", "names"), CLI_CASES, ids=[c[0] for c in CLI_CASES]
)
def test_cli_bad_inputs_are_one_line_errors(
    tmp_path: Path, name: str, args: list[str], files: dict[str, str], names: str
) -> None:
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    proc = kvo(*(a.format(dir=tmp_path) for a in args))
    assert_one_line_error(proc, names)


def test_catalogue_size() -> None:
    """The issue asked for at least 60 distinct bad inputs through the API and the CLI."""
    total = len(MANAGER_CASES) + len(BUFFER_CASES) + len(VALUE_CASES) + len(CONFIG_CASES)
    assert total + len(CLI_CASES) >= 60
