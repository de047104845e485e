"""Import vLLM's kv_offload modules for the bridge tests, or skip them with the reason."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

SKIP_HINT = (
    "the bridge tests need vLLM 0.33 with a CPU torch; `python3 -m nox -s vllm` builds that "
    "environment and runs them"
)


def require_vllm(module: str) -> ModuleType:
    """``module`` imported, or the calling test module skipped naming why."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken torch/vLLM install
        if os.environ.get("KVO_REQUIRE_VLLM"):  # the nox session built for these tests
            raise
        pytest.skip(
            f"vLLM is not importable here ({type(exc).__name__}: {exc}); {SKIP_HINT}",
            allow_module_level=True,
        )
