"""kv-offload-fs-tier: a crash-safe, checksummed, persistent disk tier (entry point ``fs``).

```toml
[[tiers]]
type = "fs"
root_dir = "/mnt/nvme/kv-cache"
capacity_bytes = 200_000_000_000
fsync = "never"        # or "always"
io_threads = 4
```

See README.md for durability, the on-disk format and crash safety.
"""

from __future__ import annotations

from .layout import FORMAT_VERSION
from .tier import FileSystemTier, FsTierStats

__all__ = ["FORMAT_VERSION", "FileSystemTier", "FsTierStats"]
