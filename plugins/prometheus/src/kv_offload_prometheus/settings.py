"""The ``[hooks.prometheus]`` table, checked without side effects.

=================  ==============  ============  ==========================================
setting            type            default       meaning
=================  ==============  ============  ==========================================
``port``           int 0..65535    unset         serve ``/metrics`` over HTTP on this port
                                                 (0: any free port); unset: no server
``addr``           str             "127.0.0.1"   the address the server binds (an IP
                                                 address or a host name)
``prefix``         str             "kv_offload"  first part of every metric name
``buckets``        list[float]     1e-4 .. 10    upper bounds (seconds) of the tier-job
                                                 latency histogram: > 0, increasing
``max_managers``   int > 0         8             managers watched at once (the bound of the
                                                 ``manager`` label)
``global_registry``  bool          false         also register on
                                                 ``prometheus_client.REGISTRY``
=================  ==============  ============  ==========================================
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kv_offload import ConfigError

__all__ = ["DEFAULT_BUCKETS", "Settings", "parse_settings"]

#: From 100 us (a memory tier) to 10 s (a remote store under load).
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_METRIC_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


@dataclass(frozen=True)
class Settings:
    """What the exporter is built from; see the module docstring for each field."""

    port: int | None = None
    addr: str = "127.0.0.1"
    prefix: str = "kv_offload"
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    max_managers: int = 8
    global_registry: bool = False


_KNOWN = {f.name for f in fields(Settings)}


def _fail(key: str, message: str) -> ConfigError:
    # The core locates the error at the setting the message names first.
    return ConfigError(f"{key} {message}")


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail("port", f"must be an integer port number, got {value!r}")
    if not 0 <= value <= 65535:
        raise _fail("port", f"must be in 0..65535 (0: any free port), got {value}")
    return value


def _addr(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail("addr", f"must be an IP address or a host name, got {value!r}")
    try:
        ipaddress.ip_address(value)
    except ValueError:
        # Dotted digits that are no IPv4 address ("127.0.0.1.5", "300.1.1.1") are a typo,
        # not a host name.
        if re.fullmatch(r"[0-9.]+", value) or not _HOST_NAME.fullmatch(value):
            raise _fail(
                "addr", f"must be an IP address (e.g. 127.0.0.1, ::1) or a host name, got {value!r}"
            ) from None
    return value


def _prefix(value: Any) -> str:
    if not isinstance(value, str) or not _METRIC_PREFIX.fullmatch(value):
        raise _fail(
            "prefix",
            f"must be a Prometheus metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*), got {value!r}",
        )
    return value


def _buckets(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise _fail(
            "buckets", f"must be a non-empty list of upper bounds in seconds, got {value!r}"
        )
    bounds: list[float] = []
    for bound in value:
        if isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise _fail("buckets", f"must hold numbers (seconds), got {bound!r}")
        if not math.isfinite(bound) or bound <= 0:
            raise _fail("buckets", f"must be finite and > 0 (+Inf is always added), got {bound!r}")
        if bounds and bound <= bounds[-1]:
            raise _fail(
                "buckets", f"must be strictly increasing, got {bound!r} after {bounds[-1]!r}"
            )
        bounds.append(float(bound))
    return tuple(bounds)


def _positive(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(key, f"must be an integer > 0, got {value!r}")
    return value


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false, got {value!r}")
    return value


def parse_settings(table: Mapping[str, Any]) -> Settings:
    """The :class:`Settings` of a ``[hooks.prometheus]`` table (``{}``: the defaults); raises
    :class:`~kv_offload.ConfigError` naming the setting."""
    for key in table:
        if key not in _KNOWN:
            close = difflib.get_close_matches(key, sorted(_KNOWN), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise _fail(
                key,
                f"is not a setting of kv-offload-prometheus{hint} (settings: "
                f"{', '.join(sorted(_KNOWN))})",
            )
    defaults = Settings()
    return Settings(
        port=_port(table["port"]) if "port" in table else None,
        addr=_addr(table.get("addr", defaults.addr)),
        prefix=_prefix(table.get("prefix", defaults.prefix)),
        buckets=_buckets(table["buckets"]) if "buckets" in table else defaults.buckets,
        max_managers=_positive("max_managers", table.get("max_managers", defaults.max_managers)),
        global_registry=_boolean(
            "global_registry", table.get("global_registry", defaults.global_registry)
        ),
    )
