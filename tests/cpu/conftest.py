"""Fixtures of the CPU manager tests: every test runs on each installed policy."""

from __future__ import annotations

import pytest
from _cpu_helpers import POLICIES, ManagerFactory, installed_policies
from kv_offload import CPUOffloadingManager


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in installed_policies():
        # Only a policy that is not installed at all is skipped; one that is installed but
        # fails to import makes the manager constructor raise, so the tests fail.
        pytest.skip(f"policy plugin {name!r} is not installed")
    return name


@pytest.fixture
def make(policy: str) -> ManagerFactory:
    def factory(num_blocks: int = 4, enable_events: bool = False) -> CPUOffloadingManager:
        return CPUOffloadingManager(num_blocks, cache_policy=policy, enable_events=enable_events)

    return factory
