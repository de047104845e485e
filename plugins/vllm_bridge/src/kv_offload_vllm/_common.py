"""What both adapters share: request contexts, hook firing and the bridged-name prefix."""

from __future__ import annotations

import logging
from typing import Any

from kv_offload import OffloadKey, ReqContext
from kv_offload.plugins import get_plugin_manager

__all__ = ["PREFIX", "BridgedReqContext", "fire_hook", "kvo_context", "split_name"]

logger = logging.getLogger("kv_offload_vllm")

#: vLLM's factories look their own registry up first, so ``arc`` or ``example`` would always
#: be vLLM's built-ins; a bridged name is the kv-offload name behind this prefix.
PREFIX = "kvo_"


def split_name(name: str) -> str | None:
    """The kv-offload plugin name behind a bridged name, or ``None`` if it is not one."""
    if name.startswith(PREFIX) and len(name) > len(PREFIX):
        return name[len(PREFIX) :]
    return None


class BridgedReqContext(ReqContext):
    """A kv-offload request context whose key positions are the vLLM context's.

    vLLM's scheduler records a key's position on its own context as the request proceeds
    (``set_offload_key_position``), after the kv-offload context was made, so the positions
    are read from the vLLM context on every call rather than copied once: a policy that
    orders a request's keys by position (``prefix-lru``) sees what vLLM's own policies see.
    """

    def __init__(self, vllm_context: Any) -> None:
        super().__init__(vllm_context.req_id, vllm_context.kv_transfer_params)
        self._vllm_context = vllm_context

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        self._vllm_context.set_offload_key_position(key, end_token)

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        position: int | None = self._vllm_context.get_offload_key_position(key)
        return position


def kvo_context(vllm_context: Any) -> ReqContext:
    """The kv-offload context of a vLLM request context, created once per request.

    It is kept in the vLLM context's own per-type state, so a policy, a tier and hooks see
    one kv-offload context for the whole request (their per-request state survives between
    calls) and nothing is kept after vLLM drops the request.
    """
    context: ReqContext | None = vllm_context.get_state(BridgedReqContext)
    if context is None:
        context = BridgedReqContext(vllm_context)
        vllm_context.set_state(context)
    return context


def fire_hook(hook_name: str, source: str, **kwargs: Any) -> None:
    """Call a kv-offload event hook if any plugin implements it.

    Inside vLLM a raising hook plugin must not abort the vLLM manager call it fires from (its
    bookkeeping would stop half way), so the error is logged, naming the hook and ``source``.
    Only the arguments the installed kv-offload's hookspec declares are passed, so the bridge
    works with kv-offload versions whose hooks gained or lack an argument (a declared argument
    the bridge does not know is passed as ``None``).
    """
    caller = getattr(get_plugin_manager().hook, hook_name)
    if not caller.get_hookimpls():
        return
    spec = caller.spec
    if spec is not None:
        kwargs = {name: kwargs.get(name) for name in spec.argnames}
    try:
        caller(**kwargs)
    except Exception:
        logger.exception(
            "kv-offload hook %s raised for %s; the vLLM call it fired from went on",
            hook_name,
            source,
        )
