"""benchmarks/policy_table.py (the comparison docs/policies.md publishes) on a tiny trace: its
rows hold the table's invariants and each policy's figures are those of a direct replay, so
the published table cannot drift from what the policies do."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kv_offload.replay import replay
from kv_offload.synthetic_trace import generate
from kv_offload.trace import MOONCAKE_BLOCK_TOKENS, read_trace
from kv_offload.trace_presets import preset

from benchmarks.policy_table import BUNDLED, main, render, shipped_policies

CAPACITIES = [64, 128]
HUGE = 1_000_000  # more than both traces' distinct blocks: left out
#: The JSON document, the tiny trace's path, the markdown printed.
Table = tuple[dict[str, Any], Path, str]


def direct_requests(trace: str, tiny: Path) -> list[tuple[ReqContext, list[OffloadKey]]]:
    """The trace's requests built here, independently of the benchmark's loader."""
    if trace == "sharegpt":
        reqs = generate(preset("sharegpt"), conversations=100, seed=3)
        ids = [r.hash_ids[: r.input_length // MOONCAKE_BLOCK_TOKENS] for r in reqs]
        return [
            (ReqContext(f"direct-{i}"), [make_offload_key(h) for h in chain])
            for i, chain in enumerate(ids)
        ]
    records = read_trace(tiny, block_tokens=MOONCAKE_BLOCK_TOKENS)
    return [(ReqContext(r.req_id), list(r.keys)) for r in records]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    tmp = tmp_path_factory.mktemp("policy_table")
    tiny = tmp / "tiny.jsonl"
    with BUNDLED.open() as source:
        tiny.write_text("".join(next(source) for _ in range(150)))
    out = tmp / "table.json"
    argv = ["--short", "--trace", str(tiny), "--trace", "sharegpt:100", "--seed", "3"]
    argv += [arg for c in (*CAPACITIES, HUGE) for arg in ("--capacity", str(c))]
    capture = tmp / "stdout.md"
    with capture.open("w") as handle, contextlib.redirect_stdout(handle):
        assert main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text()), tiny, capture.read_text()


def groups(document: dict[str, Any]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    out: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in document["rows"]:
        out.setdefault((row["trace"], row["capacity"]), {})[row["policy"]] = row
    return out


def test_every_shipped_policy_and_belady_at_every_size(table: Table) -> None:
    document, tiny, _ = table
    found = groups(document)
    assert set(found) == {(t, c) for t in (str(tiny), "sharegpt") for c in CAPACITIES}
    for rows in found.values():
        assert set(rows) == {*shipped_policies(), "Belady (offline bound)"}
        assert {"lru", "arc", "vllm-arc", "reuse", "sae", "prefix-lru"} <= set(rows)
    # A size holding every distinct block is left out, and said so.
    assert {(t, c) for t, c, _ in document["skipped"]} == {(str(tiny), HUGE), ("sharegpt", HUGE)}


def test_belady_bounds_every_policy_and_lru_closes_no_gap(table: Table) -> None:
    document, _, _ = table
    for (trace, capacity), rows in groups(document).items():
        bound = rows.pop("Belady (offline bound)")
        assert bound["bound"]
        lru = rows["lru"]
        gap = bound["hit_ratio"] - lru["hit_ratio"]
        assert gap > 0, (trace, capacity)  # these sizes do evict: a gap to close
        assert lru["gap_share"] == 0.0
        assert lru["x_lru_best"] == lru["x_lru_median"] == 1.0
        for name, row in rows.items():
            assert row["hit_ratio"] <= bound["hit_ratio"], (trace, capacity, name)
            assert not row["above_bound"]
            share = (row["hit_ratio"] - lru["hit_ratio"]) / gap
            assert row["gap_share"] == pytest.approx(share), (trace, capacity, name)
            assert row["x_lru_best"] > 0 and row["x_lru_median"] > 0


def test_hit_ratios_are_those_of_a_direct_replay(table: Table) -> None:
    document, tiny, _ = table
    for (trace, capacity), rows in groups(document).items():
        requests = direct_requests(trace, tiny)
        for name, row in rows.items():
            if row["bound"]:
                continue
            result = replay(CPUOffloadingManager(capacity, cache_policy=name), requests)
            assert row["hit_ratio"] == result.hit_ratio, (trace, capacity, name)
            moved = (result.stored_blocks + result.hit_blocks) / result.hit_blocks
            assert row["moved_per_hit"] == pytest.approx(moved), (trace, capacity, name)


def test_the_markdown_names_its_command_and_every_row(table: Table) -> None:
    document, _, text = table
    assert text.startswith("`python benchmarks/policy_table.py --short ")
    assert "--json" not in text.splitlines()[0]
    assert "*Belady (offline bound)*" in text
    for policy in shipped_policies():
        assert f"| `{policy}` |" in text
    assert text.count(" left out: all ") == len(document["skipped"]) == 2


def test_render_prints_the_same_table_from_the_json(table: Table, tmp_path: Path) -> None:
    document, _, text = table
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(document))
    rendered = tmp_path / "rendered.md"
    with rendered.open("w") as handle, contextlib.redirect_stdout(handle):
        assert main(["--render", str(saved)]) == 0
    assert rendered.read_text() == text
    # a later run's rows of a policy (not LRU's, not Belady's) replace the first run's
    keep = {"sae", "lru", "Belady (offline bound)"}
    later = {**document, "rows": [dict(r) for r in document["rows"] if r["policy"] in keep]}
    for row in later["rows"]:
        row["hit_ratio"] = 0.123456 if row["policy"] == "sae" else 0.654321
    merged = render([document, later])
    assert "0.1235" in merged and "0.6543" not in merged
    assert "its rows of `sae` replace the first run's" in merged
    # the summary: one line per policy but LRU, its rows counted against LRU's
    for policy in shipped_policies():
        if policy != "lru":
            line = next(
                x for x in text.splitlines() if x.startswith(f"| `{policy}` | ") and "/" in x
            )
            above, level, below = (int(n) for n in line.split("|")[3].split("/"))
            assert above + level + below == len(CAPACITIES) * 2
