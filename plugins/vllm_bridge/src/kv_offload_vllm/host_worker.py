"""The KV transfers of :mod:`kv_offload_vllm.host` on vLLM's CPU platform.

There the "GPU" KV cache vLLM offloads from is itself host memory, so a transfer is a gather
of whole block pages from one tensor and a scatter into the other: one vectorised indexing
copy per (KV group, layer tensor), done when vLLM submits the job. vLLM submits a store at
the start of the engine step after the one that wrote its blocks and a load before the
forward pass that reads them, and on the CPU platform the model runs on the thread that
submits, so a copy done at submit time is ordered as vLLM's CUDA streams order it. Each
finished job is reported with its size and duration, which vLLM's connector turns into its
``vllm:kv_offload_*`` metrics as it does for its own worker.

The offload buffer is vLLM's own layout: ``(num_chunks, blocks_per_chunk * page)`` bytes per
layer tensor, a private tensor for ``HostOffloadingSpec`` or this worker's view of vLLM's
shared offload region for ``HostTieringOffloadingSpec`` (the scheduler's secondary tiers
read and write the chunks there).
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from typing import Any

import numpy as np
from kv_offload.errors import ConfigError, InvalidArgumentError

__all__ = ["host_worker"]

logger = logging.getLogger("kv_offload_vllm")


def host_worker(
    kv_caches: Any,
    blocks_per_chunk: int,
    num_chunks: int,
    region: Any = None,
) -> Any:
    """A vLLM ``OffloadingWorker`` copying between ``kv_caches`` (host memory) and the
    offload buffer: ``region``'s views when given (owned by the worker from then on and
    cleaned up at its shutdown, or here if the worker cannot be built), else private zeroed
    tensors of ``num_chunks`` chunks."""
    try:
        return _worker_class()(kv_caches, blocks_per_chunk, num_chunks, region)
    except Exception:
        if region is not None:
            region.cleanup()
        raise


#: Word sizes in bytes -> the torch dtype of that size.
_WORDS: dict[int, Any] = {
    8: lambda torch: torch.int64,
    4: lambda torch: torch.int32,
    2: lambda torch: torch.int16,
    1: lambda torch: torch.int8,
}


def _word_size(torch: Any, sizes: list[int], *tensors: Any) -> int:
    """The largest word that divides every size and lets each byte tensor be viewed as
    words (row strides and storage offset aligned)."""
    for word in _WORDS:
        if any(size % word for size in sizes):
            continue
        try:
            for tensor in tensors:
                tensor.view(_WORDS[word](torch))
        except RuntimeError:
            continue
        return word
    return 1


@functools.cache
def _worker_class() -> type:
    """The worker class, built on first use: it subclasses vLLM's ``OffloadingWorker``,
    and kv-offload-vllm imports neither vLLM nor torch until vLLM asks for a class."""
    torch = importlib.import_module("torch")
    base = importlib.import_module("vllm.v1.kv_offload.base")
    offloading_worker: Any = base.OffloadingWorker

    class HostOffloadingWorker(offloading_worker):  # type: ignore[misc]
        """Synchronous vectorised copies between vLLM's KV cache and the offload buffer."""

        def __init__(
            self, kv_caches: Any, blocks_per_chunk: int, num_chunks: int, region: Any
        ) -> None:
            self._region = region
            self._blocks_per_chunk = blocks_per_chunk
            self._group_refs = kv_caches.group_data_refs
            #: Per layer tensor: vLLM's cache, ``(num_blocks, page)`` bytes as words.
            self._cache: list[Any] = []
            #: Per layer tensor: ``(num_chunks, blocks_per_chunk, page)`` bytes.
            self._buffer: list[Any] = []
            #: Per layer tensor: the bytes of the words both views are read as (8 when the
            #: pages allow: an int8 indexing copy is ~400x slower than an int64 one).
            self._word: list[int] = []
            self._finished: list[Any] = []
            for index, cache_tensor in enumerate(kv_caches.tensors):
                page = cache_tensor.page_size_bytes
                cache = cache_tensor.tensor
                if cache.device.type != "cpu":
                    raise ConfigError(
                        f"KV cache tensor {index} is on {cache.device}, not in host memory; "
                        "the host offload worker serves vLLM's CPU platform only"
                    )
                if cache.dtype != torch.int8 or cache.dim() != 2 or cache.shape[1] != page:
                    raise ConfigError(
                        f"KV cache tensor {index} is {tuple(cache.shape)} {cache.dtype}; the "
                        f"host offload worker needs vLLM's (num_blocks, {page}) int8 view"
                    )
                if region is not None:
                    flat = region.create_next_worker_view(page * blocks_per_chunk)
                else:
                    flat = torch.zeros((num_chunks, page * blocks_per_chunk), dtype=torch.int8)
                used = [
                    r.page_size_bytes for g in self._group_refs for r in g if r.tensor_idx == index
                ]
                word = _word_size(torch, [page, *used], cache, flat)
                self._word.append(word)
                self._cache.append(cache.view(_WORDS[word](torch)))
                self._buffer.append(
                    flat.view(_WORDS[word](torch)).unflatten(1, (blocks_per_chunk, page // word))
                )
            logger.info(
                "host KV offload worker: %d layer tensors, %d chunks of %d blocks (%s)",
                len(self._cache),
                num_chunks,
                blocks_per_chunk,
                "shared region" if region is not None else "private buffer",
            )

        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            self._transfer(job_id, src_spec, dst_spec, store=True)
            return True

        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            self._transfer(job_id, dst_spec, src_spec, store=False)
            return True

        def _transfer(self, job_id: int, cache_spec: Any, buffer_spec: Any, store: bool) -> None:
            """Copy a job's blocks, KV group by KV group, as vLLM's worker maps them: group
            ``g``'s ``group_sizes[g]`` cache blocks are the logically contiguous blocks from
            ``block_indices[g]`` on, so its first chunk may start part way in."""
            start = time.perf_counter()
            per_chunk = self._blocks_per_chunk
            cache_ids = cache_spec.block_ids
            chunk_ids = buffer_spec.block_ids
            cache_at = chunk_at = 0
            num_bytes = 0
            for refs, size, first in zip(
                self._group_refs, cache_spec.group_sizes, cache_spec.block_indices
            ):
                if size == 0:
                    continue
                skip = first % per_chunk
                count = -(-(size + skip) // per_chunk)
                chunks = chunk_ids[chunk_at : chunk_at + count].astype(np.int64)
                slots = (chunks[:, None] * per_chunk + np.arange(per_chunk)).ravel()
                slots = slots[skip : skip + size]
                if len(slots) != size:
                    break  # fewer chunks than the group needs: refused below
                blocks = torch.from_numpy(cache_ids[cache_at : cache_at + size].astype(np.int64))
                chunk = torch.from_numpy(slots // per_chunk)
                within = torch.from_numpy(slots % per_chunk)
                if store:
                    positions = [(p, within == p) for p in range(per_chunk)]
                    if per_chunk == 1:
                        positions = [(0, slice(None))]
                for ref in refs:
                    cache = self._cache[ref.tensor_idx]
                    buffer = self._buffer[ref.tensor_idx]
                    used = ref.page_size_bytes
                    words = used // self._word[ref.tensor_idx]
                    if store:
                        rows = cache[blocks, :words]
                        # One put per position in a chunk (blocks_per_chunk of them): torch's
                        # put with two index tensors is ~100x slower than with one.
                        for position, take in positions:
                            buffer[:, position][chunk[take], :words] = rows[take]
                    else:
                        cache[blocks, :words] = buffer[chunk, within, :words]
                    num_bytes += size * used
                cache_at += size
                chunk_at += count
            if cache_at != len(cache_ids) or chunk_at != len(chunk_ids):
                raise InvalidArgumentError(
                    f"transfer job {job_id}: {len(cache_ids)} cache blocks and "
                    f"{len(chunk_ids)} chunks do not match its group sizes "
                    f"{list(cache_spec.group_sizes)} and first blocks "
                    f"{list(cache_spec.block_indices)}"
                )
            elapsed = time.perf_counter() - start
            self._finished.append(base.TransferResult(job_id, True, num_bytes, elapsed))

        def get_finished(self) -> list[Any]:
            finished, self._finished = self._finished, []
            return finished

        def wait(self, job_ids: set[int]) -> None:
            """Nothing to wait for: every job is done when it is submitted."""

        def shutdown(self) -> None:
            self._finished.clear()
            self._cache.clear()
            self._buffer.clear()
            if self._region is not None:
                region, self._region = self._region, None
                region.cleanup()

    return HostOffloadingWorker
