"""The smoke route: vLLM 0.33's scheduler-side kv_offload sources, from its wheel, without torch.

Where no CPU build of torch is available the nox ``vllm`` session cannot install vLLM's real
environment. It then unpacks the vLLM 0.33.0 wheel (its Python files and metadata) and sets
``KVO_VLLM_SMOKE_SRC`` to the unpacked directory: :func:`install` makes ``import vllm.<...>``
load the wheel's own files without running any package ``__init__`` (``vllm/__init__.py`` pulls
in torch and the engine), and stubs only what the CPU manager, the policies and the tier base
import but do not use on the scheduler path: ``torch`` (a type annotation), ``vllm.logger``,
``vllm.v1.kv_hints`` and the connector's metrics class. Everything the tests drive
(``CPUOffloadingManager``, its ``CachePolicyFactory``, ``ChunkStatus``, the tier base classes)
is vLLM's unmodified code. Tests that need vLLM's tiering spec (shared memory through torch)
are skipped on this route, and the session labels its output as a smoke test.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["SMOKE_ENV", "install"]

SMOKE_ENV = "KVO_VLLM_SMOKE_SRC"
_METRICS = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics"


class _Stats:
    """Stands in for vLLM's ``OffloadingConnectorStats`` (metrics are not under test)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.values: dict[Any, Any] = {}

    def set_gauge(self, name: Any, value: Any) -> None:
        self.values[name] = value

    def observe_histogram(self, name: Any, value: Any) -> None:
        self.values.setdefault(name, []).append(value)

    def increase_counter(self, name: Any, value: Any) -> None:
        self.values[name] = self.values.get(name, 0) + value


def _init_logger(name: str) -> logging.Logger:
    """vLLM's loggers, with the ``*_once`` methods its modules call."""
    logger = logging.getLogger(name)
    for level in ("debug", "info", "warning"):
        setattr(logger, f"{level}_once", getattr(logger, level))
    return logger


def _stubs() -> dict[str, ModuleType]:
    torch = ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    torch.__smoke_stub__ = True  # type: ignore[attr-defined]
    logger = ModuleType("vllm.logger")
    logger.init_logger = _init_logger  # type: ignore[attr-defined]
    hints = ModuleType("vllm.v1.kv_hints")
    hints.KvHintsEnvelope = type("KvHintsEnvelope", (), {})  # type: ignore[attr-defined]
    metrics = ModuleType(_METRICS)
    metrics.OffloadingConnectorStats = _Stats  # type: ignore[attr-defined]
    return {m.__name__: m for m in (torch, logger, hints, metrics)}


class _WheelFinder(importlib.abc.MetaPathFinder):
    """``vllm.*`` from the unpacked wheel: packages as bare directories, modules as files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        base = self.root.joinpath(*fullname.split("."))
        if base.is_dir():  # a package whose __init__ must not run
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        file = base.with_suffix(".py")
        if file.is_file():
            loader = importlib.machinery.SourceFileLoader(fullname, str(file))
            return importlib.machinery.ModuleSpec(fullname, loader, origin=str(file))
        return None


def install(root: str | Path) -> None:
    """Make ``vllm.*`` importable from the unpacked wheel at ``root``, with the stubs."""
    root = Path(root)
    if not (root / "vllm" / "v1" / "kv_offload" / "cpu" / "manager.py").is_file():
        raise FileNotFoundError(f"{root} is not an unpacked vLLM 0.33 wheel")
    for name, module in _stubs().items():
        sys.modules.setdefault(name, module)
    sys.meta_path.insert(0, _WheelFinder(root))
    # The wheel's .dist-info, found on sys.path: the bridge reads the vLLM release from the
    # distribution providing `vllm` (the finder above still answers every vllm import).
    sys.path.append(str(root))
