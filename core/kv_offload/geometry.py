"""Block geometry for a replay: how many bytes a block of the trace really is, and a stack that
fits this machine at that size.

A trace names blocks, not bytes; what a disk or a network must move depends on the model: its
KV cache holds, per token, a key and a value vector per layer and KV head. ``--model NAME``
takes a preset from :data:`MODEL_PRESETS` (bytes per token x the trace's tokens per block),
``--block-bytes SIZE`` gives the size directly, ``--cpu-bytes SIZE`` sizes the CPU tier by
bytes instead of blocks.

Real block sizes are large (a 512-token block of an 8B Llama is 64 MiB), so a stack that fits
a GPU server's RAM may not fit this machine's. Then the stack is scaled, never silently: fewer
blocks of the same size (the bytes per block, and so every tier's bytes per second, stay
true; the hit ratio is that of the smaller stack), and the report lists each part scaled with
its figures. The CPU buffer and in-memory tiers must fit in :data:`MEMORY_SHARE` of the
memory available now, a tier on disk (``root_dir``) in :data:`DISK_SHARE` of its
filesystem's free space.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import StackConfig
from .config.memory import human, physical_memory_bytes
from .errors import ConfigError, KVOffloadError
from .tiering import SecondaryTierFactory
from .tiering.base import OffloadingConfig

__all__ = [
    "DISK_SHARE",
    "MEMORY_SHARE",
    "MODEL_PRESETS",
    "SIZE_UNITS",
    "Geometry",
    "ModelPreset",
    "apply_geometry",
    "describe_scaling",
    "parse_size",
]

#: Share of the memory available now that the CPU buffers and in-memory tiers may take.
MEMORY_SHARE = 0.6
#: Share of a filesystem's free space that a disk tier's capacity may take.
DISK_SHARE = 0.8


@dataclass(frozen=True)
class ModelPreset:
    """A model's KV cache per token: ``kv_factor`` vectors (2: a key and a value; 1: MLA's
    one latent) of ``head_dim`` values per layer and KV head, ``dtype_bytes`` each."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    kv_factor: int = 2

    @property
    def bytes_per_token(self) -> int:
        return self.kv_factor * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


#: Published architectures (bf16 KV cache): layers, KV heads, head dim.
MODEL_PRESETS: dict[str, ModelPreset] = {
    "qwen3-0.6b": ModelPreset(28, 8, 128),
    "llama-3.2-1b": ModelPreset(16, 8, 64),
    "qwen2.5-7b": ModelPreset(28, 4, 128),
    "llama-3.1-8b": ModelPreset(32, 8, 128),
    "mistral-7b": ModelPreset(32, 8, 128),
    "qwen3-32b": ModelPreset(64, 8, 128),
    "llama-3.1-70b": ModelPreset(80, 8, 128),
    # MLA: one 512 + 64 latent per token and layer, no separate key and value.
    "deepseek-v3": ModelPreset(61, 1, 576, kv_factor=1),
}

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
    "p": 1000**5,
    "pb": 1000**5,
    "pib": 1024**5,
    "e": 1000**6,
    "eb": 1000**6,
    "eib": 1024**6,
}
#: The units :func:`parse_size` takes, as its error lists them (case does not matter).
SIZE_UNITS = "B, k/kB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, P/PB/PiB, E/EB/EiB"


