"""What the commands print as text: aligned tables and the replay report."""

from __future__ import annotations

from typing import Any

from ..config.memory import human
from ..geometry import Geometry, describe_scaling

__all__ = ["print_fleet_report", "print_replay_report", "table"]


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def print_replay_report(report: dict[str, Any], trace: object, note: str) -> None:
    """The text form of ``kv-offload replay``'s report (``--json`` prints ``report`` itself)."""
    if report["incomplete"] is not None:
        print(f"INCOMPLETE: {report['incomplete']}")
    print(
        f"config {report['config']}: policy {report['policy']!r}, {report['num_blocks']} CPU blocks"
    )
    print(f"trace {trace}: {report['requests']} requests, {report['blocks']} blocks")
    print(f"  {note}")
    _print_geometry(report)
    print(f"hit ratio        {report['hit_ratio']:.4f}")
    for tier, ratio in report["hit_ratio_by_tier"].items():
        print(f"  from {tier:<10} {ratio:.4f}")
    print(f"evictions        {report['evictions']}")
    _print_rejected(
        report["rejected_stores"], report.get("rejected_stores_too_large"), report["num_blocks"]
    )
    if report.get("timed"):
        _print_timed(report)
    else:
        print(
            f"promotions       {report['promotions']} ({report['failed_promotions']} failed, "
            f"{report['late_promotions']} landed after the replay stopped waiting)"
        )
    print(f"cascaded blocks  {report['cascaded_blocks']}")
    for tier, row in report.get("writes", {}).items():
        per_hit = row["writes_per_hit"]
        refused = f", {row['refused_blocks']} refused" if row["admission"] else ""
        dropped = (
            f", {row['write_back_dropped']} not written (no staging row)"
            if row["write_back_dropped"]
            else ""
        )
        print(
            f"  to {tier:<12} {row['write_policy']}, admission {row['admission'] or 'all'}: "
            f"{row['blocks_written']} blocks{refused}{dropped}, "
            + (f"{per_hit:.2f} writes per hit" if per_hit is not None else "no hits")
        )
    moved = report["bytes_moved"]
    print(f"bytes moved      {moved['to_tiers']:,} to tiers, {moved['from_tiers']:,} from tiers")
    if report["verified_blocks"]:
        print(
            f"bytes verified   {report['verified_blocks']} blocks read back, "
            f"{report['corrupted_blocks']} corrupted"
        )
    print(
        f"throughput       {report['blocks_per_second']:,.0f} blocks/s ({report['seconds']:.2f} s)"
    )
    if report.get("timed"):
        for tier, row in report["tiers"].items():
            print(f"tier {tier}:")
            print(
                f"  demand         {_rate(row['demand_bytes_per_s_1x'])} at 1x, "
                f"{_rate(row['demand_bytes_per_s_at_speed'])} at {report['speed']:g}x"
            )
            print(
                f"  achieved       {_rate(row['achieved_bytes_per_s'])} while busy "
                f"({row['busy_seconds']:.2f} s busy, {row['jobs']} jobs)"
            )
            print(f"  verdict        {row['verdict']}")
        if not report["engine_keeps_up"]:
            print(
                f"NOTE: the replay loop itself fell behind the trace at {report['speed']:g}x "
                f"(1% of requests admitted over {report['admission_lag_s']['p99']:.2f} s late): "
                "lower --speed for figures about the tiers"
            )
    elif report["cascaded_blocks"] or report["promotions"]:
        print(
            "NOTE: untimed replay (--speed max): tier jobs had far less time than at the "
            "trace's pace; add --speed 30 for what the tiers serve at a real pace"
        )


def _print_rejected(rejected: int, too_large: int | None, num_blocks: int) -> None:
    """Stores the CPU tier refused whole (``rejected_stores``), and why: a loss of hit ratio
    the other figures do not explain. A store of at most ``num_blocks`` blocks is refused only
    when blocks that eviction needed were pinned: by tier jobs in flight (cascades being
    written, promotions landing). ``too_large`` is ``None`` when the split is not known."""
    if not rejected:
        return
    if too_large is None:
        print(f"rejected stores  {rejected} CPU stores refused (too few idle blocks to evict)")
        return
    parts = []
    if rejected - too_large:
        parts.append(
            f"{rejected - too_large} because tier jobs in flight (cascades, promotions) pinned "
            "the CPU tier's blocks (raise num_blocks, or give the jobs time: --speed 30)"
        )
    if too_large:
        parts.append(f"{too_large} larger than the CPU tier's {num_blocks} blocks")
    print(f"rejected stores  {rejected} CPU stores refused: {'; '.join(parts)}")


