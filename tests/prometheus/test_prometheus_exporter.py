"""kv-offload-prometheus, installed as a distribution and enabled by config, scraped for real.

Each stack replays the head of the bundled Mooncake trace through a CPU tier, the example
tier and a tier that fails and holds jobs (kv-offload-faulty-tier), with real bytes. The
exporter serves ``/metrics`` on 127.0.0.1 (``port = 0``: a free port), the test fetches it
over HTTP and parses it with ``prometheus_client.parser``; every counter and gauge must
equal the manager's own ``get_stats()`` (or, for what only hooks see, a second hook plugin's
own count), and no sample may be left unexplained.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from kv_offload import ConfigError, ReqContext, TieringOffloadingManager, build_manager, load_config
from kv_offload.plugins import hookimpl
from kv_offload.replay import replay
from kv_offload.trace import read_trace
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "conversation_trace.jsonl"

Sample = tuple[str, tuple[tuple[str, str], ...]]


@pytest.fixture(scope="module")
def requests() -> list[tuple[ReqContext, list[Any]]]:
    return [(ReqContext(r.req_id), r.keys) for r in read_trace(TRACE, 600)]


def stack(settings: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A config dict: 300 CPU blocks, the example tier, a tier failing and holding jobs,
    and the exporter on a free port."""
    return {
        "num_blocks": 300,
        "block_size_bytes": 256,
        "tiers": [
            {"type": "example", "capacity_blocks": 2000},
            {
                "type": "faulty",  # kv-offload-faulty-tier around a second example tier
                "fail_rate": 0.2,
                "delay_polls": 2,
                "seed": 7,
                "inner": {"type": "example", "capacity_blocks": 2000},
            },
        ],
        "hooks": {"enable": ["prometheus"], "prometheus": {"port": 0, **(settings or {})}},
        **extra,
    }


class JobCounter:
    """A second hook plugin: what the tier-job hook reported for ``target``, counted
    independently of the exporter."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.jobs: dict[tuple[str, str, str], int] = {}
        self.seconds: dict[tuple[str, str], float] = {}

    @hookimpl
    def kv_offload_tier_job_finished(
        self, manager: Any, tier: str, direction: str, success: bool, seconds: float
    ) -> None:
        if manager is not self.target:
            return
        outcome = "success" if success else "failure"
        self.jobs[(tier, direction, outcome)] = self.jobs.get((tier, direction, outcome), 0) + 1
        self.seconds[(tier, direction)] = self.seconds.get((tier, direction), 0.0) + seconds


def scrape(url: str) -> dict[Sample, float]:
    """Every sample at ``url``, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def expected(
    manager: TieringOffloadingManager,
    label: str,
    jobs: dict[tuple[str, str, str], int],
    requests: int,
) -> dict[Sample, float]:
    """Every counter and gauge sample, written out from ``get_stats()`` field by field."""
    stats = manager.get_stats()
    cpu = stats.cpu
    out: dict[Sample, float] = {}

    def put(name: str, value: float, **labels: str) -> None:
        out[(f"kv_offload_{name}", tuple(sorted({"manager": label, **labels}.items())))] = value

    put("lookups_total", cpu.hits, medium="CPU", result="hit")
    put("lookups_total", cpu.misses, medium="CPU", result="miss")
    put("lookups_total", cpu.pending, medium="CPU", result="pending")
    put("blocks_stored_total", cpu.stored_blocks, medium="CPU")
    put("blocks_loaded_total", cpu.loaded_blocks, medium="CPU")
    put("blocks_evicted_total", cpu.evictions, medium="CPU")
    put("blocks_store_failed_total", cpu.failed_stores, medium="CPU")
    put("stores_rejected_total", cpu.rejected_stores, medium="CPU")
    put("capacity_blocks", cpu.capacity, medium="CPU")
    put("resident_blocks", cpu.resident_blocks, medium="CPU")
    put("free_blocks", cpu.free_blocks, medium="CPU")
    put("pinned_blocks", cpu.pinned_blocks, medium="CPU")
    put("pending_blocks", cpu.pending_blocks, medium="CPU")
    put("evictable_blocks", cpu.evictable_blocks, medium="CPU")
    put("stores_skipped_total", cpu.stores_skipped, medium="CPU")
    put("usage_ratio", cpu.usage, medium="CPU")
    put("read_usage_ratio", cpu.read_usage, medium="CPU")
    put("write_usage_ratio", cpu.write_usage, medium="CPU")
    for tier in stats.tiers:
        put("lookups_total", tier.lookup_hits, medium=tier.name, result="hit")
        put("lookups_total", tier.lookups - tier.lookup_hits, medium=tier.name, result="miss")
        put("blocks_stored_total", tier.cascaded_blocks, medium=tier.name)
        put("blocks_loaded_total", tier.promoted_blocks, medium=tier.name)
        put("blocks_store_failed_total", tier.failed_cascades, medium=tier.name)
        put("blocks_load_failed_total", tier.failed_promotions, medium=tier.name)
        put("promotions_refused_total", tier.refused_promotions, medium=tier.name)
        put("tier_written_bytes_total", tier.bytes_written, tier=tier.name)
        put("tier_read_bytes_total", tier.bytes_read, tier=tier.name)
    put("tier_jobs_in_flight", stats.jobs_in_flight)
    put("promotions_queued_blocks", stats.promotions_queued)
    put("requests_started_total", requests)
    put("requests_finished_total", requests)
    for (tier, direction, outcome), count in jobs.items():
        put("tier_jobs_total", count, tier=tier, direction=direction, outcome=outcome)
    return out


