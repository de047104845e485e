"""The vLLM 0.33 CPU figures through the exporter: usage, read and write usage, the reuse
filter's skipped stores and the allocation-size histogram.

A CPU-only stack built from config with the exporter enabled (no server: the registry is read
with ``generate_latest``) is driven by hand into a known state, so each exported value is
checked against a number worked out here, not only against ``get_stats()``.
"""

from __future__ import annotations

from typing import Any

import prometheus_client
from kv_offload import CPUOffloadingManager, ReqContext, build_manager, make_offload_key
from prometheus_client.parser import text_string_to_metric_families

CTX = ReqContext(req_id="usage")


def samples(manager: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exporter = manager.plugin_manager.get_plugin("prometheus")
    text = prometheus_client.generate_latest(exporter.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def cpu(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"manager": "0", "medium": "CPU", **labels}
    return (f"kv_offload_{name}", tuple(sorted(labels.items())))


def test_usage_gauges_skipped_stores_and_allocation_sizes() -> None:
    manager = build_manager(
        {"num_blocks": 10, "store_threshold": 2, "hooks": {"enable": ["prometheus"]}}
    )
    assert isinstance(manager, CPUOffloadingManager)
    try:
        manager.on_new_request(CTX)  # the exporter watches a manager from its first hook
        keys = [make_offload_key(i) for i in range(6)]
        out = manager.prepare_store(keys, CTX)  # first offer: all six skipped
        assert out is not None and out.keys_to_store == []
        out = manager.prepare_store(keys, CTX)  # second offer: stored
        assert out is not None and out.keys_to_store == keys
        manager.complete_store(keys[:4], CTX)  # 4 idle, 2 pending
        manager.prepare_load(keys[:3], CTX)  # 3 pinned, 1 idle, 2 pending
        got = samples(manager)
        assert got[cpu("stores_skipped_total")] == 6
        assert got[cpu("usage_ratio")] == 0.5  # (2 pending + 3 pinned) / 10
        assert got[cpu("write_usage_ratio")] == 0.2
        assert got[cpu("read_usage_ratio")] == 0.3
        # One prepare_store asked for slots (six of them): the bucket le=16 and above.
        assert got[cpu("allocation_size_blocks_bucket", le="4.0")] == 0
        assert got[cpu("allocation_size_blocks_bucket", le="16.0")] == 1
        assert got[cpu("allocation_size_blocks_bucket", le="+Inf")] == 1
        assert got[cpu("allocation_size_blocks_count")] == 1
        assert got[cpu("allocation_size_blocks_sum")] == 6
        stats = manager.get_stats()
        assert (stats.usage, stats.write_usage, stats.read_usage) == (0.5, 0.2, 0.3)
    finally:
        manager.shutdown()


def test_filter_off_exports_zero_skipped_stores() -> None:
    manager = build_manager({"num_blocks": 4, "hooks": {"enable": ["prometheus"]}})
    try:
        manager.on_new_request(CTX)
        out = manager.prepare_store([make_offload_key(1)], CTX)
        assert out is not None and len(out.keys_to_store) == 1
        got = samples(manager)
        assert got[cpu("stores_skipped_total")] == 0
        assert got[cpu("write_usage_ratio")] == 0.25
        assert got[cpu("allocation_size_blocks_bucket", le="1.0")] == 1
    finally:
        manager.shutdown()
