"""The synthetic multi-turn traces: deterministic to the byte (any ``PYTHONHASHSEED``), read
by the project's own trace reader, shaped as conversations (each turn's prompt is the last
one's blocks grown by the answer and the new question; system prompts shared), and with the
statistics of their parameter set."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from _dists import _clean_env
from kv_offload.errors import ConfigError
from kv_offload.synthetic_trace import SyntheticRequest, generate, write_trace
from kv_offload.trace import arrival_seconds, read_trace
from kv_offload.trace_presets import PRESETS, preset

BLOCK = 512


def _bytes(requests: list[SyntheticRequest]) -> bytes:
    out = io.StringIO()
    write_trace(requests, out)
    return out.getvalue().encode()


def _conversations(requests: list[SyntheticRequest]) -> dict[int, list[SyntheticRequest]]:
    by_conv: dict[int, list[SyntheticRequest]] = defaultdict(list)
    for r in requests:
        by_conv[r.conversation].append(r)
    return by_conv


@pytest.mark.parametrize("name", list(PRESETS))
def test_same_seed_same_bytes_other_seed_other_bytes(name: str) -> None:
    params = preset(name)
    first = _bytes(generate(params, conversations=60, seed=7))
    assert first == _bytes(generate(params, conversations=60, seed=7))
    assert first != _bytes(generate(params, conversations=60, seed=8))


def _script() -> str | None:
    candidate = Path(sys.executable).parent / "kv-offload"
    return str(candidate) if candidate.is_file() else shutil.which("kv-offload")


@pytest.mark.skipif(_script() is None, reason="no kv-offload console script installed")
def test_the_command_writes_the_same_bytes_whatever_the_hash_seed(tmp_path: Path) -> None:
    script = _script()
    assert script is not None
    children = []
    for hash_seed in ("0", "1", "12345"):
        out = tmp_path / f"trace-{hash_seed}.jsonl"
        argv = [script, "trace", "generate", "sharegpt", "--conversations", "150"]
        env = {**_clean_env(), "PYTHONHASHSEED": hash_seed}
        children.append((out, subprocess.Popen([*argv, "--seed", "3", "-o", str(out)], env=env)))
    for _, child in children:
        assert child.wait(timeout=120) == 0
    outputs = [out.read_bytes() for out, _ in children]
    assert outputs[0] == outputs[1] == outputs[2]
    expected = _bytes(generate(preset("sharegpt"), conversations=150, seed=3))
    assert outputs[0] == expected  # the command writes what the module generates
    env = {**_clean_env(), "PYTHONHASHSEED": "0"}
    stdout = subprocess.run(
        [script, "trace", "generate", "sharegpt", "--conversations", "150", "--seed", "3"],
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout
    assert stdout == expected


@pytest.mark.skipif(_script() is None, reason="no kv-offload console script installed")
def test_an_unknown_parameter_set_is_a_one_line_usage_error() -> None:
    script = _script()
    assert script is not None
    proc = subprocess.run(
        [script, "trace", "generate", "nope"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "invalid choice: 'nope'" in proc.stderr and "sharegpt" in proc.stderr
    with pytest.raises(ConfigError, match=r"unknown trace preset 'nope'.*sharegpt"):
        preset("nope")


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_project_reader_accepts_the_trace(name: str, tmp_path: Path) -> None:
    requests = generate(preset(name), conversations=40, seed=1)
    path = tmp_path / "t.jsonl"
    assert write_trace(requests, path) == len(requests)
    read = list(read_trace(path, block_tokens=BLOCK))
    assert len(read) == len(requests)
    arrivals = arrival_seconds(read, path)  # in arrival order: a timed replay takes it
    assert arrivals == [r.timestamp_ms / 1000.0 for r in requests]
    for line, (got, want) in enumerate(zip(read, requests), start=1):
        assert len(got.keys) == want.input_length // BLOCK
        assert got.partial_blocks == (1 if want.input_length % BLOCK else 0)
        record = json.loads(path.read_text().splitlines()[line - 1])
        assert list(record) == ["timestamp", "input_length", "output_length", "hash_ids"]
        assert len(record["hash_ids"]) == -(-want.input_length // BLOCK)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_turn_grows_the_last_one_by_its_answer_and_a_question(name: str) -> None:
    requests = generate(preset(name), conversations=80, seed=2)
    seen: set[int] = set()
    for turns in _conversations(requests).values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        for before, after in pairwise(turns):
            assert after.timestamp_ms > before.timestamp_ms
            assert after.input_length > before.input_length + before.output_length
            assert after.system_prompt == before.system_prompt
            kept = before.input_length // BLOCK  # the full blocks keep their ids
            assert after.hash_ids[:kept] == before.hash_ids[:kept]
            if before.input_length % BLOCK:  # a partial block's tokens were not final
                assert before.hash_ids[kept] not in after.hash_ids
    for r in requests:  # ids are numbered in order of first appearance
        fresh = [h for h in r.hash_ids if h not in seen]
        assert fresh == list(range(len(seen), len(seen) + len(fresh)))
        seen.update(fresh)


def _common_head(chains: list[list[int]]) -> list[int]:
    head = chains[0]
    for chain in chains[1:]:
        same = 0
        while same < min(len(head), len(chain)) and head[same] == chain[same]:
            same += 1
        head = head[:same]
    return head


def test_system_prompts_are_shared_across_conversations_and_only_theirs() -> None:
    params = preset("agent")  # about 11 full blocks of system prompt
    requests = generate(params, conversations=60, seed=4)
    firsts = [turns[0] for turns in _conversations(requests).values()]
    by_prompt: dict[int, list[SyntheticRequest]] = defaultdict(list)
    for r in firsts:
        by_prompt[r.system_prompt].append(r)
    assert len(by_prompt) > 1
    shared_heads: set[int] = set()
    first_blocks = set()
    for group in by_prompt.values():
        assert len(group) > 1, "every agent system prompt is popular enough to be reused"
        head = _common_head([r.hash_ids for r in group])
        assert len(head) >= 8
        shared_heads.update(head)
        first_blocks.add(head[0])
    assert len(first_blocks) == len(by_prompt)  # another prompt, other blocks
    # Past its system prompt, a conversation shares no block with another.
    owners: dict[int, set[int]] = defaultdict(set)
    for r in requests:
        for h in r.hash_ids:
            owners[h].add(r.conversation)
    shared = {h for h, convs in owners.items() if len(convs) > 1}
    assert shared == shared_heads


def _near(sample: list[int], expected: float, what: str) -> None:
    """The sample's mean is within four standard errors of ``expected`` (a test that fails
    about once in 16,000 runs by chance; the seed is fixed, so it either passes or not)."""
    mean = statistics.fmean(sample)
    bound = 4 * statistics.stdev(sample) / len(sample) ** 0.5
    assert abs(mean - expected) <= bound, f"{what}: {mean:.3f}, not {expected} +- {bound:.3f}"


def test_the_sharegpt_set_is_calibrated_to_the_published_figures() -> None:
    params = preset("sharegpt")
    assert params.multi_turn_share == 0.73  # CachedAttention (ATC'24)
    assert params.mean_turns == pytest.approx(3.51)  # LMSYS-Chat-1M's table of ShareGPT
    assert preset("chat-short").mean_turns == pytest.approx(2.0)  # LMSYS-Chat-1M itself


@pytest.mark.parametrize(
    ("name", "conversations"), [("sharegpt", 3000), ("chat-short", 3000), ("agent", 200)]
)
def test_the_statistics_are_the_parameter_sets(name: str, conversations: int) -> None:
    params = preset(name)
    requests = generate(params, conversations=conversations, seed=11)
    convs = _conversations(requests)
    assert len(convs) == conversations
    turns = [len(t) for t in convs.values()]
    _near(turns, params.mean_turns, "turns per conversation")
    multi = [int(t > 1) for t in turns]
    _near(multi, params.multi_turn_share, "share of multi-turn conversations")
    assert min(turns) == (1 if params.multi_turn_share < 1 else params.min_multi_turns)
    _near([r.output_length for r in requests], params.answer_tokens, "answer tokens")
    questions = [
        after.input_length - before.input_length - before.output_length
        for t in convs.values()
        for before, after in pairwise(t)
    ]
    _near(questions, params.question_tokens, "question tokens")
    starts = sorted(t[0].timestamp_ms for t in convs.values())
    gaps = [(b - a) / 1000.0 for a, b in pairwise(starts)]
    _near(gaps, 1.0 / params.conversations_per_s, "seconds between new conversations")


def test_sessions_interleave() -> None:
    requests = generate(preset("sharegpt"), conversations=300, seed=5)
    switches = sum(1 for a, b in pairwise(requests) if a.conversation != b.conversation)
    assert switches > 0.9 * len(requests)  # consecutive requests are mostly other sessions'


def test_bad_arguments_are_config_errors() -> None:
    params = preset("sharegpt")
    for kwargs in ({"conversations": 0, "seed": 0}, {"conversations": 5, "seed": -1}):
        with pytest.raises(ConfigError, match="synthetic trace"):
            generate(params, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_tokens must be a positive int"):
        generate(params, conversations=5, seed=0, block_tokens=0)
    with pytest.raises(ConfigError, match="multi_turn_share must be in"):
        dataclasses.replace(params, multi_turn_share=1.5)
    with pytest.raises(ConfigError, match="think_sigma must be >= 0"):
        dataclasses.replace(params, think_sigma=-1.0)
