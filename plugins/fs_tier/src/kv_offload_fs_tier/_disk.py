"""What the disk under ``root_dir`` holds: the bound on the tier's capacity.

A capacity larger than the disk fills it, and then every store fails. So the tier measures the
disk (``statvfs``) at start and whenever a store finds it full (``ENOSPC``), and bounds the
capacity by what the disk holds for it: the blocks it has or is writing, plus the block files
the free space still takes, less 5% (:meth:`BlockIndex.fit_to_disk`). The disk is measured,
not inferred from the index: spare files of evicted blocks and files being written take room
the index does not count, and a bound taken from the index alone shrank again at every full
disk (972, 841, then 768 blocks on a disk that held 1,023). Spare files are kept within half
the 5% (:attr:`SparePool.limit`), the other half is for files in flight, so a disk the tier
alone fills bounds the capacity once per start, to the same figure at every start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ._index import BlockIndex
from ._spares import SPARE_FILES, SparePool
from ._stats import FsTierStats

__all__ = ["fit_to_disk", "free_files"]

logger = logging.getLogger("kv_offload.fs_tier")


def free_files(dir_fd: int, file_size: int) -> int | None:
    """Block files of ``file_size`` the filesystem of ``dir_fd`` has room for (bytes and, where
    it counts them, inodes); ``None`` where it reports no size (some FUSE filesystems)."""
    try:
        info = os.fstatvfs(dir_fd)
    except OSError:
        return None
    if info.f_blocks == 0:
        return None
    files = info.f_bavail * info.f_frsize // file_size
    return min(files, info.f_favail) if info.f_files else files


def fit_to_disk(
    tier: str,
    root_dir: Path,
    index: BlockIndex,
    stats: FsTierStats,
    spares: SparePool,
    free: int | None,
    full: bool,
) -> bool:
    """Bound ``index``'s capacity by the disk (``free`` block files left on it; ``full``: a
    store found it full); a shrink is logged with both figures and counted. Whether it shrank
    (then the caller evicts down to it, so later stores find room instead of failing)."""
    before = index.capacity
    shrank = index.fit_to_disk(free, full)
    headroom = index.disk_headroom()
    spares.limit = SPARE_FILES if headroom is None else min(SPARE_FILES, headroom // 2)
    if not shrank:
        return False
    logger.warning(
        "tier %r: the disk under %s %s %d %s (%d stored), below the capacity of %d: the "
        "capacity is now %d (5%% left for files in flight); free space or lower the capacity",
        tier,
        root_dir,
        "is full at" if full else "holds at most",
        index.disk,
        stats.capacity_unit,
        index.used,
        before,
        index.capacity,
    )
    stats.capacity = index.capacity
    stats.capacity_shrinks += 1
    return True
