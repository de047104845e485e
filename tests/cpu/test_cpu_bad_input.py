"""CPUOffloadingManager and bad input: every malformed call raises a KVOffloadError naming the
problem and leaves the manager exactly as it was (no leaked pins or slots)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from _cpu_helpers import (
    CTX,
    PENDING,
    ManagerFactory,
    assert_raises_intact,
    k,
    lookups,
    store,
)
from kv_offload import ConfigError, CPUOffloadingManager, ReqContext
from kv_offload.errors import InvalidArgumentError, InvalidKeyError, KeyStateError

# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks", [0, -1, -100])
def test_config_num_blocks_not_positive(policy: str, num_blocks: int) -> None:
    with pytest.raises(ConfigError, match="num_blocks") as info:
        CPUOffloadingManager(num_blocks, cache_policy=policy)
    assert str(num_blocks) in str(info.value)


@pytest.mark.parametrize("num_blocks", [4.0, "4", None, True, [4]])
def test_config_num_blocks_not_int(policy: str, num_blocks: object) -> None:
    with pytest.raises(ConfigError, match="num_blocks"):
        CPUOffloadingManager(num_blocks, cache_policy=policy)  # type: ignore[arg-type]


@pytest.fixture
def busy(make: ManagerFactory) -> CPUOffloadingManager:
    """k0..k2 ready (k2 pinned once), k3 pending, one slot free, k9 absent."""
    manager = make(5)
    store(manager, [k(0), k(1), k(2)])
    assert manager.prepare_store([k(3)], CTX) is not None
    manager.prepare_load([k(2)], CTX)
    lookups(manager, [k(0), k(3), k(9)])  # non-zero counters
    return manager


def test_prepare_load_missing_key(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.prepare_load([k(9)], CTX), "prepare_load", repr(k(9))
    )
    assert info.value.key == k(9)  # type: ignore[attr-defined]
    assert info.value.operation == "prepare_load"  # type: ignore[attr-defined]


def test_prepare_load_pending_key(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.prepare_load([k(3)], CTX), "prepare_load", repr(k(3))
    )
    assert info.value.key == k(3)  # type: ignore[attr-defined]


def test_complete_load_without_pin(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(0)], CTX), "complete_load", repr(k(0))
    )
    assert info.value.key == k(0)  # type: ignore[attr-defined]
    assert info.value.operation == "complete_load"  # type: ignore[attr-defined]


def test_complete_load_missing_and_pending_keys(busy: CPUOffloadingManager) -> None:
    for key in (k(9), k(3)):
        assert_raises_intact(
            busy, KeyStateError, lambda key=key: busy.complete_load([key], CTX),
            "complete_load", repr(key),
        )  # fmt: skip


def test_complete_load_more_often_than_pinned(busy: CPUOffloadingManager) -> None:
    busy.complete_load([k(2)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(2)], CTX), "complete_load", repr(k(2))
    )


def test_complete_store_never_prepared(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(9)], CTX), "complete_store",
        repr(k(9)),
    )  # fmt: skip
    assert info.value.key == k(9)  # type: ignore[attr-defined]
    assert info.value.operation == "complete_store"  # type: ignore[attr-defined]
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(9)], CTX, success=False),
        "complete_store", repr(k(9)),
    )  # fmt: skip


def test_complete_store_already_completed(busy: CPUOffloadingManager) -> None:
    for key in (k(0), k(2)):  # idle, pinned
        for success in (True, False):
            assert_raises_intact(
                busy, KeyStateError,
                lambda key=key, success=success: busy.complete_store([key], CTX, success),
                "complete_store", repr(key),
            )  # fmt: skip
    # Completing twice: the second one fails.
    busy.complete_store([k(3)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(3)], CTX), "complete_store",
        repr(k(3)),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("operation", "keys"),
    [
        ("prepare_load", [k(0), k(1), k(0)]),
        ("complete_load", [k(2), k(2)]),
        ("prepare_store", [k(5), k(6), k(5)]),
        ("prepare_store", [k(0), k(0)]),  # already stored, still a duplicate
        ("complete_store", [k(3), k(3)]),
        ("touch", [k(0), k(1), k(1)]),
    ],
)
def test_duplicate_keys(busy: CPUOffloadingManager, operation: str, keys: list[bytes]) -> None:
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidArgumentError, lambda: method(keys, CTX), operation, repr(keys[-1])
    )
    assert not isinstance(info.value, InvalidKeyError)


BAD_KEY: Any = [b"not", b"hashable"]


def test_unhashable_key_in_lookup(busy: CPUOffloadingManager) -> None:
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.lookup(BAD_KEY, CTX), "lookup", repr(BAD_KEY)
    )
    assert_raises_intact(busy, InvalidKeyError, lambda: busy.lookup({}, CTX), "lookup")


@pytest.mark.parametrize(
    ("operation", "keys"),
    [
        ("prepare_load", [k(0), BAD_KEY]),
        ("complete_load", [k(2), BAD_KEY]),
        ("prepare_store", [k(5), BAD_KEY]),
        ("complete_store", [k(3), BAD_KEY]),
        ("touch", [k(0), BAD_KEY]),
        ("prepare_load", [BAD_KEY]),
        ("prepare_store", [set()]),
    ],
)
def test_unhashable_key_in_batch(
    busy: CPUOffloadingManager, operation: str, keys: list[Any]
) -> None:
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidKeyError, lambda: method(keys, CTX), operation, repr(keys[-1])
    )
    assert isinstance(info.value, InvalidArgumentError)  # catchable as the parent


@pytest.mark.parametrize(
    "operation", ["prepare_load", "complete_load", "prepare_store", "complete_store", "touch"]
)
@pytest.mark.parametrize("keys", [k(0), 7, None], ids=["single-key", "int", "None"])
def test_a_batch_that_is_not_a_collection_of_keys(
    busy: CPUOffloadingManager, operation: str, keys: Any
) -> None:
    """A single key where a list belongs is the classic slip: named, and nothing changes."""
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidArgumentError, lambda: method(keys, CTX), operation, "collection"
    )
    if isinstance(keys, bytes):
        assert "pass [key]" in str(info.value)


def _req_id_cleared() -> ReqContext:
    """ReqContext refuses a non-str req_id; the manager still checks a context changed later."""
    ctx = ReqContext(req_id="cleared")
    ctx.req_id = None  # type: ignore[assignment]
    return ctx


BAD_CONTEXTS: list[Any] = [_req_id_cleared(), object(), None, "req-0"]


CTX_OPERATIONS = [
    "on_new_request", "lookup", "prepare_load", "complete_load", "touch", "prepare_store",
    "complete_store", "on_request_finished",
]  # fmt: skip


def _ctx_calls(manager: CPUOffloadingManager, ctx: Any) -> dict[str, Callable[[], object]]:
    return {
        "on_new_request": lambda: manager.on_new_request(ctx),
        "lookup": lambda: manager.lookup(k(0), ctx),
        "prepare_load": lambda: manager.prepare_load([k(0)], ctx),
        "complete_load": lambda: manager.complete_load([k(2)], ctx),
        "touch": lambda: manager.touch([k(0)], ctx),
        "prepare_store": lambda: manager.prepare_store([k(5)], ctx),
        "complete_store": lambda: manager.complete_store([k(3)], ctx),
        "on_request_finished": lambda: manager.on_request_finished(ctx),
    }


@pytest.mark.parametrize("ctx", BAD_CONTEXTS, ids=["req_id_none", "object", "none", "str"])
@pytest.mark.parametrize("operation", CTX_OPERATIONS)
def test_context_without_req_id(busy: CPUOffloadingManager, ctx: Any, operation: str) -> None:
    calls = _ctx_calls(busy, ctx)
    assert set(calls) == set(CTX_OPERATIONS)
    call = calls[operation]
    assert_raises_intact(busy, InvalidArgumentError, call, operation, "req_id")


def test_prepare_load_last_key_bad_pins_nothing(busy: CPUOffloadingManager) -> None:
    for last in (k(9), k(3)):  # missing, pending
        assert_raises_intact(
            busy, KeyStateError, lambda last=last: busy.prepare_load([k(0), k(1), k(2), last], CTX),
            "prepare_load", repr(last),
        )  # fmt: skip
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.prepare_load([k(0), k(1), BAD_KEY], CTX),
        "prepare_load",
    )  # fmt: skip
    assert_raises_intact(
        busy, InvalidArgumentError, lambda: busy.prepare_load([k(0), k(1), k(1)], CTX),
        "prepare_load",
    )  # fmt: skip
    assert [busy.ref_count(k(0)), busy.ref_count(k(1)), busy.ref_count(k(2))] == [0, 0, 1]


def test_complete_load_last_key_bad_unpins_nothing(busy: CPUOffloadingManager) -> None:
    busy.prepare_load([k(0), k(1)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(0), k(1), k(2), k(9)], CTX),
        "complete_load", repr(k(9)),
    )  # fmt: skip
    assert [busy.ref_count(k(0)), busy.ref_count(k(1)), busy.ref_count(k(2))] == [1, 1, 1]


def test_complete_store_last_key_bad_completes_nothing(busy: CPUOffloadingManager) -> None:
    assert busy.prepare_store([k(4)], CTX) is not None
    for success in (True, False):
        assert_raises_intact(
            busy, KeyStateError,
            lambda success=success: busy.complete_store([k(3), k(4), k(0)], CTX, success),
            "complete_store", repr(k(0)),
        )  # fmt: skip
    assert lookups(busy, [k(3), k(4)]) == [PENDING, PENDING]


def test_prepare_store_last_key_bad_allocates_nothing(busy: CPUOffloadingManager) -> None:
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.prepare_store([k(5), k(6), BAD_KEY], CTX),
        "prepare_store",
    )  # fmt: skip
    assert_raises_intact(
        busy, InvalidArgumentError, lambda: busy.prepare_store([k(5), k(6), k(5)], CTX),
        "prepare_store",
    )  # fmt: skip
    assert busy.ref_count(k(5)) is None


def test_validation_does_not_rely_on_assert(policy: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        assert False, "unreachable without -O"
        from kv_offload import CPUOffloadingManager, ReqContext
        from kv_offload.errors import KeyStateError
        m = CPUOffloadingManager(4, cache_policy={policy!r})
        ctx = ReqContext(req_id="r")
        try:
            m.prepare_load([b"missing"], ctx)
        except KeyStateError:
            pass
        else:
            sys.exit("prepare_load of a missing key did not raise under -O")
        try:
            m.complete_store([b"missing"], ctx)
        except KeyStateError:
            pass
        else:
            sys.exit("complete_store of a missing key did not raise under -O")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
