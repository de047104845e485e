"""A template admission policy: a tier writes a fixed share of the blocks offered to it.

Which blocks is decided by the key's bytes (BLAKE2b), so the same block gets the same answer
every time, in every engine sharing the tier, under any PYTHONHASHSEED."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kv_offload import OffloadKey, ReqContext
from kv_offload.admission import AdmissionPolicy
from kv_offload.errors import ConfigError


class SampledAdmission(AdmissionPolicy):
    """Admits ``percent`` percent of the offered blocks, chosen by their key."""

    def __init__(self, *, percent: int = 50, capacity_blocks: int | None = None) -> None:
        super().__init__(capacity_blocks=capacity_blocks)
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise ConfigError(
                f"sampled: percent must be an int from 0 to 100, got {percent!r}",
                key="admission_options",
            )
        self.percent = percent

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        return [self._draw(key) < self.percent for key in keys]

    @staticmethod
    def _draw(key: OffloadKey) -> int:
        digest = hashlib.blake2b(bytes(key), digest_size=8).digest()
        return int.from_bytes(digest, "little") % 100

    def describe(self) -> str:
        return f"sampled ({self.percent}% of offered blocks)"
