"""Hit ratios of kv-offload policies bridged into vLLM 0.33, next to kv-offload's own manager
and vLLM's built-in policies, on the bundled trace replayed in vLLM's scheduler call order.

Per capacity and installed kv-offload policy: ``bridged`` is vLLM's ``CPUOffloadingManager``
running ``kvo_<policy>`` through kv-offload-vllm; ``kv-offload`` is kv-offload's own manager under
the same access model (touching at request end what vLLM reports as reused); ``vLLM built-in``
is vLLM's own ``<policy>`` (``lru`` and ``arc`` only, ``-`` otherwise); ``vs vLLM ARC`` is
``bridged`` over vLLM's built-in ARC's hit ratio at that capacity, the bar a bridged policy
should reach; ``kv-offload replay`` is ``kv_offload.replay.replay`` (touch right after the
load). The replay loop (``scheduler_replay``, next to this file) is the one tests/vllm_bridge
use. Needs the environment of ``python3 -m nox -s vllm`` (or the setup in
vllm_side_by_side.py's docstring) with kv-offload-vllm installed::

    python benchmarks/vllm_bridge_hit_ratios.py [--requests N] [--capacity C ...]
"""

from __future__ import annotations

import argparse
import sys

from kv_offload import CPUOffloadingManager, ReqContext
from kv_offload.policies import CachePolicyFactory
from kv_offload.replay import replay
from scheduler_replay import load_trace, replay_kv_offload, replay_vllm

VLLM_BUILTINS = ("lru", "arc")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None, help="all if unset")
    parser.add_argument("--capacity", type=int, action="append")
    args = parser.parse_args()
    try:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager
    except Exception as exc:
        print(f"vLLM is not importable here ({exc}); see the docstring", file=sys.stderr)
        return 0
    trace = load_trace(args.requests)
    blocks = sum(len(keys) for _, keys in trace)
    print(f"{len(trace)} requests, {blocks} blocks; hit ratio (hit blocks / blocks)")
    policies = sorted({info.name for info in CachePolicyFactory.available_policies()})
    print(
        f"{'capacity':>8} {'policy':<10} {'bridged':>8} {'kv-offload':>10} "
        f"{'vLLM built-in':>13} {'vs vLLM ARC':>11} {'kv-offload replay':>17}"
    )
    for capacity in args.capacity or [1000, 5000, 20000]:
        vllm_arc = replay_vllm(VLLMManager(capacity, cache_policy="arc"), trace).hit_ratio
        for policy in policies:
            bridged = replay_vllm(
                VLLMManager(
                    capacity,
                    cache_policy=f"kvo_{policy}",
                    cache_policy_module_path="kv_offload_vllm.policies",
                ),
                trace,
            )
            own = replay_kv_offload(CPUOffloadingManager(capacity, cache_policy=policy), trace)
            builtin = (
                f"{replay_vllm(VLLMManager(capacity, cache_policy=policy), trace).hit_ratio:.4f}"
                if policy in VLLM_BUILTINS
                else "-"
            )
            native = replay(
                CPUOffloadingManager(capacity, cache_policy=policy),
                [(ReqContext(req_id), keys) for req_id, keys in trace],
            )
            print(
                f"{capacity:>8} {policy:<10} {bridged.hit_ratio:>8.4f} {own.hit_ratio:>10.4f} "
                f"{builtin:>13} {bridged.hit_ratio / vllm_arc:>10.3f}x {native.hit_ratio:>17.4f}"
                + ("" if bridged.hit_blocks == own.hit_blocks else "  (bridged != kv-offload)"),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
