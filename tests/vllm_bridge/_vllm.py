"""Import vLLM's kv_offload modules for the bridge tests, or skip them with the reason.

Two routes: a supported vLLM release installed with a CPU torch (``python3 -m nox -s vllm``),
or, where no CPU torch build exists, the smoke route of :mod:`_vllm_smoke`
(``KVO_VLLM_SMOKE_SRC`` names an unpacked vLLM wheel; torch and three other imports stubbed;
the tiering tests skipped).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

import pytest
from _vllm_smoke import SMOKE_ENV, install

SKIP_HINT = (
    "the bridge tests need a supported vLLM release with a CPU torch; `python3 -m nox -s vllm` "
    "builds that environment and runs them"
)
#: The unpacked wheel of the smoke route, or None on the real route.
SMOKE_SRC = os.environ.get(SMOKE_ENV) or None
if SMOKE_SRC is not None:
    install(SMOKE_SRC)


def require_vllm(module: str, *, needs_torch: bool = False) -> ModuleType:
    """``module`` imported, or the calling test module skipped naming why. ``needs_torch``:
    the module's tests need vLLM's real torch-backed code, so the smoke route skips them."""
    if needs_torch and SMOKE_SRC is not None:
        pytest.skip(
            f"smoke route ({SMOKE_ENV}={SMOKE_SRC}): torch is stubbed, and {module} needs the "
            f"real one; {SKIP_HINT}",
            allow_module_level=True,
        )
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken torch/vLLM install
        if os.environ.get("KVO_REQUIRE_VLLM"):  # the nox session built for these tests
            raise
        pytest.skip(
            f"vLLM is not importable here ({type(exc).__name__}: {exc}); {SKIP_HINT}",
            allow_module_level=True,
        )


def vllm_release() -> Any:
    """The :class:`kv_offload_vllm.compat.Release` of the vLLM the tests run against."""
    from kv_offload_vllm.compat import vllm_api

    return vllm_api().release


def require_release(*series: str, claim: str) -> None:
    """Skip the calling test module unless vLLM is one of ``series``: ``claim`` is stated
    against those releases' own classes (e.g. parity with their built-in policies)."""
    release = vllm_release()
    if release.series not in series:
        pytest.skip(
            f"{claim} is claimed for vLLM {', '.join(series)}; this is vLLM {release.series}",
            allow_module_level=True,
        )
