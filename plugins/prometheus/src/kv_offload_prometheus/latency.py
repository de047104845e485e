"""The tier-job latency histogram: bucket counts kept by the hook, exposed at scrape time.

Speed: ``prometheus_client.Histogram.observe`` takes a lock per bucket and per sum and scans
the bounds in Python. Timed side by side, the tier-job hook cost 22 us with it and 7 us with
this (the request hooks: 1 us), and the replay of ``benchmarks/prometheus_overhead.py``
reports five tier jobs per request (every promotion is one), about 870 us of work: the
``Histogram`` alone was about a tenth of the replay. Here one writer (the manager's thread)
bisects the bounds in C and increments a list entry; scrapes copy the list. The reference is
``prometheus_client.Histogram`` itself: ``tests/prometheus`` feeds both the same observations
and requires the same samples.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

__all__ = ["Latency", "latency_family"]


class Latency:
    """Observations of one ``(tier, direction)``: a count per bucket (the last is ``+Inf``)
    and the sum of seconds."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: the first bound >= seconds, Prometheus' "le" (less or equal).
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, and the sum."""
        counts, total = list(self.counts), self.total  # one C-level copy: a consistent list
        buckets = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), counts):
            running += count
            buckets.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
        return buckets, total


def latency_family(prefix: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        f"{prefix}_tier_job_duration_seconds",
        "Seconds from a tier job's submission to the manager collecting its result",
        labels=["manager", "tier", "direction"],
    )
