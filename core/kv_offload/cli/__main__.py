"""``python -m kv_offload.cli``: the ``kv-offload`` command without its console script."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
