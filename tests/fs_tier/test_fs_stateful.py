"""The fs tier alone against a dict model: stores, loads, touches, damaged files and restarts
in random order, on real files. The model is an LRU ``OrderedDict`` of key -> bytes; after a
restart (recency is then the order blocks were written, which the model cannot know to the
nanosecond) it adopts the tier's order once it has checked the same blocks came back."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, JobResult, OffloadingConfig
from kv_offload_fs_tier import FileSystemTier

BLOCK = 512
CAPACITY = 6
CPU_SLOTS = 8
UNIVERSE = [make_offload_key(i) for i in range(14)]
CTX = ReqContext("model")

_ROOT: list[Path] = []


def _empty_root() -> Path:
    """One tier directory for all examples, emptied of blocks for each: creating a fresh
    one (256 directories, a synced marker) per example would dominate the run."""
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="kv-fs-stateful-")) / "fs")
        atexit.register(shutil.rmtree, _ROOT[0].parent, True)
    root = _ROOT[0]
    for file in root.glob("blocks/*/*"):
        file.unlink()
    return root


keys_strategy = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=4, unique=True)


class FsTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = _empty_root()
        self.cpu = CPUOffloadingManager(CPU_SLOTS, block_size_bytes=BLOCK)
        assert self.cpu.kv_buffer is not None
        self.rows = self.cpu.kv_buffer.array
        self.rng = np.random.default_rng(0)
        self.model: OrderedDict[OffloadKey, bytes] = OrderedDict()
        self.job_id = 0
        self.tier = self._open()

    def _open(self) -> FileSystemTier:
        config = OffloadingConfig(CPU_SLOTS, BLOCK)
        assert self.cpu.kv_buffer is not None
        return FileSystemTier(
            config, self.cpu.kv_buffer.view, "fs", self.root, capacity_blocks=CAPACITY
        )

    def _run(self, keys: list[OffloadKey], direction: JobDirection) -> JobResult:
        job = JobMetadata(self.job_id, keys, np.arange(len(keys), dtype=np.int64), direction, CTX)
        self.job_id += 1
        if direction is JobDirection.STORE:
            self.tier.submit_store(job)
        else:
            self.tier.submit_load(job)
        results: list[JobResult] = []
        for _ in range(100_000):
            results += self.tier.get_finished()
            if results:
                break
            time.sleep(0.0001)  # let the I/O threads run
        assert [r.job_id for r in results] == [job.job_id]
        return results[0]

    @rule(keys=keys_strategy)
    def store(self, keys: list[OffloadKey]) -> None:
        data = self.rng.integers(0, 256, (len(keys), BLOCK), dtype=np.uint8)
        self.rows[: len(keys)] = data
        assert self._run(keys, JobDirection.STORE).success
        new = [k for k in keys if k not in self.model]
        for k in keys:
            if k in self.model:
                self.model.move_to_end(k)  # already stored: kept as it was, now recent
        while len(self.model) + len(new) > CAPACITY:
            self.model.popitem(last=False)
        for i, k in enumerate(keys):
            if k in new:
                self.model[k] = data[i].tobytes()

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        keys = data.draw(
            st.lists(st.sampled_from(list(self.model)), min_size=1, max_size=4, unique=True)
        )
        self.rows[: len(keys)] = 0
        assert self._run(keys, JobDirection.LOAD).success
        for i, k in enumerate(keys):
            assert self.rows[i].tobytes() == self.model[k]
            self.model.move_to_end(k)

    @rule(k=st.sampled_from(UNIVERSE))
    def load_missing_fails(self, k: OffloadKey) -> None:
        if k in self.model:
            return
        assert not self._run([k], JobDirection.LOAD).success
        assert self.tier.lookup(k, CTX) is False

    @rule(keys=keys_strategy)
    def touch(self, keys: list[OffloadKey]) -> None:
        self.tier.touch(keys, CTX)
        for k in keys:
            if k in self.model:
                self.model.move_to_end(k)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), offset=st.integers(0, 4096 + BLOCK - 1))
    def damage_then_load(self, data: st.DataObject, offset: int) -> None:
        k = data.draw(st.sampled_from(list(self.model)))
        path = self.root / "blocks"
        (file,) = path.glob(f"*/{k.hex()}")
        raw = bytearray(file.read_bytes())
        raw[offset] ^= 0x01
        file.write_bytes(bytes(raw))
        assert not self._run([k], JobDirection.LOAD).success
        del self.model[k]
        assert self.tier.lookup(k, CTX) is False

    @rule()
    def restart(self) -> None:
        self.tier.shutdown()
        self.tier = self._open()
        assert set(self.tier.stored_keys()) == set(self.model)
        assert self.tier.get_stats().recovered_blocks == len(self.model)
        self.model = OrderedDict((k, self.model[k]) for k in self.tier.stored_keys())
        files = sorted(p.name for p in (self.root / "blocks").glob("*/*"))
        assert files == sorted(k.hex() for k in self.model)

    @invariant()
    def same_blocks(self) -> None:
        assert self.tier.stored_keys() == list(self.model)
        assert len(self.tier) <= CAPACITY
        for k in UNIVERSE:
            assert self.tier.lookup(k, CTX) is (k in self.model)

    def teardown(self) -> None:
        self.tier.shutdown()


FsTierMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fs_tier_against_a_dict_model = FsTierMachine.TestCase
