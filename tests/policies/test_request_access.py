"""kv_offload.policies.request_access: vLLM 0.33's per-request access record, rebuilt from
kv-offload's policy callbacks, rule by rule; and ReqContext's key positions.

``prefix-lru`` and ``vllm-arc`` both build on it, so a mistake here would be shared by a
policy and its reference: these tests state vLLM's manager's rules directly.
"""

from __future__ import annotations

from _policy_harness import Blocks
from kv_offload import OffloadKey, ReqContext, make_offload_key
from kv_offload.block_status import BlockStatus
from kv_offload.policies.request_access import RequestAccess, RequestAccessLog, head_to_tail


def key(i: int, group: int = 0) -> OffloadKey:
    return make_offload_key(i, group)


class Cache:
    """Resident blocks by key, with a log that records the keys reported as new."""

    def __init__(self) -> None:
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self.slots = Blocks(100)
        self.new: list[tuple[str, list[OffloadKey]]] = []
        self.log = RequestAccessLog(self.blocks.get, self.asked)

    def asked(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        self.new.append((ctx.req_id, list(keys)))

    def hold(self, k: OffloadKey, ref_cnt: int = 0) -> None:
        self.blocks[k] = self.slots.new(ref_cnt)


def test_req_context_key_positions() -> None:
    ctx = ReqContext("r")
    assert ctx.get_offload_key_position(key(1)) is None
    ctx.set_offload_key_position(key(1), 32)
    ctx.set_offload_key_position(key(1), 48)  # the last call wins
    assert ctx.get_offload_key_position(key(1)) == 48
    assert ctx == ReqContext("r")  # positions are not part of a context's identity


def test_each_key_counts_once_and_pending_blocks_not_at_all() -> None:
    cache = Cache()
    cache.hold(key(1))
    cache.hold(key(2), ref_cnt=-1)  # its store is in flight
    ctx = ReqContext("r")
    cache.log.access([key(1), key(2)], ctx)
    cache.log.access([key(1)], ctx)
    assert cache.new == [("r", [key(1)])]
    cache.blocks[key(2)].ref_cnt = 0  # stored now: offered again, it counts
    cache.log.access([key(2), key(1)], ctx)
    assert cache.new[-1] == ("r", [key(2)])
    finished = cache.log.finish(ctx)
    assert finished is not None
    assert finished.keys == [key(1), key(2)] and finished.reused == {key(1), key(2)}


def test_absent_keys_count_only_when_the_store_allocates_them() -> None:
    cache = Cache()
    cache.hold(key(1))
    ctx = ReqContext("r")
    cache.log.access([key(1), key(2), key(3)], ctx)
    assert cache.new == []  # held until the store's misses are known
    assert cache.log.store_miss([key(3)], ctx) == [key(3)]  # key(2) was filtered out
    assert cache.new == [("r", [key(1), key(3)])]
    assert cache.log.store_miss([key(3)], ctx) == []  # a request's miss counts once
    cache.log.access([key(2)], ctx)
    cache.log.settle()  # no store followed: key(2) still does not count
    assert cache.new[-1] == ("r", [key(1), key(3)])


def test_inserted_keys_are_not_reused_by_the_request_that_stored_them() -> None:
    cache = Cache()
    ctx = ReqContext("r")
    cache.log.access([key(1)], ctx)
    cache.log.store_miss([key(1)], ctx)
    cache.hold(key(1), ref_cnt=-1)
    cache.log.inserted([key(1)])
    cache.blocks[key(1)].ref_cnt = 0
    cache.log.access([key(1)], ctx)  # read back by the request that stored it
    finished = cache.log.finish(ctx)
    assert finished is not None
    assert finished.insertion_only == {key(1)} and finished.reused == set()
    assert ctx.get_state(RequestAccess) is None  # the record left the context
    assert cache.log.finish(ctx) is None  # once


def test_head_to_tail_by_group_then_by_position_when_every_key_has_one() -> None:
    cache = Cache()
    for i in range(3):
        for group in (0, 1):
            cache.hold(key(i, group))
    asked = [key(2, 1), key(0, 0), key(2, 0), key(1, 1), key(0, 1), key(1, 0)]
    plain = ReqContext("plain")
    cache.log.access(asked, plain)
    done = cache.log.finish(plain)
    assert done is not None  # groups in index order, each in the order asked
    assert done.keys == [key(0, 0), key(2, 0), key(1, 0), key(2, 1), key(1, 1), key(0, 1)]
    placed = ReqContext("placed")
    for k in asked:
        placed.set_offload_key_position(k, (int.from_bytes(k[:8], "big") + 1) * 16)
    cache.log.access(asked, placed)
    done = cache.log.finish(placed)
    assert done is not None  # by position; at one position group 0 first (a stable sort)
    assert done.keys == [key(0, 0), key(0, 1), key(1, 0), key(1, 1), key(2, 0), key(2, 1)]
    partial = ReqContext("partial")
    partial.set_offload_key_position(key(1, 0), 32)
    assert head_to_tail([key(2, 0), key(1, 0)], partial) == [key(2, 0), key(1, 0)]


def test_clear_makes_every_record_stale() -> None:
    cache = Cache()
    cache.hold(key(1))
    ctx = ReqContext("r")
    cache.log.access([key(1)], ctx)
    cache.log.clear()
    assert cache.log.finish(ctx) is None
    cache.log.access([key(1)], ctx)  # a new record for the new generation
    assert cache.new == [("r", [key(1)]), ("r", [key(1)])]
    two_logs = Cache()
    two_logs.hold(key(1))
    two_logs.log.access([key(1)], ctx)  # another log: its own record on the same context
    assert two_logs.new == [("r", [key(1)])]
