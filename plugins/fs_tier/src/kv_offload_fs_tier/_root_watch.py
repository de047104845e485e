"""A ``root_dir`` removed while the tier runs: noticed once, looked for again, reopened.

Someone removes the directory (a cleanup script, an unmounted volume), or part of it
(``blocks/``, a shard, ``tmp/``): the blocks in it are gone. Rather than fail each store with
its own ``ENOENT`` warning, the tier says once what is missing, drops its index (the blocks
still on disk are found again) and fails its jobs at once, and looks again at most every
:data:`ROOT_RETRY_S` seconds (only with no job in flight on the old directory). A removed
``root_dir`` is waited for, never recreated (it may be an unmounted volume's mount point); a
``root_dir`` still in place gets its layout recreated, as at start. Either way it is then
scanned like at start (a remounted volume may come back with its blocks). Directories it
replaced stay open until shutdown: I/O queued before the loss may still use their descriptors.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kv_offload.errors import ConfigError

from ._layout import RootDir
from ._scan import ScanResult, scan

__all__ = ["ROOT_RETRY_S", "RootWatch"]

logger = logging.getLogger("kv_offload.fs_tier")

#: Seconds between two looks for a removed ``root_dir``.
ROOT_RETRY_S = 1.0


class RootWatch:
    """Whether ``root_dir`` is gone, since when, and the directories it replaced."""

    def __init__(self, path: Path, block_size: int, tier: str) -> None:
        self.path = path
        self.block_size = block_size
        self.tier = tier
        #: monotonic time the directory was found removed (``None``: present)
        self.lost_since: float | None = None
        self._checked = 0.0
        self._missing: list[str] = []
        self._old: list[RootDir] = []

    @property
    def gone(self) -> bool:
        return self.lost_since is not None

    def lose(self, blocks: int, missing: list[str]) -> None:
        """Part of the directory (``missing``, from :meth:`RootDir.missing`; ``["."]``: all
        of it) was removed with ``blocks`` blocks indexed: say what, once."""
        self.lost_since = self._checked = time.monotonic()
        self._missing = missing
        if missing == ["."]:
            logger.warning(
                "tier %r: root_dir %s was removed while the tier ran (its %d blocks are "
                "gone); its jobs fail at once until the directory exists again (looked for "
                "every %.0f s)",
                self.tier,
                self.path,
                blocks,
                ROOT_RETRY_S,
            )
            return
        logger.warning(
            "tier %r: %s under root_dir %s %s removed while the tier ran (the %d blocks "
            "indexed leave the index; those still on disk are found again); its jobs fail at "
            "once until the tier has recreated what is missing, within %.0f s once no job is "
            "in flight",
            self.tier,
            ", ".join(missing),
            self.path,
            "was" if len(missing) == 1 else "were",
            blocks,
            ROOT_RETRY_S,
        )

    def reopen(self, current: RootDir, jobs_in_flight: bool) -> tuple[RootDir, ScanResult] | None:
        """While gone: the directory opened and scanned again once it exists (looked for at
        most every :data:`ROOT_RETRY_S`, and only with no job in flight on ``current``). A
        ``root_dir`` that is still the one the tier opened (only entries in it were removed)
        is the tier's: its layout is recreated. One that was removed is never recreated
        here (it may be an unmounted volume's mount point): it must come back."""
        now = time.monotonic()
        if now - self._checked < ROOT_RETRY_S or jobs_in_flight:
            return None
        self._checked = now
        if not self.path.is_dir():
            return None
        kept = current.missing() != ["."]
        if kept:
            current.release_lock()  # the new RootDir takes it again (flock is per open file)
        try:
            root = RootDir(self.path, self.block_size, self.tier)
            found = scan(root)
        except (ConfigError, OSError) as exc:
            logger.debug("tier %r: root_dir %s not usable yet: %s", self.tier, self.path, exc)
            return None
        self._old.append(current)
        recreated = f"{', '.join(self._missing)} recreated, " if kept else ""
        logger.warning(
            "tier %r: root_dir %s is back after %.1f s (%s%d blocks in it); storing again",
            self.tier,
            self.path,
            now - (self.lost_since or now),
            recreated,
            len(found.keys),
        )
        self.lost_since = None
        return root, found

    def close(self) -> None:
        """Shutdown: close the directories the current one replaced."""
        for old in self._old:
            old.close()
        self._old.clear()
