"""The metric families, filled from a manager's own ``get_stats()`` at scrape time.

Reading the counters the manager keeps anyway costs the request path nothing and cannot
drift from them: every counter here equals a field of ``get_stats()`` (the table in the
package README says which). Labels stay bounded: ``manager`` (at most ``max_managers``
values), ``medium`` (``CPU`` and the configured tiers), ``tier``, ``direction``, ``outcome``
and ``result`` (a few values each). No key, hash or request id is ever a label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

__all__ = ["Families"]

CPU = "CPU"


class Families:
    """One scrape's metric families; :meth:`add_stats` and :meth:`add_hook_counts` fill
    them for one manager."""

    def __init__(self, prefix: str) -> None:
        p = prefix

        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"{p}_{name}", doc, labels=["manager", *labels])

        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{p}_{name}", doc, labels=["manager", *labels])

        self.lookups = counter(
            "lookups",
            "Block lookups by medium and result (hit, miss, pending); a secondary tier is "
            "asked about CPU misses only",
            "medium",
            "result",
        )
        self.stored = counter("blocks_stored", "Blocks that became loadable in a medium", "medium")
        self.loaded = counter(
            "blocks_loaded",
            "Blocks read out of a medium (CPU: to the GPU; a tier: promoted to CPU)",
            "medium",
        )
        self.evicted = counter("blocks_evicted", "Blocks evicted to make room (CPU tier)", "medium")
        self.store_failed = counter(
            "blocks_store_failed", "Blocks whose store did not land in a medium", "medium"
        )
        self.load_failed = counter(
            "blocks_load_failed", "Blocks whose promotion from a tier failed", "medium"
        )
        self.stores_rejected = counter(
            "stores_rejected",
            "prepare_store calls refused because nothing could be evicted",
            "medium",
        )
        self.promotions_refused = counter(
            "promotions_refused",
            "Tier hits not promoted because no CPU slot could be reserved",
            "medium",
        )
        self.written = counter(
            "tier_written_bytes", "Bytes copied from the CPU tier into a secondary tier", "tier"
        )
        self.read = counter(
            "tier_read_bytes", "Bytes copied from a secondary tier into the CPU tier", "tier"
        )
        self.stores_skipped = counter(
            "stores_skipped",
            "Blocks the reuse filter did not store (offered fewer than store_threshold times)",
            "medium",
        )
        self.usage = gauge(
            "usage_ratio",
            "Share of CPU slots that cannot be evicted now: pending or pinned (vLLM's "
            "cpu_cache_usage_perc)",
            "medium",
        )
        self.read_usage = gauge(
            "read_usage_ratio",
            "Share of CPU slots pinned by a load or a cascade (vLLM's read usage)",
            "medium",
        )
        self.write_usage = gauge(
            "write_usage_ratio",
            "Share of CPU slots whose store is in flight (vLLM's write usage)",
            "medium",
        )
        self.allocation_size = HistogramMetricFamily(
            f"{p}_allocation_size_blocks",
            "CPU slots each prepare_store asked for (vLLM's cpu_allocation_size)",
            labels=["manager", "medium"],
        )
        self.capacity = gauge("capacity_blocks", "Slots of the CPU tier", "medium")
        self.resident = gauge("resident_blocks", "Blocks held by the CPU tier", "medium")
        self.free = gauge("free_blocks", "Free slots of the CPU tier", "medium")
        self.pinned = gauge(
            "pinned_blocks", "CPU blocks pinned by a load or a cascade in flight", "medium"
        )
        self.pending = gauge("pending_blocks", "CPU blocks whose store is in flight", "medium")
        self.evictable = gauge("evictable_blocks", "Idle CPU blocks that may be evicted", "medium")
        self.in_flight = gauge("tier_jobs_in_flight", "Tier jobs submitted and not yet reported")
        self.queued = gauge(
            "promotions_queued_blocks", "Blocks waiting for the step end to be promoted"
        )
        self.started = counter("requests_started", "Requests the manager was told about")
        self.finished = counter("requests_finished", "Requests the manager saw finish")
        self.jobs = counter(
            "tier_jobs",
            "Tier jobs reported, by tier, direction and outcome",
            "tier",
            "direction",
            "outcome",
        )

    def all(self) -> list[Metric]:
        return [value for value in vars(self).values() if isinstance(value, Metric)]

    def add_stats(self, label: str, stats: Any) -> None:
        """A manager's ``get_stats()``: ``OffloadingStats``, or ``TieringStats`` with the CPU
        tier's stats in ``cpu`` and one ``TierStats`` per secondary tier."""
        cpu = getattr(stats, "cpu", stats)
        m = [label, CPU]
        self.lookups.add_metric([*m, "hit"], cpu.hits)
        self.lookups.add_metric([*m, "miss"], cpu.misses)
        self.lookups.add_metric([*m, "pending"], cpu.pending)
        self.stored.add_metric(m, cpu.stored_blocks)
        self.loaded.add_metric(m, cpu.loaded_blocks)
        self.evicted.add_metric(m, cpu.evictions)
        self.store_failed.add_metric(m, cpu.failed_stores)
        self.stores_rejected.add_metric(m, cpu.rejected_stores)
        self.capacity.add_metric(m, cpu.capacity)
        self.resident.add_metric(m, cpu.resident_blocks)
        self.free.add_metric(m, cpu.free_blocks)
        self.pinned.add_metric(m, cpu.pinned_blocks)
        self.pending.add_metric(m, cpu.pending_blocks)
        self.evictable.add_metric(m, cpu.evictable_blocks)
        self.stores_skipped.add_metric(m, cpu.stores_skipped)
        self.usage.add_metric(m, cpu.usage)
        self.read_usage.add_metric(m, cpu.read_usage)
        self.write_usage.add_metric(m, cpu.write_usage)
        sizes = cpu.allocation_sizes
        self.allocation_size.add_metric(
            m,
            [(floatToGoString(le), float(n)) for le, n in sizes.cumulative()],  # type: ignore[no-untyped-call]
            float(sizes.total),
        )
        if not hasattr(stats, "tiers"):
            return
        for tier in stats.tiers:
            t = [label, tier.name]
            self.lookups.add_metric([*t, "hit"], tier.lookup_hits)
            self.lookups.add_metric([*t, "miss"], tier.lookups - tier.lookup_hits)
            self.stored.add_metric(t, tier.cascaded_blocks)
            self.loaded.add_metric(t, tier.promoted_blocks)
            self.store_failed.add_metric(t, tier.failed_cascades)
            self.load_failed.add_metric(t, tier.failed_promotions)
            self.promotions_refused.add_metric(t, tier.refused_promotions)
            self.written.add_metric(t, tier.bytes_written)
            self.read.add_metric(t, tier.bytes_read)
        self.in_flight.add_metric([label], stats.jobs_in_flight)
        self.queued.add_metric([label], stats.promotions_queued)

    def add_hook_counts(
        self, label: str, started: int, finished: int, jobs: Mapping[tuple[str, str, str], int]
    ) -> None:
        """What only the hooks tell: requests and tier jobs (``(tier, direction, outcome)``)."""
        self.started.add_metric([label], started)
        self.finished.add_metric([label], finished)
        for (tier, direction, outcome), count in sorted(jobs.items()):
            self.jobs.add_metric([label, tier, direction, outcome], count)
