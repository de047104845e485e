"""``compare --plot``: hit ratio against CPU-tier capacity as a PNG (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import KVOffloadError

__all__ = ["plot", "pyplot"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (the optional ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KVOffloadError("--plot needs matplotlib: pip install 'kv-offload[plot]'") from None
    return plt


def plot(rows: list[dict[str, Any]], path: Path, trace: Path) -> None:
    """One line per policy, the bounds dashed; an unwritable ``path`` is a one-line error."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"belady": ("--", "black"), "infinite": (":", "grey")}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        points = sorted((r["num_blocks"], r["hit_ratio"]) for r in rows if r["policy"] == policy)
        bound = any(r.get("bound") for r in rows if r["policy"] == policy)
        if bound:  # reference lines, not policies
            style, color = styles.get(policy, ("--", "black"))
            ax.plot(*zip(*points), linestyle=style, color=color, label=f"{policy} (bound)")
        else:
            ax.plot(*zip(*points), marker="o", label=policy)
    ax.set_xlabel("CPU tier capacity (blocks)")
    ax.set_ylabel("prefix hit ratio")
    ax.set_title(f"hit ratio vs capacity: {trace.name}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as exc:
        raise KVOffloadError(f"cannot write plot {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
