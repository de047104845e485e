"""The CPU cache's admission: vLLM's ``store_threshold`` or an admission plugin.

Most prefixes of a conversation trace are seen once; writing each of them to the CPU cache
costs a GPU->CPU copy and evicts a block that might have been reused. With
``store_threshold = n`` (``n >= 2``) a block is stored only from its ``n``-th offer on, as
vLLM 0.33's ``CPUOffloadingManager`` does: that rule is the core's ``store-threshold``
admission (:class:`~kv_offload.admission.StoreThreshold`, the one implementation every
store of a stack shares). Any other admission plugin can take its place
(``admission = "NAME"``). Values of ``store_threshold`` below 2 mean "off"; the manager then
holds no admission at all and its store path pays one ``is None`` check.
"""

from __future__ import annotations

from typing import Any

from ..admission import DEFAULT_MAX_TRACKER_SIZE, AdmissionPolicy, StoreThreshold
from ..errors import ConfigError

__all__ = ["DEFAULT_MAX_TRACKER_SIZE", "cpu_admission"]


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


def _check_filter_args(store_threshold: Any, max_tracker_size: Any) -> tuple[int, int]:
    """Both arguments, checked (a :class:`~kv_offload.ConfigError` names the bad one)."""
    threshold = _int("store_threshold", store_threshold)
    if threshold < 0:
        raise ConfigError(
            f"store_threshold must be >= 0 (offers before a block is stored; 0 or 1: no "
            f"filter), got {threshold}"
        )
    size = _int("max_tracker_size", max_tracker_size)
    if size <= 0:
        raise ConfigError(
            f"max_tracker_size must be > 0 (keys whose offers are counted; default "
            f"{DEFAULT_MAX_TRACKER_SIZE}), got {size}"
        )
    return threshold, size


def cpu_admission(
    num_blocks: int,
    store_threshold: Any,
    max_tracker_size: Any,
    admission: AdmissionPolicy | None,
) -> AdmissionPolicy | None:
    """The admission the CPU cache asks before it stores: ``admission`` if given, else
    ``store-threshold`` when ``store_threshold`` is 2 or more, else ``None`` (store every
    offered block). Both at once is a :class:`~kv_offload.ConfigError`: two rules would
    decide one store."""
    threshold, size = _check_filter_args(store_threshold, max_tracker_size)
    if admission is not None:
        if not isinstance(admission, AdmissionPolicy):
            raise ConfigError(
                f"admission must be a kv_offload.admission.AdmissionPolicy, got "
                f"{type(admission).__name__}; build one with kv_offload.admission.build_admission"
            )
        if threshold >= 2:
            raise ConfigError(
                f"both an admission ({admission.plugin_name or type(admission).__name__}) and "
                f"store_threshold = {threshold} choose what the CPU cache stores; keep one"
            )
        return admission
    if threshold < 2:
        return None
    rule = StoreThreshold(threshold=threshold, max_tracker_size=size, capacity_blocks=num_blocks)
    rule.plugin_name = "store-threshold"
    return rule
