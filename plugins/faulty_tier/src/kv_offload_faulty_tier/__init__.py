"""``faulty``: a secondary tier that wraps any other tier and injects faults.

Tier authors use it to soak-test their tier (and the manager around it) against what real
storage does: jobs that fail, results that arrive late, ``submit_*`` and ``lookup`` calls that
raise, and a device slower than the CPU tier cascades to it. Select it in config and name the
wrapped tier in its ``inner`` table::

    [[tiers]]
    type = "faulty"
    fail_rate = 0.05          # fraction of jobs reported as failed
    seconds_per_mib = 0.01    # a 100 MiB/s device: results wait for a serial transfer queue
    seed = 7

    [tiers.inner]             # the tier under test, exactly as it would be configured alone
    type = "example"
    capacity_blocks = 100000
"""

from __future__ import annotations

from .faults import FaultCounters, FaultPlan, InjectedFault
from .tier import FaultyTier

__all__ = ["FaultCounters", "FaultPlan", "FaultyTier", "InjectedFault"]
