"""The exporter's latency histogram against its reference, ``prometheus_client.Histogram``,
fed the same observations: the same bucket, count and sum samples."""

from __future__ import annotations

import random

from kv_offload_prometheus import DEFAULT_BUCKETS
from kv_offload_prometheus.latency import Latency, latency_family
from prometheus_client import Histogram


def samples(metrics: list) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in metrics
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_same_samples_as_prometheus_client_histogram() -> None:
    rng = random.Random(3)
    for bounds in (DEFAULT_BUCKETS, (0.5,), (0.001, 0.002, 1.0, 30.0)):
        observations = [rng.expovariate(1 / 0.01) for _ in range(2000)]
        observations += [*bounds, 0.0, 1e9, bounds[0] / 2]  # on a bound: that bucket ("le")
        reference = Histogram(
            "kv_offload_tier_job_duration_seconds",
            "reference",
            ["manager", "tier", "direction"],
            buckets=bounds,
            registry=None,
        )
        child = reference.labels("0", "example", "store")
        ours = Latency(bounds)
        for seconds in observations:
            child.observe(seconds)
            ours.observe(seconds)
        family = latency_family("kv_offload")
        buckets, total = ours.samples()
        family.add_metric(["0", "example", "store"], buckets, total)
        want = samples(list(reference.collect()))
        got = samples([family])
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
