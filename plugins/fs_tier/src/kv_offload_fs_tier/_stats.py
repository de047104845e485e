"""What an fs tier counts: :class:`FsTierStats`, the figures ``get_stats()`` returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._scan import ScanResult

__all__ = ["FsTierStats", "count"]


@dataclass
class FsTierStats:
    """Counters of one fs tier since construction (``blocks`` and ``used``: now)."""

    name: str
    blocks: int = 0
    used: int = 0
    capacity: int = 0
    capacity_unit: str = "blocks"
    stores_in_flight: int = 0
    loads_in_flight: int = 0
    stored_blocks: int = 0
    already_stored_blocks: int = 0
    loaded_blocks: int = 0
    evicted_blocks: int = 0
    #: evicted block files removed from the shards (recycled for later stores or deleted)
    deleted_files: int = 0
    failed_store_jobs: int = 0
    failed_load_jobs: int = 0
    dropped_blocks: int = 0
    #: why blocks were dropped on load ("checksum", "truncated", "missing", "EIO", ...)
    drop_reasons: dict[str, int] = field(default_factory=dict)
    #: blocks that failed authentication (``auth_key_env``): unsigned, forged, swapped,
    #: signed with a secret this tier does not hold; never served (kinds in drop_reasons)
    auth_failures: int = 0
    #: failed store jobs by reason ("ENOSPC", "EACCES", "EIO", "internal", "full", ...)
    store_errors: dict[str, int] = field(default_factory=dict)
    #: empty files created ahead of stores (while the I/O threads were idle), and spare
    #: files (those and recycled evicted ones) waiting for a store now
    precreated_files: int = 0
    spare_files: int = 0
    #: times ``root_dir`` was found removed while the tier ran, and jobs failed at once
    #: while it was gone; times the disk bounded ``capacity`` (at start, or a full disk)
    root_lost: int = 0
    root_gone_jobs: int = 0
    capacity_shrinks: int = 0
    #: what the start found: blocks, leftover temporary files, files of the wrong size
    recovered_blocks: int = 0
    removed_temporary_files: int = 0
    removed_wrong_size_files: int = 0
    foreign_entries: int = 0
    startup_seconds: float = 0.0

    def job_failed(self, store: bool, kind: str) -> None:
        """A job failed: a store counted by ``kind`` in ``store_errors``, or a load."""
        if store:
            self.failed_store_jobs += 1
            count(self.store_errors, kind)
        else:
            self.failed_load_jobs += 1

    def recovered(self, scan: ScanResult) -> None:
        """What the start found in ``root_dir``."""
        self.recovered_blocks = len(scan.keys)
        self.removed_temporary_files = scan.temporary_files
        self.removed_wrong_size_files = scan.wrong_size_files
        self.foreign_entries = scan.foreign_entries

    def snapshot(self, **now: int | str) -> FsTierStats:
        """A copy, its by-reason counters too, with the current figures ``now``."""
        copy = dataclasses.replace(self, **now)  # type: ignore[arg-type]
        copy.drop_reasons = dict(self.drop_reasons)
        copy.store_errors = dict(self.store_errors)
        return copy


def count(counter: dict[str, int], kind: str) -> None:
    """One more ``kind`` in a by-reason counter (``drop_reasons``, ``store_errors``)."""
    counter[kind] = counter.get(kind, 0) + 1
