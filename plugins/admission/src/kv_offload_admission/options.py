"""Checks of ``admission_options`` values, so each admission rejects a bad setting with a
:class:`~kv_offload.errors.ConfigError` naming the admission, the option and the fix."""

from __future__ import annotations

from typing import Any

from kv_offload.errors import ConfigError

__all__ = ["int_option", "window"]


def int_option(admission: str, name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{admission} option {name} must be an int, got {type(value).__name__} {value!r}",
            key="admission_options",
        )
    if value < minimum:
        raise ConfigError(
            f"{admission} option {name} must be >= {minimum}, got {value}",
            key="admission_options",
        )
    return value


def window(admission: str, name: str, value: Any, capacity_blocks: int | None) -> int:
    """A size in blocks that defaults to the tier's capacity: ``value`` if given, else
    ``capacity_blocks``; neither is an error saying which option to set."""
    if value is not None:
        return int_option(admission, name, value, 1)
    if capacity_blocks is None:
        raise ConfigError(
            f"{admission} needs the tier's capacity in blocks, and this tier does not "
            f"declare one: set admission_options = {{{name} = N}}",
            key="admission_options",
        )
    return capacity_blocks
