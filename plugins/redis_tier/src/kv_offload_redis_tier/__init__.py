"""kv-offload-redis-tier: a secondary tier shared by many engines through Redis or Valkey.

Select it with ``[[tiers]] type = "redis"``; the options are the arguments of
:class:`RedisTier` (see the distribution's README).
"""

from __future__ import annotations

from .settings import RedisTierSettings
from .stored import FORMAT_VERSION
from .tier import RedisTier, RedisTierStats

__all__ = ["FORMAT_VERSION", "RedisTier", "RedisTierSettings", "RedisTierStats"]
