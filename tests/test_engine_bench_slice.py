"""benchmarks/engine_multiturn.py's trace slice: the engine's prompts and the simulator's
trace are the same requests, block for block (the premise of comparing their hit ratios)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.engine_multiturn import (
    BLOCK_TOKENS,
    TRACE,
    block_tokens,
    make_slice,
    predict,
)


def test_slice_prompts_are_the_trace_blocks(tmp_path: Path) -> None:
    chosen = make_slice(TRACE, start=0, requests=40, max_blocks=6)
    assert len(chosen.prompts) == len(chosen.lines) == 40
    tokens_of: dict[tuple[int, ...], list[int]] = {}
    for line, prompt in zip(chosen.lines, chosen.prompts):
        assert line["input_length"] == len(prompt)
        full = len(prompt) // BLOCK_TOKENS
        assert full <= 6 and len(prompt) % BLOCK_TOKENS, "a partial last block, never looked up"
        for depth in range(1, full + 1):  # equal hash-id prefixes are equal token prefixes
            key = tuple(line["hash_ids"][:depth])
            known = tokens_of.setdefault(key, prompt[: depth * BLOCK_TOKENS])
            assert known == prompt[: depth * BLOCK_TOKENS]
    blocks = {h: tuple(block_tokens(h)) for line in chosen.lines for h in line["hash_ids"]}
    assert len(set(blocks.values())) == len(blocks), "distinct hash ids, distinct tokens"
    path = tmp_path / "slice.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in chosen.lines))
    predicted = predict(path, "lru", 64, tmp_path)
    # The simulator replays exactly the full blocks the engine's prompts hold.
    assert predicted["blocks"] == chosen.full_blocks
    assert 0.0 < predicted["hit_ratio"] < 1.0
