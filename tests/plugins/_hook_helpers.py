"""Helpers shared by the hook tests: keys, a scriptable example tier and a tiered stack."""

from __future__ import annotations

from typing import Any

from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TieringOffloadingManager,
    get_offload_block_hash,
    make_offload_key,
)
from kv_offload.plugins import KVOffloadPluginManager
from kv_offload.tiering import JobMetadata, JobResult, OffloadingConfig, TierEntry
from kv_offload.tiering.backpressure import BackpressureDetector, DropAll
from kv_offload.tiering.cascade_gate import CascadeGate
from kv_offload.tiering.promotions import PromotionLimits
from kv_offload_example_tier import ExampleSecondaryTierManager

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 16
TIER = "example"


def k(i: int) -> OffloadKey:
    return make_offload_key(i)


def ks(*nums: int) -> list[OffloadKey]:
    return [k(i) for i in nums]


def num(key: OffloadKey) -> int:
    return int.from_bytes(get_offload_block_hash(key), "big")


class SwitchedPressure(BackpressureDetector):
    """A detector the scenario switches: under pressure while ``on`` is set."""

    on = False

    def on_store_completed(self, seconds: float, nbytes: int) -> None:
        pass

    def under_pressure(self) -> bool:
        return self.on

    def reset(self) -> None:
        self.on = False


class ScriptedTier(ExampleSecondaryTierManager):
    """The example tier; ``fail_next_store`` / ``fail_next_load`` fail the next such job;
    ``whole`` names the requests it asks for whole (request-level offload); its cascade
    gate (its entry's, see :func:`make_tiered`) drops every cascade while ``pressure.on`` is
    set."""

    fail_next_store = False
    fail_next_load = False
    whole: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pressure = SwitchedPressure()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        if req_context.req_id in self.whole:
            return RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)
        return None

    def submit_store(self, job: JobMetadata) -> None:
        if self.fail_next_store:
            self.fail_next_store = False
            self._finished.append(JobResult(job.job_id, success=False))
            return
        super().submit_store(job)

    def submit_load(self, job: JobMetadata) -> None:
        if self.fail_next_load:
            self.fail_next_load = False
            self._finished.append(JobResult(job.job_id, success=False))
            return
        super().submit_load(job)


def make_tiered(
    pm: KVOffloadPluginManager,
    num_blocks: int = 4,
    tier_cls: type[ExampleSecondaryTierManager] = ScriptedTier,
    names: tuple[str, ...] = (TIER,),
    **tier_kwargs: Any,
) -> TieringOffloadingManager:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK, plugin_manager=pm)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(num_blocks, BLOCK)
    tiers = [tier_cls(config, primary.kv_buffer.view, name, **tier_kwargs) for name in names]
    entries = [
        TierEntry(tier, cascade_gate=CascadeGate(tier.pressure, DropAll(), 0))
        if isinstance(tier, ScriptedTier)
        else tier
        for tier in tiers
    ]
    # The scripts retry a failed promotion on the next lookup: no backoff to wait out.
    limits = PromotionLimits(backoff=1e-9)
    return TieringOffloadingManager(primary, entries, drain_timeout=5.0, promotion_limits=limits)


def store(manager: Any, ctx: ReqContext, *nums: int) -> list[OffloadKey]:
    out = manager.prepare_store(ks(*nums), ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    return list(out.keys_to_store)
