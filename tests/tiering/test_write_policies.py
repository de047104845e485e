"""Write policies and admission per tier (kv_offload.tiering.writes, kv_offload.admission):
what each tier is written and when, through the real stack built from configs, with the
example and fs tiers, and the shipped faulty wrapper where a write must be slow.

Fault soaks of write-back tiers are in test_tier_faults.py."""

from __future__ import annotations

import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dists import ModuleFactory
from _tiers import block_bytes, key
from kv_offload import (
    ConfigError,
    LookupResult,
    PluginError,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    load_config,
)
from kv_offload.admission import StoreThreshold, build_admission, checked_admit
from kv_offload.plugins import ExperimentalPluginWarning

BLOCK = 64
HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING


def stack(tier: dict[str, Any], num_blocks: int = 8, **top: Any) -> TieringOffloadingManager:
    m = build_manager({"num_blocks": num_blocks, "block_size_bytes": BLOCK, "tiers": [tier], **top})
    assert isinstance(m, TieringOffloadingManager)
    return m


def store(m: TieringOffloadingManager, ids: list[int], req: str) -> list[bytes]:
    """One request storing blocks ``ids`` (bytes derived from the key)."""
    ctx = ReqContext(req)
    m.on_new_request(ctx)
    keys = [key(i) for i in ids]
    out = m.prepare_store(keys, ctx)
    assert out is not None
    for k, slot in zip(out.keys_to_store, out.store_spec.block_ids.tolist()):
        m.kv_buffer.array[slot] = np.frombuffer(block_bytes(k, BLOCK), np.uint8)
    m.complete_store(out.keys_to_store, ctx)
    m.on_schedule_end()
    m.on_request_finished(ctx)
    return keys


def read(m: TieringOffloadingManager, i: int, req: str, steps: int = 500) -> LookupResult:
    """Look block ``i`` up until it is not PENDING; a HIT's bytes are checked."""
    ctx = ReqContext(req)
    m.on_new_request(ctx)
    k = key(i)
    answer = m.lookup(k, ctx)
    for _ in range(steps):
        if answer is not PENDING:
            break
        m.on_schedule_end()
        time.sleep(0.001)
        answer = m.lookup(k, ctx)
    if answer is HIT:
        spec = m.prepare_load([k], ctx)
        row = m.kv_buffer.array[int(spec.block_ids[0])]
        assert row.tobytes() == block_bytes(k, BLOCK), f"wrong bytes for block {i}"
        m.complete_load([k], ctx)
    m.on_request_finished(ctx)
    return answer


# -- write-back --------------------------------------------------------------------------------


def test_write_through_writes_every_store_write_back_only_evicted_engine_blocks() -> None:
    through = stack({"type": "example"})
    back = stack({"type": "example", "write_policy": "write-back"})
    for m in (through, back):
        for r in range(6):
            store(m, [2 * r, 2 * r + 1], f"s{r}")  # 12 blocks into 8 slots: 4 evicted
        m.drain()
    assert through.tier_stats()[0].cascaded_blocks == 12
    assert back.tier_stats()[0].cascaded_blocks == 4  # only the 4 victims
    assert back.tier_stats()[0].write_policy == "write-back"
    # Every block is readable from one of the two tiers, bytes checked.
    assert all(read(back, i, f"r{i}") is HIT for i in range(12))
    # The promoted blocks came from the tier: evicting them again writes nothing more.
    cascaded = back.tier_stats()[0].cascaded_blocks
    store(back, list(range(100, 108)), "flush")  # evicts everything resident
    back.drain()
    promoted = back.tier_stats()[0].promoted_blocks
    assert promoted > 0
    # Only the engine-stored blocks among the victims were written (promoted ones were clean).
    assert back.tier_stats()[0].cascaded_blocks < cascaded + 8
    for m in (through, back):
        m.shutdown()


def test_write_back_to_a_real_fs_tier(tmp_path: Path) -> None:
    m = stack(
        {
            "type": "fs",
            "root_dir": str(tmp_path),
            "capacity_blocks": 64,
            "write_policy": "write-back",
        },
        write_back_buffer_blocks=4,
    )
    for r in range(10):
        store(m, [3 * r, 3 * r + 1, 3 * r + 2], f"s{r}")
    m.drain()
    stats = m.tier_stats()[0]
    assert stats.cascaded_blocks == 30 - 8 - stats.write_back_dropped
    assert stats.failed_cascades == 0
    hits = [read(m, i, f"r{i}") for i in range(30)]
    assert hits.count(HIT) >= 30 - stats.write_back_dropped
    m.shutdown()


