"""Synthetic multi-turn traces in the Mooncake format, seeded and deterministic.

A trace is conversations replayed as requests. Each conversation starts with one of a few
system prompts shared across conversations, then takes turns: a turn's prompt is everything
so far (the system prompt, every earlier question and answer) plus the new question, so the
next turn's prompt is this one grown by the answer and the next question. New conversations
arrive as a Poisson process; a conversation's next turn arrives when its answer is written
(``output_length / decode_tokens_per_s``) and the user has thought (a lognormal think time),
so many conversations interleave. The parameter sets and their sources are in
:mod:`.trace_presets`.

Blocks are what a prefix cache sees (``hash_ids``, one id per ``block_tokens`` tokens,
equal ids = identical prefix blocks, the partial last block listed too, as in Mooncake's
traces): a block full in one turn keeps its id in every later turn of the conversation; the
full blocks of a shared system prompt have the same id in every conversation that uses it;
a partial block is new in every turn (its tokens are not final). Ids are numbered in order of
first appearance in the trace, as the Mooncake release remaps its hashes.

Every random draw comes from one ``numpy.random.Generator`` (PCG64) seeded with ``seed``, in
an order fixed by the conversation's index, and nothing iterates a set or a hash-ordered
structure: the same parameters and seed give the same bytes, on any ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from .errors import ConfigError
from .trace import MOONCAKE_BLOCK_TOKENS
from .trace_presets import TraceParams

__all__ = ["SyntheticRequest", "generate", "trace_lines", "write_trace"]


@dataclass(frozen=True)
class SyntheticRequest:
    """One turn of one conversation: its Mooncake fields, and which conversation and turn
    (kept out of the written trace, which carries no session id, as real traces do not)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: list[int]
    conversation: int
    turn: int
    system_prompt: int

    def record(self) -> dict[str, object]:
        """The Mooncake JSON object of the request, keys in the release's order."""
        return {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": self.hash_ids,
        }


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> float:
    """A lognormal draw with the given mean (not median) and log-sigma."""
    return float(rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma))


def _tokens(rng: np.random.Generator, mean: float, sigma: float) -> int:
    return max(1, round(_lognormal(rng, mean, sigma)))


def _turns(rng: np.random.Generator, params: TraceParams) -> int:
    if rng.random() >= params.multi_turn_share:
        return 1
    extra_mean = params.multi_turn_mean - params.min_multi_turns
    extra = int(rng.geometric(1.0 / (extra_mean + 1.0))) - 1 if extra_mean > 0 else 0
    return min(params.max_turns, params.min_multi_turns + extra)


def generate(
    params: TraceParams,
    *,
    conversations: int,
    seed: int,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> list[SyntheticRequest]:
    """The trace's requests in arrival order (ties: by conversation, then turn)."""
    for what, value in (("conversations", conversations), ("block_tokens", block_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"synthetic trace: {what} must be a positive int, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"synthetic trace: seed must be an int >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    # Internal block labels: shared system-prompt blocks first, then one counter for the rest.
    system_lengths = [
        _tokens(rng, params.system_tokens, params.system_sigma)
        for _ in range(params.system_prompts)
    ]
    system_blocks: list[list[int]] = []
    label = 0
    for length in system_lengths:
        system_blocks.append(list(range(label, label + length // block_tokens)))
        label += length // block_tokens
    weights = 1.0 / np.arange(1, params.system_prompts + 1, dtype=float) ** params.system_zipf
    weights /= weights.sum()

    requests: list[SyntheticRequest] = []
    start_s = 0.0
    for conv in range(conversations):
        start_s += float(rng.exponential(1.0 / params.conversations_per_s))
        system = int(rng.choice(params.system_prompts, p=weights))
        turns = _turns(rng, params)
        full = list(system_blocks[system])  # the conversation's full blocks so far
        context = system_lengths[system]  # tokens before this turn's question
        at_s = start_s
        for turn in range(turns):
            question = _tokens(rng, params.question_tokens, params.question_sigma)
            answer = _tokens(rng, params.answer_tokens, params.answer_sigma)
            prompt = context + question
            if turn > 0 and prompt > params.max_context_tokens:
                break  # the conversation outgrew the context window: it ends here
            grown = prompt // block_tokens - len(full)
            if grown > 0:
                full.extend(range(label, label + grown))
                label += grown
            hash_ids = list(full)
            if prompt % block_tokens:
                hash_ids.append(label)  # the partial last block: new in every turn
                label += 1
            requests.append(
                SyntheticRequest(round(at_s * 1000.0), prompt, answer, hash_ids, conv, turn, system)
            )
            context = prompt + answer
            think = float(rng.lognormal(math.log(params.think_median_s), params.think_sigma))
            at_s += answer / params.decode_tokens_per_s + think
    requests.sort(key=lambda r: (r.timestamp_ms, r.conversation, r.turn))
    return _renumbered(requests)


def _renumbered(requests: list[SyntheticRequest]) -> list[SyntheticRequest]:
    """The requests with their block labels renumbered 0, 1, ... in order of first use."""
    ids: dict[int, int] = {}
    out = []
    for r in requests:
        hash_ids = [ids.setdefault(h, len(ids)) for h in r.hash_ids]
        out.append(
            SyntheticRequest(
                r.timestamp_ms,
                r.input_length,
                r.output_length,
                hash_ids,
                r.conversation,
                r.turn,
                r.system_prompt,
            )
        )
    return out


def trace_lines(requests: Iterable[SyntheticRequest]) -> Iterable[str]:
    """The JSONL lines of the requests (each ends with a newline)."""
    for r in requests:
        yield json.dumps(r.record()) + "\n"


def write_trace(requests: Iterable[SyntheticRequest], out: Path | IO[str]) -> int:
    """Write the requests as a Mooncake JSONL trace; returns the number of lines."""
    count = 0
    if isinstance(out, Path):
        with out.open("w", encoding="utf-8", newline="\n") as handle:
            for line in trace_lines(requests):
                handle.write(line)
                count += 1
        return count
    for line in trace_lines(requests):
        out.write(line)
        count += 1
    return count
