"""Secrets out of printouts: what ``kv-offload validate`` shows of tier arguments.

Tier arguments may carry credentials: a password inside a URL (``redis://:secret@host``) or a
key named like a secret (``password``, ``token``, ...). :func:`redact_secrets` returns a copy
with those replaced by ``***``; the tier itself still receives the real values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_secrets", "redact_url"]

_SECRET_KEY = re.compile(r"pass(word|wd)?$|secret|token|credential|api_?key", re.IGNORECASE)
MASK = "***"


def redact_url(value: str) -> str:
    """``value`` with the password of a ``scheme://user:password@host`` URL masked."""
    if "://" not in value or "@" not in value:
        return value
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return value
    if password is None:
        return value
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}:{MASK}@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_secrets(value: Any, key: str = "") -> Any:
    """A copy of ``value`` (mappings and lists walked) with secrets masked."""
    if isinstance(value, Mapping):
        return {k: redact_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_secrets(v, key) for v in value)
    if isinstance(value, str):
        if value and _SECRET_KEY.search(key) and not key.endswith("_env"):
            return MASK
        return redact_url(value)
    return value
