"""How much memory a config's stack will allocate, estimated before anything is allocated.

The estimate adds the CPU KV buffer (``num_blocks x block_size_bytes``), the manager's
bookkeeping at full occupancy (:data:`BOOKKEEPING_BYTES_PER_BLOCK`, the order of what
``benchmarks/memory.py`` measures for the bundled policies) and what each in-memory tier
reports through :meth:`~kv_offload.tiering.SecondaryTierManager.memory_bytes`. A stack that
cannot fit in the machine's physical memory is refused with the figures, instead of failing
half-built with a bare ``MemoryError``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BOOKKEEPING_BYTES_PER_BLOCK", "MemoryEstimate", "physical_memory_bytes", "human"]

#: Bytes per CPU block the manager and its policy keep at full occupancy (slot table, ref
#: count, policy entry); LRU measures about 130, ARC up to about 350.
BOOKKEEPING_BYTES_PER_BLOCK = 150


def physical_memory_bytes() -> int | None:
    """The machine's physical memory, or ``None`` where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not on Linux/macOS
        return None


def human(n: int) -> str:
    """``5.2 GB``: decimal units, as disk and RAM sizes are usually quoted."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part of the stack; ``unbounded`` names tiers that grow without a limit."""

    cpu_buffer: int
    bookkeeping: int
    tiers: Sequence[tuple[str, int]] = ()
    unbounded: Sequence[str] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return self.cpu_buffer + self.bookkeeping + sum(b for _, b in self.tiers)

    def describe(self) -> str:
        """``5.2 GB CPU buffer + 3.0 MB bookkeeping + 52.4 GB tier 'example' = 57.6 GB``."""
        parts = [f"{human(self.cpu_buffer)} CPU buffer", f"{human(self.bookkeeping)} bookkeeping"]
        parts += [f"{human(b)} tier {name!r}" for name, b in self.tiers]
        text = " + ".join(parts) + f" = {human(self.total)}"
        if self.unbounded:
            text += f" (plus {', '.join(repr(n) for n in self.unbounded)}: unbounded)"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "cpu_buffer_bytes": self.cpu_buffer,
            "bookkeeping_bytes": self.bookkeeping,
            "tier_bytes": dict(self.tiers),
            "unbounded_tiers": list(self.unbounded),
            "total_bytes": self.total,
            "physical_memory_bytes": physical_memory_bytes(),
        }
