"""kv-offload-admission's admissions (always, seen-before, tinylfu, conversation-share), as
installed distributions found through ``kv_offload.admission`` entry points: what each
admits, its bounds, its option errors at ``validate`` with file:line, hash-seed independence,
and a replay through the real stack with each one (no block lost or corrupted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _tiers import key
from kv_offload import (
    ConfigError,
    LookupResult,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    load_config,
)
from kv_offload.admission import admission_registry, build_admission, checked_admit
from kv_offload_admission import ConversationShare, FrequencySketch, SeenBefore, TinyLFU

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "conversation_trace.jsonl"
CTX = ReqContext("r")
CLI = [sys.executable, "-m", "kv_offload.cli"]


def admitted(admission_name: str, keys: list[bytes], ctx: ReqContext = CTX, **options: object):
    admission = build_admission(admission_name, dict(options), capacity_blocks=4)
    return admission, checked_admit(admission, admission_name, keys, ctx)


def test_every_admission_is_an_installed_entry_point() -> None:
    found = {info.name: info for info in admission_registry.available()}
    for name in ("always", "seen-before", "tinylfu", "conversation-share"):
        assert found[name].distribution == "kv-offload-admission"
    assert found["store-threshold"].distribution == "kv-offload"


def test_always_admits_everything() -> None:
    _, out = admitted("always", [key(1), key(2)])
    assert out == [key(1), key(2)]


def test_seen_before_admits_the_second_sighting_within_its_bounded_history() -> None:
    admission = build_admission("seen-before", {"history_blocks": 2})
    assert isinstance(admission, SeenBefore)
    assert checked_admit(admission, "seen-before", [key(1), key(2)], CTX) == []
    assert checked_admit(admission, "seen-before", [key(1)], CTX) == [key(1)]
    admission.record_lookup(key(3), CTX)  # a lookup counts: 2 is forgotten (history of 2)
    assert len(admission.history) == 2
    assert checked_admit(admission, "seen-before", [key(3), key(2)], CTX) == [key(3)]


def test_seen_before_history_defaults_to_the_tier_capacity() -> None:
    assert build_admission("seen-before", capacity_blocks=7).history.size == 7  # type: ignore[attr-defined]


def test_sketch_doorkeeper_absorbs_the_first_access_and_aging_halves() -> None:
    sketch = FrequencySketch(width=64, sample_size=1000)
    k = key(1)
    assert sketch.estimate(k) == 0
    sketch.increment(k)
    assert sketch.estimate(k) == 1  # the doorkeeper only
    for _ in range(9):
        sketch.increment(k)
    assert sketch.estimate(k) == 10
    for _ in range(20):
        sketch.increment(k)
    assert sketch.estimate(k) == 16  # counters cap at 15, plus the doorkeeper
    aging = FrequencySketch(width=64, sample_size=8)
    for _ in range(7):
        aging.increment(k)
    assert aging.estimate(k) == 7
    aging.increment(k)  # the 8th sample ages the sketch: counters halved, doorkeeper emptied
    assert aging.resets == 1 and aging.estimate(k) == 3


def test_tinylfu_admits_while_there_is_room_then_only_what_beats_the_victim() -> None:
    admission = build_admission("tinylfu", {"window_blocks": 2})
    assert isinstance(admission, TinyLFU)
    assert checked_admit(admission, "tinylfu", [key(1), key(2)], CTX) == [key(1), key(2)]
    assert checked_admit(admission, "tinylfu", [key(3)], CTX) == []  # 3 is no more wanted
    for _ in range(3):
        admission.record_lookup(key(4), CTX)
    assert checked_admit(admission, "tinylfu", [key(4)], CTX) == [key(4)]  # beats LRU key 1
    assert list(admission.shadow) == [key(2), key(4)]


def test_tinylfu_needs_a_window_when_the_tier_has_no_capacity() -> None:
    with pytest.raises(ConfigError, match="window_blocks = N"):
        build_admission("tinylfu")


def test_conversation_share_writes_a_chosen_conversation_whole_and_remembers() -> None:
    admission = ConversationShare(share_percent=100, root_block=1)
    first = ReqContext("turn-1")
    keys = [key(i) for i in range(4)]
    assert admission.admit(keys, first) == [True] * 4
    none = ConversationShare(share_percent=0, root_block=1)
    assert none.admit(keys, first) == [False] * 4
    assert none.admit(keys[:2], ReqContext("turn-2")) == [True, True]  # wanted before


def test_conversation_share_chooses_by_the_root_block_so_turns_agree() -> None:
    admission = ConversationShare(share_percent=50, root_block=1)
    roots = [key(i) for i in range(200)]
    chosen = [admission.chosen([key(999), root]) for root in roots]
    assert 60 < sum(chosen) < 140  # about half
    # A later turn of the same conversation (same first blocks, more after) agrees.
    assert [admission.chosen([key(999), root, key(5), key(6)]) for root in roots] == chosen


@pytest.mark.parametrize(
    ("lines", "key_line", "fragments"),
    [
        ('admission = "seen-befor"', 5, ("did you mean 'seen-before'",)),
        ('admission = "tinylfu"\nadmission_options = { depth = 40 }', 6, ("depth must be <= 16",)),
        (
            'admission = "seen-before"\nadmission_options = { history_blocks = 0 }',
            6,
            ("seen-before option history_blocks must be >= 1",),
        ),
        (
            'admission = "conversation-share"\nadmission_options = { share_percent = 101 }',
            6,
            ("share_percent must be <= 100",),
        ),
        (
            'admission = "conversation-share"\nadmission_options = { root_block = "x" }',
            6,
            ("root_block must be an int",),
        ),
        (
            'admission = "tinylfu"\nadmission_options = { windows = 3 }',
            6,
            ("does not take the options ['windows']",),
        ),
    ],
)
def test_bad_admission_options_at_validate_with_file_and_line(
    tmp_path: Path, lines: str, key_line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'block_size_bytes = 64\n[[tiers]]\ntype = "example"\ncapacity_blocks = 100\n'
        + textwrap.dedent(lines)
        + "\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{key_line}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("name", ["always", "seen-before", "tinylfu", "conversation-share"])
def test_each_admission_in_a_real_stack_loses_nothing(name: str) -> None:
    m = build_manager(
        {
            "num_blocks": 4,
            "block_size_bytes": 64,
            "tiers": [
                {
                    "type": "example",
                    "capacity_blocks": 16,
                    "write_policy": "write-through-selective",
                    "admission": name,
                }
            ],
        }
    )
    assert isinstance(m, TieringOffloadingManager)
    for round_ in range(3):  # blocks offered again: the history-based ones admit them now
        for start in range(0, 12, 4):
            ctx = ReqContext(f"r{round_}-{start}")
            out = m.prepare_store([key(i) for i in range(start, start + 4)], ctx)
            if out is not None:
                m.complete_store(out.keys_to_store, ctx)
            m.on_request_finished(ctx)
            m.on_schedule_end()
    m.drain()
    stats = m.tier_stats()[0]
    assert stats.admission == name and stats.admission_errors == 0
    assert stats.cascaded_blocks + stats.refused_blocks > 0
    assert m.get_stats().cpu.pinned_blocks == 0
    ctx = ReqContext("reader")
    answers = [m.lookup(key(i), ctx) for i in range(12)]
    assert all(a in (LookupResult.HIT, LookupResult.PENDING, LookupResult.MISS) for a in answers)
    m.shutdown()


def _replay(config: Path, seed: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run(
        [*CLI, "replay", str(config), str(TRACE), "--json", "--no-progress", "--limit", "1500"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout)
    return report


@pytest.mark.parametrize("name", ["seen-before", "tinylfu", "conversation-share"])
def test_replays_decide_the_same_under_every_hash_seed_and_verify_every_block(
    tmp_path: Path, name: str
) -> None:
    config = tmp_path / "stack.toml"
    config.write_text(
        'num_blocks = 500\nblock_size_bytes = 64\n[[tiers]]\ntype = "example"\n'
        f'capacity_blocks = 2000\nwrite_policy = "write-through-selective"\nadmission = "{name}"\n'
    )
    reports = [_replay(config, seed) for seed in ("0", "1", "4242")]
    first = reports[0]
    assert first["corrupted_blocks"] == 0
    writes = first["writes"]["example"]  # type: ignore[index]
    assert writes["refused_blocks"] > 0 and writes["blocks_written"] > 0
    for other in reports[1:]:
        assert (other["hit_ratio"], other["writes"]) == (first["hit_ratio"], first["writes"])