def split(samples: dict[Sample, float], label: str = "0") -> tuple[dict[Sample, float], dict]:
    """One manager's samples: (counters and gauges, histogram samples); also drops the
    ``_created`` timestamps prometheus_client adds to counters."""
    mine = {k: v for k, v in samples.items() if ("manager", label) in k[1]}
    histogram = {
        k: v for k, v in mine.items() if "duration_seconds" in k[0] or "allocation_size" in k[0]
    }
    rest = {k: v for k, v in mine.items() if k not in histogram and not k[0].endswith("_created")}
    return rest, histogram


def check_histogram(histogram: dict[Sample, float], jobs: JobCounter, label: str) -> None:
    name = "kv_offload_tier_job_duration_seconds"
    for (tier, direction), seconds in jobs.seconds.items():
        count = sum(n for (t, d, _), n in jobs.jobs.items() if (t, d) == (tier, direction))
        labels = {"manager": label, "tier": tier, "direction": direction}
        assert histogram[(f"{name}_count", tuple(sorted(labels.items())))] == count
        assert math.isclose(
            histogram[(f"{name}_sum", tuple(sorted(labels.items())))], seconds, rel_tol=1e-9
        )
        inf = tuple(sorted({**labels, "le": "+Inf"}.items()))
        assert histogram[(f"{name}_bucket", inf)] == count


def check_allocation_sizes(histogram: dict[Sample, float], sizes: Any, label: str) -> None:
    """The allocation-size histogram equals ``get_stats().allocation_sizes`` bucket by bucket."""
    name = "kv_offload_allocation_size_blocks"
    labels = {"manager": label, "medium": "CPU"}
    got = {
        dict(k[1])["le"]: v
        for k, v in histogram.items()
        if k[0] == f"{name}_bucket" and ("manager", label) in k[1]
    }
    want = {("+Inf" if math.isinf(le) else str(float(le))): n for le, n in sizes.cumulative()}
    assert got == want
    assert histogram[(f"{name}_count", tuple(sorted(labels.items())))] == sizes.count
    assert histogram[(f"{name}_sum", tuple(sorted(labels.items())))] == sizes.total


def replayed(
    config: dict[str, Any], requests: list[Any], **kwargs: Any
) -> tuple[Any, Any, JobCounter]:
    manager = build_manager(config, **kwargs)
    jobs = JobCounter(manager)
    manager.plugin_manager.register(jobs)
    exporter = manager.plugin_manager.get_plugin("prometheus")
    replay(manager, requests, data_plane=True)
    return manager, exporter, jobs


