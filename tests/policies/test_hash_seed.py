"""Issue 29 #4: no shipped policy's decisions depend on hash randomisation. The reuse
policy's history table and its duel's sample took Python's salted ``hash`` of key bytes, so
its hit ratio changed with ``PYTHONHASHSEED`` (one seed below LRU on a held-out trace). Every
policy replays the same trace under four seeds and must reach the same hits exactly."""

from __future__ import annotations

import json

import pytest
from test_cli import TRACE, kvo

POLICIES = ["lru", "prefix-lru", "arc", "vllm-arc", "reuse", "sae"]
SEEDS = ["0", "1", "2", "12345"]


@pytest.mark.timeout(400)  # four replays of six policies: 46 s quiet, 101 s at load 15
def test_every_policy_decides_the_same_under_every_hash_seed() -> None:
    command: list[str] = ["compare", str(TRACE), "--limit", "2000", "--capacity", "1500", "--json"]
    for policy in POLICIES:
        command += ["--policy", policy]
    results = {}
    for seed in SEEDS:
        proc = kvo(*command, env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        results[seed] = {
            row["policy"]: (row["hit_ratio"], row["evictions"]) for row in json.loads(proc.stdout)
        }
    first = results[SEEDS[0]]
    assert set(first) == set(POLICIES)
    for seed in SEEDS[1:]:
        assert results[seed] == first, f"PYTHONHASHSEED={seed} changed a policy's decisions"
