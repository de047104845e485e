"""Step 1 and the whole flow: a config from where it comes from (a TOML file, a dict, a
parsed :class:`~kv_offload.config.model.StackConfig`), read, parsed (:mod:`.parse`) and its
plugin names resolved against what is installed (:mod:`.resolve`). Building the stack is
:func:`kv_offload.build_manager`'s, after the memory estimate (:mod:`.memory`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .model import StackConfig
from .parse import parse_config
from .resolve import BuiltSettings, resolve_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["load_checked", "load_config"]


def load_config(config: Mapping[str, Any] | str | Path | StackConfig) -> StackConfig:
    """A validated config from a dict, a TOML file path, or an existing :class:`StackConfig`,
    with every plugin name resolved against what is installed."""
    return load_checked(config)[0]


def load_checked(
    config: Mapping[str, Any] | str | Path | StackConfig,
) -> tuple[StackConfig, BuiltSettings]:
    """:func:`load_config`, with the settings objects its checks built (the CPU tier's
    admission, each tier's gate and admission): ``build_manager`` builds the stack from
    them, so each is built once."""
    if isinstance(config, StackConfig):
        parsed = config
    elif isinstance(config, (str, Path)):
        path = Path(config)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (TOML): {exc.reason}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            # tomllib says "... (at line 3, column 9)"; say it the way every other error does.
            found = re.search(r"at line (\d+)", str(exc))
            where = f"{path}:{found.group(1)}" if found else str(path)
            raise ConfigError(f"{where}: invalid TOML: {exc}") from None
        parsed = parse_config(data, str(path), text)
    else:
        parsed = parse_config(config)
    return parsed, resolve_config(parsed)