def test_every_counter_equals_get_stats(requests: list[Any]) -> None:
    manager, exporter, jobs = replayed(stack(), requests)
    try:
        assert isinstance(manager, TieringOffloadingManager)
        assert exporter.url.startswith("http://127.0.0.1:")
        samples, histogram = split(scrape(exporter.url))
        want = expected(manager, "0", jobs.jobs, len(requests))
        assert samples == want  # every sample explained, every value equal
        check_histogram(histogram, jobs, "0")
        check_allocation_sizes(histogram, manager.get_stats().cpu.allocation_sizes, "0")
        # The run exercised what the counters count (equality with 0 would prove little).
        stats = manager.get_stats()
        assert stats.cpu.evictions and stats.cpu.hits and stats.cpu.misses
        faulty = stats.tiers[1]
        assert faulty.failed_cascades and faulty.failed_promotions and faulty.promoted_blocks
        assert {o for (_, _, o) in jobs.jobs} == {"success", "failure"}
    finally:
        manager.shutdown()
    with pytest.raises(urllib.error.URLError):  # the last manager's shutdown stops the server
        scrape(exporter.url or "http://127.0.0.1:1/metrics")


def test_no_server_without_a_port_and_the_registry_can_be_exposed(requests: list[Any]) -> None:
    config = stack()
    del config["hooks"]["prometheus"]  # installed and enabled, no settings: the defaults
    manager, exporter, jobs = replayed(config, requests[:200])
    try:
        assert exporter.port is None and exporter.url is None
        text = prometheus_client.generate_latest(exporter.registry).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        rest, histogram = split(samples)
        assert rest == expected(manager, "0", jobs.jobs, 200)
        check_histogram(histogram, jobs, "0")
    finally:
        manager.shutdown()


def test_two_managers_share_one_exporter_with_manager_labels(requests: list[Any]) -> None:
    """One plugin manager, one exporter, one registry: the managers are told apart by the
    ``manager`` label (the lowest free value, reused after a shutdown)."""
    first, exporter, jobs_first = replayed(stack(), requests[:300])
    second, same, jobs_second = replayed(
        stack(), requests[:150], plugin_manager=first.plugin_manager
    )
    assert same is exporter
    try:
        samples = scrape(exporter.url)
        assert {dict(k[1])["manager"] for k in samples} == {"0", "1"}
        assert split(samples, "0")[0] == expected(first, "0", jobs_first.jobs, 300)
        assert split(samples, "1")[0] == expected(second, "1", jobs_second.jobs, 150)
        first.shutdown()  # its series leave the registry; the server stays up for the second
        after = scrape(exporter.url)
        assert {dict(k[1])["manager"] for k in after} == {"1"}
        assert split(after, "1")[0] == expected(second, "1", jobs_second.jobs, 150)
        third = build_manager(stack(), plugin_manager=first.plugin_manager)
        replay(third, requests[:10], data_plane=True)
        assert {dict(k[1])["manager"] for k in scrape(exporter.url)} == {"0", "1"}
        third.shutdown()
    finally:
        first.shutdown()
        second.shutdown()


def test_two_stacks_from_config_get_two_exporters(requests: list[Any]) -> None:
    a, exporter_a, jobs_a = replayed(stack(), requests[:100])
    b, exporter_b, jobs_b = replayed(stack(), requests[:50])
    try:
        assert exporter_a is not exporter_b and exporter_a.port != exporter_b.port
        rest_a, _ = split(scrape(exporter_a.url))
        rest_b, _ = split(scrape(exporter_b.url))
        assert rest_a == expected(a, "0", jobs_a.jobs, 100)
        assert rest_b == expected(b, "0", jobs_b.jobs, 50)
        with pytest.raises(ConfigError, match=r"hooks\.prometheus\.port: port \d+ is in use"):
            build_manager(stack({"port": exporter_a.port}))
    finally:
        a.shutdown()
        b.shutdown()


