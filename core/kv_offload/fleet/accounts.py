"""The dispatcher's accounts of a fleet replay: a record per engine, and the fleet's report.

Every engine is accounted for: one that died or was stopped is a ``failed`` row with its
reason and the requests it lost, and the others' results still count. Hit ratios are over the
blocks of the engines that reported; ``shared_tier_share`` is what the shared tiers served.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..replay_records import TimedRequest
from ..replay_report import latency_summary
from .engine import EngineSettings
from .plan import FleetPlan

__all__ = ["CPU", "EngineState", "fleet_report"]

CPU = "CPU"


@dataclass
class EngineState:
    index: int
    process: Any
    inbox: Any
    ready: bool = False
    sent: int = 0
    finished: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None
    stopped: str | None = None  # why the dispatcher gave up on it

    @property
    def load(self) -> int:
        return self.sent - self.finished

    @property
    def live(self) -> bool:
        return self.result is None and self.error is None and self.stopped is None

    def exit_reason(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code} before reporting"


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def fleet_report(
    engines: Sequence[EngineState],
    plan: FleetPlan,
    requests: Sequence[TimedRequest],
    settings: EngineSettings,
    seconds: float,
) -> dict[str, Any]:
    tier_names = plan.shared + plan.private
    per_engine = []
    totals: Counter[str] = Counter()
    origins: Counter[str] = Counter()
    latencies: list[float] = []
    incomplete = []
    for engine in engines:
        result = engine.result
        row: dict[str, Any] = {"engine": engine.index, "requests_sent": engine.sent}
        if result is None:
            row.update(
                status="failed",
                reason=engine.error or engine.stopped or "no result",
                lost_requests=engine.load,
            )
            per_engine.append(row)
            continue
        blocks = result["blocks"]
        by_origin = result["hits_by_origin"]
        row.update(
            status="ok",
            requests=result["requests"],
            blocks=blocks,
            hit_ratio=_ratio(result["hit_blocks"], blocks),
            hit_ratio_by_tier={
                name: _ratio(by_origin.get(name, 0), blocks) for name in [CPU, *tier_names]
            },
            late_blocks=result["late_blocks"],
            promotion_latency_s=result["promotion_latency_s"],
            corrupted_blocks=result["corrupted_blocks"],
            evictions=result["evictions"],
            tiers=result["tiers"],
        )
        if result["incomplete"]:
            row["incomplete"] = result["incomplete"]
            incomplete.append(f"engine {engine.index}: {result['incomplete']}")
        per_engine.append(row)
        for key in (
            "requests",
            "blocks",
            "hit_blocks",
            "late_blocks",
            "verified_blocks",
            "corrupted_blocks",
            "stored_blocks",
            "rejected_stores",
        ):
            totals[key] += result[key]
        origins.update(by_origin)
        latencies.extend(result["promotion_latencies"])
    blocks = totals["blocks"]
    by_tier = {name: _ratio(origins.get(name, 0), blocks) for name in [CPU, *tier_names]}
    failed = [row for row in per_engine if row["status"] != "ok"]
    trace_seconds = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return {
        "fleet": {
            "engines": len(engines),
            "router": None,  # filled in by the caller, which knows the name
            "shared_tiers": plan.shared,
            "private_tiers": plan.private,
            "note": plan.note(),
        },
        "timed": True,
        "speed": settings.speed,
        "step_seconds": settings.step_s,
        "trace_seconds": trace_seconds,
        "seconds": seconds,
        "requests": totals["requests"],
        "requests_sent": sum(e.sent for e in engines),
        "blocks": blocks,
        "hit_ratio": _ratio(totals["hit_blocks"], blocks),
        "hit_ratio_by_tier": by_tier,
        "shared_tier_share": sum(by_tier[name] for name in plan.shared),
        "late_blocks": totals["late_blocks"],
        "promotion_latency_s": latency_summary(latencies),
        "verified_blocks": totals["verified_blocks"],
        "corrupted_blocks": totals["corrupted_blocks"],
        "stored_blocks": totals["stored_blocks"],
        "rejected_stores": totals["rejected_stores"],
        "engines": per_engine,
        "failed_engines": len(failed),
        "incomplete": "; ".join(incomplete) if incomplete else None,
    }
