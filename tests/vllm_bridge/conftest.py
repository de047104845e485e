"""Says in pytest's header which vLLM route the bridge tests run on; vLLM's platform."""

from __future__ import annotations

import os

from _vllm import SMOKE_SRC

# vLLM picks its platform once, at the first use: a CPU-only machine must say so before any
# test module imports vLLM (the scheduler-path tests build a whole engine configuration).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def pytest_report_header() -> list[str]:
    if SMOKE_SRC is None:
        return []
    return [
        f"vllm bridge: SMOKE TEST: vLLM's kv_offload sources from the unpacked wheel at "
        f"{SMOKE_SRC}, torch and three imports stubbed, tiering tests skipped"
    ]
