"""Says in pytest's header which vLLM route the bridge tests run on."""

from __future__ import annotations

from _vllm import SMOKE_SRC


def pytest_report_header() -> list[str]:
    if SMOKE_SRC is None:
        return []
    return [
        f"vllm bridge: SMOKE TEST: vLLM's kv_offload sources from the unpacked wheel at "
        f"{SMOKE_SRC}, torch and three imports stubbed, tiering tests skipped"
    ]
