"""What the commands print as text: aligned tables and the replay report."""

from __future__ import annotations

from typing import Any

__all__ = ["print_replay_report", "table"]


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
    print(f"hit ratio        {report['hit_ratio']:.4f}")
    for tier, ratio in report["hit_ratio_by_tier"].items():
        print(f"  from {tier:<10} {ratio:.4f}")
    print(f"evictions        {report['evictions']}")
    print(
        f"promotions       {report['promotions']} ({report['failed_promotions']} failed, "
        f"{report['late_promotions']} landed after the replay stopped waiting)"
    )
    print(f"cascaded blocks  {report['cascaded_blocks']}")
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