def _slow_write_back(rows: int = 4) -> TieringOffloadingManager:
    """Write-back to a tier whose jobs report after 3 polls and move their bytes only then
    (``defer_transfer``): a staging row freed too early would be read after reuse."""
    return stack(
        {
            "type": "faulty",
            "inner": {"type": "example"},
            "delay_polls": 3,
            "defer_transfer": True,
            "write_policy": "write-back",
        },
        num_blocks=4,
        write_back_buffer_blocks=rows,
    )


def test_a_block_being_written_back_is_served_from_its_staging_row() -> None:
    m = _slow_write_back()
    store(m, [0, 1, 2, 3], "a")
    store(m, [4, 5], "b")  # evicts 0 and 1: staged, their writes in flight
    # Still being written (the tier has reported nothing): the lookup is a HIT, right
    # bytes, from the staging row.
    assert read(m, 0, "r0", steps=0) is HIT
    assert m.tier_stats()[0].write_back_rescued == 1
    m.drain()
    assert m.tier_stats()[0].cascaded_blocks >= 2
    # Every block is still somewhere, bytes intact.
    assert all(read(m, i, f"x{i}") is HIT for i in range(6))
    m.shutdown()


def test_an_eviction_waits_for_staging_rows_and_drops_only_what_cannot_fit() -> None:
    m = _slow_write_back(rows=2)
    store(m, [0, 1, 2, 3], "a")
    store(m, [4, 5], "b")  # 2 victims staged: both rows in use
    began = time.monotonic()
    store(m, [6, 7], "c")  # waits (polling) until the first write-backs end, then stages
    assert time.monotonic() - began < 5
    stats = m.tier_stats()[0]
    assert stats.write_back_dropped == 0
    store(m, [8, 9, 10, 11], "d")  # 4 victims, 2 rows: 2 are not written back
    m.drain()
    stats = m.tier_stats()[0]
    assert stats.write_back_dropped == 2
    assert stats.cascaded_blocks == 8 - 2
    answers = [read(m, i, f"r{i}") for i in range(12)]
    assert answers.count(HIT) == 12 - 2 and answers.count(MISS) == 2
    m.shutdown()


def test_reset_and_shutdown_wait_for_write_backs() -> None:
    m = _slow_write_back()
    store(m, [0, 1, 2, 3], "a")
    store(m, [4, 5], "b")
    m.reset_cache()  # drains: the staged blocks' writes end before the CPU tier empties
    assert not m.has_pending_work()
    assert m.tier_stats()[0].cascaded_blocks == 0  # counters restart
    assert read(m, 0, "after-reset") is HIT  # written back before the reset: promoted
    store(m, [20, 21, 22, 23], "c")
    m.shutdown()


def test_write_back_needs_staging_rows_when_built_by_hand() -> None:
    from kv_offload import CPUOffloadingManager
    from kv_offload.tiering import OffloadingConfig, TierEntry
    from kv_offload.tiering.writes import WritePolicy
    from kv_offload_example_tier import ExampleSecondaryTierManager

    primary = CPUOffloadingManager(4, block_size_bytes=BLOCK)
    assert primary.kv_buffer is not None
    tier = ExampleSecondaryTierManager(
        OffloadingConfig(4, BLOCK), primary.kv_buffer.view, "example"
    )
    with pytest.raises(ConfigError, match=r"write-back.*staging rows.*build_manager"):
        TieringOffloadingManager(primary, [TierEntry(tier, write_policy=WritePolicy.WRITE_BACK)])


# -- write-through-selective and admission -------------------------------------------------------


def test_write_through_selective_defaults_to_store_threshold() -> None:
    m = stack({"type": "example", "write_policy": "write-through-selective"}, num_blocks=4)
    store(m, [0, 1, 2, 3], "a")
    store(m, [4, 5, 6, 7], "b")  # evicts 0-3: never written (stored once)
    m.drain()
    stats = m.tier_stats()[0]
    assert stats.admission == "store-threshold"
    assert stats.cascaded_blocks == 0 and stats.refused_blocks == 8
    assert read(m, 0, "r0") is MISS
    store(m, [0, 1], "again")  # stored a second time: reused, so written through
    m.drain()
    assert m.tier_stats()[0].cascaded_blocks == 2
    m.shutdown()


ADMISSIONS = """
from kv_offload.admission import AdmissionPolicy


class EvenOnly(AdmissionPolicy):
    def __init__(self, *, capacity_blocks=None, modulus=2):
        super().__init__(capacity_blocks=capacity_blocks)
        self.modulus = modulus
        self.looked_up = []
        self.finished = []

    def admit(self, keys, req_context):
        return [int.from_bytes(k[:8], "big") % self.modulus == 0 for k in keys]

    def record_lookup(self, key, req_context):
        self.looked_up.append(key)

    def on_request_finished(self, req_context):
        self.finished.append(req_context.req_id)


class Raises(AdmissionPolicy):
    def admit(self, keys, req_context):
        raise RuntimeError("admission state corrupted")


class Ints(AdmissionPolicy):
    def admit(self, keys, req_context):
        return [1 for _ in keys]


class Short(AdmissionPolicy):
    def admit(self, keys, req_context):
        return [True]
"""