def parse_size(text: str, what: str) -> int:
    """``262144``, ``256KiB``, ``2 MiB``, ``1.5GB`` -> bytes (a positive whole number)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{what}: {text!r} is not a size: a number of bytes, or with one of the units "
            f"{SIZE_UNITS} (256KiB, 2MiB, 1.5GB)"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1 or not value.is_integer():
        raise ConfigError(f"{what}: {text!r} is not a positive whole number of bytes")
    return int(value)


@dataclass
class Geometry:
    """What :func:`apply_geometry` decided, for the report."""

    block_bytes: int
    source: str
    cpu_blocks: int
    scaled: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "block_bytes": self.block_bytes,
            "source": self.source,
            "cpu_blocks": self.cpu_blocks,
            "scaled": self.scaled,
        }


def _available_memory() -> int | None:
    """``MemAvailable`` (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return physical_memory_bytes()


def _free_disk(root: str) -> int | None:
    """Free bytes on the filesystem that holds (or will hold) ``root``."""
    path = Path(root)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def apply_geometry(
    stack: StackConfig,
    *,
    block_tokens: int,
    block_bytes: int | None = None,
    model: str | None = None,
    cpu_bytes: int | None = None,
    engines: int = 1,
    available_memory: int | None = None,
    free_disk: Any = _free_disk,
) -> tuple[StackConfig, Geometry]:
    """``stack`` at the chosen block size, scaled to fit; see the module docstring.
    ``engines`` stacks share the machine's memory (a fleet)."""
    if block_bytes is not None and model is not None:
        raise ConfigError("give --block-bytes or --model, not both")
    if model is not None:
        preset = MODEL_PRESETS.get(model)
        if preset is None:
            raise ConfigError(
                f"--model {model!r} is not a preset; choose one of {', '.join(MODEL_PRESETS)}, "
                f"or give --block-bytes"
            )
        block_bytes = preset.bytes_per_token * block_tokens
        source = (
            f"--model {model}: {preset.bytes_per_token:,} bytes per token x {block_tokens} tokens"
        )
    elif block_bytes is not None:
        source = "--block-bytes"
    else:
        block_bytes = stack.block_size_bytes or 0
        source = "the config's block_size_bytes"
        if cpu_bytes is None:
            return stack, Geometry(block_bytes, source, stack.num_blocks)
    if block_bytes <= 0:
        raise ConfigError("--cpu-bytes needs a block size: set block_size_bytes or --block-bytes")
    num_blocks = stack.num_blocks
    if cpu_bytes is not None:
        num_blocks = cpu_bytes // block_bytes
        if num_blocks < 1:
            raise ConfigError(
                f"--cpu-bytes {human(cpu_bytes)} holds no block of {human(block_bytes)}"
            )
    geometry = Geometry(block_bytes, source, num_blocks)
    memory = available_memory if available_memory is not None else _available_memory()
    tiers = list(stack.tiers)
    in_memory = [i for i, t in enumerate(tiers) if _holds_process_memory(t, block_bytes)]
    if memory is not None:
        budget = int(memory * MEMORY_SHARE) // max(engines, 1)
        if block_bytes > budget:
            raise _no_block_fits(source, block_bytes, budget, "memory", engines)
        wanted = num_blocks + sum(_capacity(tiers[i]) or 0 for i in in_memory)
        if wanted * block_bytes > budget:
            factor = budget / (wanted * block_bytes)
            fits = max(1, int(num_blocks * factor))
            _note(geometry, "CPU tier", num_blocks, fits, block_bytes, budget, "memory", engines)
            num_blocks = fits
            for i in in_memory:
                capacity = _capacity(tiers[i])
                if capacity:
                    smaller = max(1, int(capacity * factor))
                    label = f"tier {tiers[i].name or tiers[i].type!r}"
                    _note(
                        geometry, label, capacity, smaller, block_bytes, budget, "memory", engines
                    )
                    tiers[i] = replace(
                        tiers[i], arguments={**tiers[i].arguments, "capacity_blocks": smaller}
                    )
    for i, tier in enumerate(tiers):
        root = tier.arguments.get("root_dir")
        capacity = _capacity(tier)
        if not isinstance(root, str) or not capacity:
            continue
        free = free_disk(root)
        if free is None:
            continue
        budget = int(free * DISK_SHARE) // max(engines, 1)
        if block_bytes > budget:
            raise _no_block_fits(source, block_bytes, budget, f"disk at {root}", engines)
        if capacity * block_bytes > budget:
            smaller = max(1, budget // block_bytes)
            label = f"tier {tier.name or tier.type!r}"
            _note(
                geometry, label, capacity, smaller, block_bytes, budget, f"disk at {root}", engines
            )
            tiers[i] = replace(tier, arguments={**tier.arguments, "capacity_blocks": smaller})
    geometry.cpu_blocks = num_blocks
    stack = replace(stack, block_size_bytes=block_bytes, num_blocks=num_blocks, tiers=tuple(tiers))
    return stack, geometry


def _no_block_fits(
    source: str, block_bytes: int, budget: int, where: str, engines: int
) -> ConfigError:
    """Scaling keeps at least one block: when even one does not fit, the block size is what is
    wrong, and the error names where it came from (not ``num_blocks``)."""
    if source.startswith("--model"):
        fix = "give fewer --block-tokens, a smaller --model, or --block-bytes"
    elif source == "--block-bytes":
        fix = "give a smaller --block-bytes"
    else:
        fix = "lower block_size_bytes"
    per = f" per engine ({engines} engines)" if engines > 1 else ""
    return ConfigError(
        f"{source}: one block of {human(block_bytes)} does not fit in the {human(budget)} of "
        f"{where} this replay may use{per}; {fix}"
    )


def _holds_process_memory(tier: Any, block_bytes: int) -> bool:
    """Whether the tier keeps its blocks in this process's memory: what its class reports
    through ``SecondaryTierManager.memory_bytes``, the answer the config's memory estimate
    reads too (an unknown plugin is left to that check, which names it)."""
    try:
        cls = SecondaryTierFactory.registry.resolve(tier.type, tier.module_path)
        held = cls.memory_bytes(OffloadingConfig(1, block_bytes), **tier.arguments)
    except KVOffloadError:
        return False
    return bool(held)


def _capacity(tier: Any) -> int | None:
    value = tier.arguments.get("capacity_blocks")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _note(
    geometry: Geometry,
    what: str,
    before: int,
    after: int,
    block_bytes: int,
    budget: int,
    where: str,
    engines: int,
) -> None:
    per = f" per engine ({engines} engines)" if engines > 1 else ""
    geometry.scaled.append(
        {
            "what": what,
            "blocks_before": before,
            "blocks_after": after,
            "why": (
                f"{before} blocks of {human(block_bytes)} = {human(before * block_bytes)} do not "
                f"fit in the {human(budget)} of {where} this replay may use{per}"
            ),
        }
    )


def describe_scaling(geometry: Geometry) -> list[str]:
    """One line per scaled part, for the text report and stderr."""
    return [
        f"scaled: {item['what']} {item['blocks_before']} -> {item['blocks_after']} blocks "
        f"(same bytes per block): {item['why']}"
        for item in geometry.scaled
    ]