def _print_timed(report: dict[str, Any]) -> None:
    print(
        f"clock            {report['speed']:g}x real time: {report['trace_seconds']:.0f} s of "
        f"trace in {report['seconds']:.1f} s, {report['steps']} engine steps"
    )
    print(f"load wait        {report['load_wait']}")
    print(
        f"promotions       {report['promotions']} landed ({report['failed_promotions']} failed), "
        f"{report['late_blocks']} blocks late (PENDING when their request stopped waiting)"
    )
    latency = report["promotion_latency_s"]
    if latency["count"]:
        print(
            f"promotion wait   p50 {latency['p50'] * 1000:.1f} ms, p99 "
            f"{latency['p99'] * 1000:.1f} ms, max {latency['max'] * 1000:.1f} ms "
            f"({latency['count']} blocks)"
        )
    print(f"dropped cascades {report['dropped_cascade_blocks']} blocks (backpressure)")


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{human(int(value))}/s"


def print_fleet_report(report: dict[str, Any], trace: object, note: str) -> None:
    """The text form of a fleet replay's report (``--engines N``)."""
    fleet = report["fleet"]
    if report["incomplete"] is not None:
        print(f"INCOMPLETE: {report['incomplete']}")
    print(
        f"config {report['config']}: policy {report['policy']!r}, {report['num_blocks']} CPU "
        f"blocks per engine"
    )
    shared = ", ".join(fleet["shared_tiers"]) or "none"
    private = ", ".join(fleet["private_tiers"]) or "none"
    print(
        f"fleet            {fleet['engines']} engines, router {fleet['router']!r}; shared "
        f"tiers: {shared}; private tiers: {private}"
    )
    if fleet["note"]:
        print(f"  note: {fleet['note']}")
    print(f"trace {trace}: {report['requests']} requests, {report['blocks']} blocks")
    print(f"  {note}")
    print(
        f"clock            {report['speed']:g}x real time: {report['trace_seconds']:.0f} s of "
        f"trace in {report['seconds']:.1f} s"
    )
    print(f"load wait        {report['load_wait']}")
    _print_geometry(report)
    print(f"hit ratio        {report['hit_ratio']:.4f}")
    for tier, ratio in report["hit_ratio_by_tier"].items():
        print(f"  from {tier:<10} {ratio:.4f}")
    print(f"shared tiers     {report['shared_tier_share']:.4f} of all blocks")
    print(f"late blocks      {report['late_blocks']}")
    _print_rejected(report.get("rejected_stores", 0), None, report["num_blocks"])
    if report["verified_blocks"]:
        print(
            f"bytes verified   {report['verified_blocks']} blocks read back, "
            f"{report['corrupted_blocks']} corrupted"
        )
    rows = []
    for row in report["engines"]:
        if row["status"] == "ok":
            rows.append(
                [
                    str(row["engine"]),
                    "ok",
                    str(row["requests"]),
                    f"{row['hit_ratio']:.4f}",
                    ", ".join(f"{t} {r:.4f}" for t, r in row["hit_ratio_by_tier"].items()),
                ]
            )
        else:
            rows.append(
                [
                    str(row["engine"]),
                    "FAILED",
                    f"{row['requests_sent']} sent, {row['lost_requests']} lost",
                    "-",
                    row["reason"],
                ]
            )
    print(table(rows, ["engine", "status", "requests", "hit ratio", "from"]))


def _print_geometry(report: dict[str, Any]) -> None:
    """The block size when one was chosen on the command line, and what was scaled."""
    geometry = report.get("geometry")
    if not geometry or geometry["source"] == "the config's block_size_bytes":
        return
    print(f"block size       {geometry['block_bytes']:,} bytes ({geometry['source']})")
    for line in describe_scaling(Geometry(**geometry)):
        print(f"  {line}")