def _with_admission(make_module: ModuleFactory, name: str, **more: Any) -> TieringOffloadingManager:
    module = make_module(ADMISSIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        return stack(
            {"type": "example", "admission": name, "admission_module_path": module, **more},
            num_blocks=4,
        )


def test_an_admission_chooses_which_blocks_a_tier_writes(make_module: ModuleFactory) -> None:
    m = _with_admission(make_module, "EvenOnly", admission_options={"modulus": 2})
    store(m, [0, 1, 2, 3], "a")
    m.drain()
    stats = m.tier_stats()[0]
    assert (stats.cascaded_blocks, stats.refused_blocks, stats.admission) == (2, 2, "EvenOnly")
    admission = m.entries[0].admission
    read(m, 0, "r0")
    assert admission.looked_up == [key(0)]  # type: ignore[union-attr]
    assert "r0" in admission.finished  # type: ignore[union-attr]
    m.shutdown()


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("Raises", "raised RuntimeError: admission state corrupted"),
        ("Ints", "answered int 1"),
        ("Short", "expected a list of 4 bools"),
    ],
)
def test_a_broken_admission_is_a_plugin_error_and_loses_nothing(
    make_module: ModuleFactory, name: str, fragment: str
) -> None:
    m = _with_admission(make_module, name)
    with pytest.raises(PluginError, match=f"admission {name!r}") as info:
        store(m, [0, 1, 2, 3], "a")
    assert fragment in str(info.value)
    assert info.value.kind == "admission" and info.value.plugin == name
    m.drain()
    stats = m.tier_stats()[0]
    assert stats.cascaded_blocks == 0 and stats.admission_errors == 1
    # The CPU store stands: every block is readable, bytes intact, nothing pinned.
    assert all(read(m, i, f"r{i}") is HIT for i in range(4))
    assert m.get_stats().cpu.pinned_blocks == 0
    m.shutdown()


def test_store_threshold_admission_is_vllms_store_threshold() -> None:
    admission = build_admission("store-threshold", {"threshold": 3, "max_tracker_size": 2})
    assert isinstance(admission, StoreThreshold)
    ctx = ReqContext("r")
    a, b, c = key(1), key(2), key(3)
    assert checked_admit(admission, "store-threshold", [a, b], ctx) == []
    assert checked_admit(admission, "store-threshold", [a], ctx) == []
    assert checked_admit(admission, "store-threshold", [a, c], ctx) == [a]  # b forgotten
    assert admission.count(b) == 0 and admission.count(a) == 3


# -- bad config, each at validate with file:line -------------------------------------------------


@pytest.mark.parametrize(
    ("tier_lines", "key_line", "fragments"),
    [
        ('write_policy = "write-bak"', 4, ("write_policy", "did you mean 'write-back'")),
        (
            'admission = "store-treshold"',
            4,
            ("unknown admission", "did you mean 'store-threshold'"),
        ),
        (
            'admission = "store-threshold"\nadmission_options = { treshold = 2 }',
            5,
            ("admission_options", "treshold"),
        ),
        ("admission_options = { threshold = 2 }", 4, ("admission_options without admission",)),
        (
            'admission = "store-threshold"\nadmission_options = { threshold = 0 }',
            5,
            ("threshold must be >= 1",),
        ),
        ("admission = 3", 4, ("admission",)),
    ],
)
def test_bad_write_policy_and_admission_name_file_and_line(
    tmp_path: Path, tier_lines: str, key_line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'block_size_bytes = 64\n[[tiers]]\ntype = "example"\n' + textwrap.dedent(tier_lines) + "\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{key_line}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_write_back_staging_rows_count_in_the_memory_estimate() -> None:
    from kv_offload.config.resolve import estimate_memory

    plain = load_config(
        {"num_blocks": 64, "block_size_bytes": 4096, "tiers": [{"type": "example"}]}
    )
    back = load_config(
        {
            "num_blocks": 64,
            "block_size_bytes": 4096,
            "tiers": [{"type": "example", "write_policy": "write-back"}],
        }
    )
    assert back.staging_rows == 64  # at least 64, at most num_blocks
    assert estimate_memory(back).cpu_buffer == estimate_memory(plain).cpu_buffer + 64 * 4096
