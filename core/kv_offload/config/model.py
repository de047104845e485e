"""The parsed config: what every later step of the flow reads (:class:`StackConfig` and its
parts), and the embedded default. Built by :mod:`.parse`, checked by :mod:`.resolve`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..redact import redact_secrets
from .env import HookSelection, select_hooks
from .schema import HOOK_FIELDS, TOP_FIELDS

if TYPE_CHECKING:
    from ..admission import AdmissionPolicy

__all__ = ["DEFAULT_CONFIG", "HooksConfig", "StackConfig", "TierConfig"]

_TOP = {f.name: f for f in TOP_FIELDS}
_HOOKS = {f.name: f for f in HOOK_FIELDS}

#: The embedded default: a CPU tier in front of the in-memory example tier, no external service.
DEFAULT_CONFIG: dict[str, Any] = {
    "num_blocks": 5000,
    "block_size_bytes": 4096,
    "policy": "lru",
    "tiers": [{"type": "example", "capacity_blocks": 20000}],
}


@dataclass(frozen=True)
class TierConfig:
    type: str
    module_path: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    name: str | None = None

    def as_factory_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"type": self.type, **self.arguments}
        if self.module_path is not None:
            config["module_path"] = self.module_path
        if self.name is not None:
            config["name"] = self.name
        return config


@dataclass(frozen=True)
class HooksConfig:
    autoload: bool = _HOOKS["autoload"].default
    enable: tuple[str, ...] = _HOOKS["enable"].default
    block: tuple[str, ...] = _HOOKS["block"].default
    #: plugin name -> its ``[hooks.<name>]`` table, as written (checked by the plugin)
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class StackConfig:
    """A validated config; :func:`kv_offload.build_manager` turns it into a manager."""

    num_blocks: int = _TOP["num_blocks"].default
    block_size_bytes: int | None = _TOP["block_size_bytes"].default
    policy: str = _TOP["policy"].default
    policy_module_path: str | None = _TOP["policy_module_path"].default
    allow_module_path: bool = _TOP["allow_module_path"].default
    enable_events: bool = _TOP["enable_events"].default
    store_threshold: int = _TOP["store_threshold"].default
    max_tracker_size: int = _TOP["max_tracker_size"].default
    admission: str | None = _TOP["admission"].default
    admission_options: Mapping[str, Any] | None = field(
        default=_TOP["admission_options"].default, hash=False
    )
    admission_module_path: str | None = _TOP["admission_module_path"].default
    write_back_buffer_blocks: int | None = _TOP["write_back_buffer_blocks"].default
    drain_timeout_s: float = _TOP["drain_timeout_s"].default
    promotion_timeout_s: float = _TOP["promotion_timeout_s"].default
    promotion_backoff_s: float = _TOP["promotion_backoff_s"].default
    promotion_max_failures: int = _TOP["promotion_max_failures"].default
    hooks: HooksConfig = field(default_factory=HooksConfig)
    tiers: tuple[TierConfig, ...] = ()
    source: str = "<dict>"

    def describe(self) -> dict[str, Any]:
        """A plain-data view of the resolved stack (what ``kv-offload validate`` prints)."""
        shown = [f for f in TOP_FIELDS if f.shown is not None]
        return {
            "source": self.source,
            "cpu": {f.name: getattr(self, f.name) for f in shown if f.shown == "cpu"},
            # Printed by `kv-offload validate`: credentials in tier arguments are masked.
            "tiers": [redact_secrets(t.as_factory_config()) for t in self.tiers],
            "hooks": {
                **{f.name: _plain(getattr(self.hooks, f.name)) for f in HOOK_FIELDS},
                **({"settings": dict(self.hooks.settings)} if self.hooks.settings else {}),
            },
            **{f.name: getattr(self, f.name) for f in shown if f.shown == ""},
        }

    def cpu_admission(self) -> AdmissionPolicy | None:
        """The CPU tier's admission plugin as ``admission`` configures it (``None``: unset;
        ``store_threshold`` is passed to the CPU tier as vLLM does)."""
        from ..admission import configured_admission  # the plugin modules load on demand

        if self.admission is None:
            return None
        options = dict(self.admission_options) if self.admission_options is not None else None
        return configured_admission(
            self.admission,
            options,
            self.admission_module_path,
            capacity_blocks=self.num_blocks,
            where="the CPU tier",
        )

    @property
    def write_back(self) -> bool:
        """Whether a tier is written back (the CPU KV buffer then has staging rows)."""
        return any(t.arguments.get("write_policy") == "write-back" for t in self.tiers)

    @property
    def staging_rows(self) -> int:
        """The CPU KV buffer's write-back staging rows (0 without a write-back tier)."""
        if not self.write_back:
            return 0
        if self.write_back_buffer_blocks is not None:
            return self.write_back_buffer_blocks
        # Enough for the blocks a few steps evict while a tier writes (and for one large
        # store's victims: a store evicting more dirty blocks than there are rows drops the
        # rest); more only adds memory.
        return min(self.num_blocks, max(64, self.num_blocks // 16))

    def hook_selection(self) -> HookSelection:
        """The hook plugins this stack loads: its ``[hooks]`` table under the environment's
        precedence (:mod:`kv_offload.config.env`)."""
        return select_hooks(self.hooks.autoload, self.hooks.enable, self.hooks.block)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
