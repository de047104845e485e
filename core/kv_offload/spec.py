"""What the scheduler hands to its workers: which CPU slots to read or write."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .keys import OffloadKey

__all__ = ["LoadStoreSpec", "CPULoadStoreSpec", "PrepareStoreOutput"]

_INT64 = np.dtype(np.int64)  # a dtype object skips numpy's per-call dtype parsing


class LoadStoreSpec:
    """Base of the medium-specific descriptions a worker needs to move blocks."""

    medium: str = ""


class CPULoadStoreSpec(LoadStoreSpec):
    """CPU slot ids, one per key and in the caller's key order, as an ``int64`` array.

    The ids index the rows of the CPU KV buffer; an array (not a list) lets a worker hand them
    to numpy or torch indexing without a Python loop.
    """

    medium = "CPU"
    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Sequence[int] | npt.NDArray[np.int64]) -> None:
        if isinstance(block_ids, list):
            # array('q') converts int subclasses (BlockStatus) in C, ~4x faster than numpy's
            # per-object path; frombuffer then wraps it without a copy.
            self.block_ids = np.frombuffer(array("q", block_ids), _INT64)
        else:
            self.block_ids = np.asarray(block_ids, _INT64)

    def __len__(self) -> int:
        return len(self.block_ids)

    def __repr__(self) -> str:
        return f"CPULoadStoreSpec({self.block_ids.tolist()!r})"


@dataclass
class PrepareStoreOutput:
    """Result of ``prepare_store``: the keys the worker must write, where, and what made room."""

    keys_to_store: list[OffloadKey]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[OffloadKey]