def test_max_managers_bounds_the_manager_label(
    requests: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    first, exporter, _ = replayed(stack({"max_managers": 1}), requests[:20])
    with caplog.at_level(logging.WARNING, "kv_offload.prometheus"):
        second, _, _ = replayed(stack(), requests[:20], plugin_manager=first.plugin_manager)
    try:
        assert {dict(k[1])["manager"] for k in scrape(exporter.url)} == {"0"}
        assert "max_managers=1" in caplog.text
    finally:
        first.shutdown()
        second.shutdown()


def test_global_registry_mount(requests: list[Any]) -> None:
    manager, _, _ = replayed(stack({"global_registry": True, "prefix": "kvo_test"}), requests[:30])
    try:
        text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
        assert 'kvo_test_requests_started_total{manager="0"} 30.0' in text
        with pytest.raises(ConfigError, match=r"hooks\.prometheus\.global_registry: .*kvo_test"):
            build_manager(stack({"global_registry": True, "prefix": "kvo_test"}))
    finally:
        manager.shutdown()
    assert "kvo_test_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


def test_labels_never_carry_keys_or_request_ids(requests: list[Any]) -> None:
    manager, exporter, _ = replayed(stack(), requests[:100])
    try:
        samples = scrape(exporter.url)
    finally:
        manager.shutdown()
    allowed = {
        "manager": {"0"},
        "medium": {"CPU", "example", "faulty"},
        "tier": {"example", "faulty"},
        "direction": {"store", "load"},
        "outcome": {"success", "failure"},
        "result": {"hit", "miss", "pending"},
    }
    for _, labels in samples:
        for name, value in labels:
            if name != "le":
                assert value in allowed[name], (name, value)


# -- bad settings: a clear error at config time, naming file, line and key ------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("buckets = [0.1, -0.5]", "buckets: buckets must be finite and > 0"),
        ("buckets = [0.0]", "buckets: buckets must be finite and > 0"),
        ("buckets = [0.5, 0.1]", "buckets: buckets must be strictly increasing, got 0.1 after 0.5"),
        ("buckets = []", "buckets: buckets must be a non-empty list"),
        ('buckets = ["fast"]', "buckets: buckets must hold numbers"),
        ("port = -1", "port: port must be in 0..65535"),
        ("port = 70000", "port: port must be in 0..65535"),
        ("port = true", "port: port must be an integer"),
        ('addr = "127.0.0.1.5"', "addr: addr must be an IP address"),
        ('addr = "bad addr"', "addr: addr must be an IP address"),
        ('prefix = "kv-offload"', "prefix: prefix must be a Prometheus metric name prefix"),
        ("max_managers = 0", "max_managers: max_managers must be an integer > 0"),
        (
            "prot = 9400",
            "prot: prot is not a setting of kv-offload-prometheus; did you mean 'port'",
        ),
    ],
)
def test_bad_settings_fail_validation(tmp_path: Path, setting: str, message: str) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(f"num_blocks = 100\n\n[hooks.prometheus]\n# the exporter\n{setting}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:5: hooks.prometheus.{message}")


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_port_in_use_fails_at_build_naming_the_port(tmp_path: Path) -> None:
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        path = tmp_path / "stack.toml"
        path.write_text(f"num_blocks = 100\n\n[hooks.prometheus]\nport = {port}\n")
        with pytest.raises(ConfigError) as info:
            build_manager(path)
    assert str(info.value).startswith(
        f"{path}:4: hooks.prometheus.port: port {port} is in use on 127.0.0.1"
    )


def test_addr_not_of_this_machine_fails_at_build_naming_addr(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this machine.
    path.write_text('num_blocks = 100\n\n[hooks.prometheus]\nport = 0\naddr = "192.0.2.1"\n')
    with pytest.raises(ConfigError) as info:
        build_manager(path)
    assert str(info.value).startswith(
        f"{path}:5: hooks.prometheus.addr: addr '192.0.2.1' is not an address of this machine"
    )


def test_settings_for_a_plugin_that_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'num_blocks = 100\n\n[hooks]\nblock = ["prometheus"]\n\n[hooks.prometheus]\nport = 0\n'
    )
    with pytest.raises(
        ConfigError, match=rf"{path}:6: hooks.prometheus: .*does not load \(it is blocked\)"
    ):
        build_manager(path)


