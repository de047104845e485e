"""Every shipped kv-offload policy as ``kvo_<name>`` in a real engine, and the hook plugin."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from _configs import host_spec
from _engines import Baseline, Engines, expected
from _workloads import AGAIN, FIRST

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def shipped_policies() -> list[str]:
    """Every ``kv_offload.policies`` entry point of this repository's plugin distributions:
    a newly shipped policy is tested without editing this file."""
    names = []
    for pyproject in sorted(PLUGINS.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        names += project.get("entry-points", {}).get("kv_offload.policies", {})
    return sorted(names)


SHIPPED = shipped_policies()


def test_every_shipped_policy_is_installed() -> None:
    installed = {ep.name for ep in entry_points(group="kv_offload.policies")}
    assert len(SHIPPED) >= 6 and set(SHIPPED) <= installed, (SHIPPED, installed)


@pytest.mark.parametrize("policy", SHIPPED)
def test_policy_in_a_real_engine(policy: str, engines: Engines, baseline: Baseline) -> None:
    """The CPU tier of 64 blocks under ``kvo_<policy>`` (it evicts: the workload is bigger):
    identical greedy token ids to recompute, and vLLM counts external prefix-cache hits."""
    run = engines.run([FIRST, AGAIN], host_spec(f"kvo_{policy}"), hooks=policy == "lru")
    assert run.outputs(FIRST.name) == expected(baseline, FIRST)
    assert run.outputs(AGAIN.name) == expected(baseline, AGAIN)
    assert run.gained(AGAIN.name, "external_prefix_cache_hits", FIRST.name) > 0
    assert run.metric(AGAIN.name, "kv_offload_load_bytes") > 0
    if policy == "lru":
        # The Prometheus hook plugin, autoloaded in the engine, saw the requests vLLM's
        # manager reported finished to the policy (vLLM reports those whose state it kept).
        requests = len(FIRST.prompts) + len(AGAIN.prompts)
        hooks = run.phases[AGAIN.name]["hooks"]
        assert 0 < hooks.get("kv_offload_requests_finished_total", 0) <= requests, hooks
