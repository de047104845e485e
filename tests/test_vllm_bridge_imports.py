"""kv-offload-vllm's modules import without vLLM (vLLM is imported when it asks for a class):
this runs in the default suite, where vLLM is not installed."""

from __future__ import annotations

import importlib

import pytest

MODULES = ["compat", "host", "host_worker", "policies", "policy_adapter", "tier_adapter", "tiers"]


@pytest.mark.parametrize("module", MODULES)
def test_bridge_module_imports_without_vllm(module: str) -> None:
    importlib.import_module(f"kv_offload_vllm.{module}")


def test_host_spec_names_are_the_documented_ones() -> None:
    host = importlib.import_module("kv_offload_vllm.host")
    assert host.HOST_SPEC_MODULE_PATH == "kv_offload_vllm.host"
    assert {"HostOffloadingSpec", "HostTieringOffloadingSpec"} <= set(host.__all__)
