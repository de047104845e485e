"""``always``: every offered block is written (what a tier without an admission does).

Named so a config can say it outright, and so a benchmark can put admit-all in the same
table as the others under the same write policy."""

from __future__ import annotations

from collections.abc import Sequence

from kv_offload import OffloadKey, ReqContext
from kv_offload.admission import AdmissionPolicy

__all__ = ["Always"]


class Always(AdmissionPolicy):
    """Admits every offered block."""

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        return [True] * len(keys)

    def describe(self) -> str:
        return "always (every offered block)"