# -- the distribution ---------------------------------------------------------------------


def test_installed_as_a_distribution_with_its_entry_point() -> None:
    dist = metadata.distribution("kv-offload-prometheus")
    (ep,) = [ep for ep in dist.entry_points if ep.group == "kv_offload.hooks"]
    assert (ep.name, ep.value) == ("prometheus", "kv_offload_prometheus")
    assert any(
        r.startswith("prometheus-client") or r.startswith("prometheus_client")
        for r in dist.requires or []
    )


def test_grafana_dashboard_queries_exported_metrics(requests: list[Any]) -> None:
    """docs/grafana-kv-offload.json is valid JSON and every metric it queries is exported."""
    dashboard = json.loads((ROOT / "docs" / "grafana-kv-offload.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"\bkv_offload_[a-z_]+", expr)}
    manager, exporter, _ = replayed(stack(), requests[:50])
    try:
        exported = {name for name, _ in scrape(exporter.url)}
    finally:
        manager.shutdown()
    assert queried and queried <= exported, queried - exported
    every_family = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in exported}
    shown = {re.sub(r"_(total|bucket)$", "", n) for n in queried}
    assert every_family - {"kv_offload_evictable_blocks", "kv_offload_promotions_refused"} <= shown


def test_scrapes_during_a_replay_parse_and_never_go_down(requests: list[Any]) -> None:
    """Scrapes run on the server's threads while the manager changes: each must parse, and
    no counter may decrease between two of them."""
    manager = build_manager(stack())
    exporter = manager.plugin_manager.get_plugin("prometheus")
    scrapes: list[dict[Sample, float]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.is_set():
            try:
                scrapes.append(scrape(exporter.url))
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)
                return
            done.wait(0.01)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        # In five parts, each waiting for a scrape after it: a fast machine could otherwise
        # finish the replay between two scrapes.
        for part in range(5):
            seen = len(scrapes)
            replay(manager, requests[part * 50 : (part + 1) * 50], data_plane=True)
            deadline = time.monotonic() + 5.0
            while len(scrapes) <= seen and not errors and time.monotonic() < deadline:
                time.sleep(0.005)
    finally:
        done.set()
        thread.join()
        manager.shutdown()
    assert not errors, errors
    assert len(scrapes) >= 3
    for before, after in itertools.pairwise(scrapes):
        for sample, value in before.items():
            if sample[0].endswith(("_total", "_count", "_sum", "_bucket")) and sample in after:
                assert after[sample] >= value, sample


class _VLLMPolicyLike:
    """A hook source as the vLLM bridge's policy adapter is one: no ``get_stats``."""


class _VLLMTierLike:
    """As the bridge's tier adapter: vLLM's ``SecondaryTierManager.get_stats`` (``None``)."""

    def get_stats(self) -> None:
        return None


def test_hook_sources_without_kv_offload_stats_export_their_hook_counts() -> None:
    """Inside vLLM the bridge fires hooks with its adapters as ``manager``: a scrape used to
    raise (``'NoneType' object has no attribute 'hits'``) and take every series down; now
    such a source exports its hook counts only."""
    from kv_offload_prometheus import PrometheusExporter, parse_settings

    exporter = PrometheusExporter(parse_settings({}))
    policy, tier = _VLLMPolicyLike(), _VLLMTierLike()
    try:
        exporter.kv_offload_request_finished(manager=policy)
        exporter.kv_offload_request_finished(manager=policy)
        exporter.kv_offload_tier_job_finished(
            manager=tier, tier="kvo_fs", direction="store", success=True, seconds=0.01
        )
        text = prometheus_client.generate_latest(exporter.registry).decode()
    finally:
        exporter.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("kv_offload_requests_finished_total", (("manager", "0"),))] == 2
    job = (("direction", "store"), ("manager", "1"), ("outcome", "success"), ("tier", "kvo_fs"))
    assert samples[("kv_offload_tier_jobs_total", job)] == 1
    assert not any(name == "kv_offload_capacity_blocks" for name, _ in samples)
