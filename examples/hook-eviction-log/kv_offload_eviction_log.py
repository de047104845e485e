"""Logs every eviction: a kv-offload hook plugin in one module.

The module itself is the plugin: kv-offload registers it with pluggy, which calls each
function marked ``@hookimpl`` whose name is a hook in ``kv_offload.plugins.hookspecs``. A hookimpl
takes any subset of the hook's arguments.
"""

from __future__ import annotations

import logging

from kv_offload import OffloadKey, ReqContext, get_offload_block_hash
from kv_offload.plugins import hookimpl

logger = logging.getLogger("kv_offload.eviction_log")


@hookimpl
def kv_offload_blocks_evicted(keys: list[OffloadKey], medium: str, req_context: ReqContext) -> None:
    # One call per batch, never one per block; keep it cheap, it runs on the scheduler's path.
    logger.info(
        "evicted %d block(s) from %s for request %s: %s",
        len(keys),
        medium,
        req_context.req_id,
        " ".join(get_offload_block_hash(key).hex() for key in keys),
    )
