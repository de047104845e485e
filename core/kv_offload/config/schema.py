"""Every config key, declared once: name, type, default, meaning and the rule its value obeys.

Everything else about config keys is derived from :data:`TOP_FIELDS`, :data:`HOOK_FIELDS`
and :data:`TIER_FIELDS`: the key table in ``docs/configuration.md`` (:mod:`.docs`; a test
compares the file with it), the value rules (:mod:`.rules`), the known-key sets
behind "unknown key; did you mean ...", the per-key checks, the defaults of
:class:`~kv_offload.config.StackConfig` and what ``describe()`` (``kv-offload validate``)
shows. Rules that relate two keys (``num_blocks`` or ``cpu_bytes``, tiers needing
``block_size_bytes``) live with the parser, which applies them after the per-key checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .rules import (
    BOOLEAN,
    NAME,
    NAMES,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    POSITIVE_SECONDS,
    REQUIRED,
    TABLE,
    Rule,
)

__all__ = ["Field", "HOOK_FIELDS", "TABLES", "TIER_FIELDS", "TOP_FIELDS"]


@dataclass(frozen=True)
class Field:
    """One config key.

    ``default`` is the value an absent key takes (``None``: unset, :data:`REQUIRED`: must be
    given). ``shown`` is the section of ``describe()`` that reports it: ``"cpu"``, ``""`` for
    the top level, ``None`` for an input folded into another key (``cpu_bytes``).
    ``description`` is Markdown: it is written as is into ``docs/configuration.md``.
    """

    name: str
    rule: Rule
    default: Any
    description: str
    shown: str | None = ""

    def check(self, value: Any) -> Any:
        """The value to keep for ``value`` as written (``None`` leaves an optional key unset)."""
        if value is None and self.default is None:
            return None
        return self.rule.check(value)


TOP_FIELDS: Final[tuple[Field, ...]] = (
    Field(
        "num_blocks",
        POSITIVE_INT,
        20000,
        "CPU tier size in blocks (or use `cpu_bytes`)",
        shown="cpu",
    ),
    Field(
        "cpu_bytes",
        POSITIVE_INT,
        None,
        "CPU tier size in bytes; needs `block_size_bytes`; exclusive with `num_blocks`",
        shown=None,
    ),
    Field(
        "block_size_bytes",
        POSITIVE_INT,
        None,
        "bytes per block; gives the CPU tier a KV buffer; required when `tiers` is non-empty",
        shown="cpu",
    ),
    Field("policy", NAME, "lru", "eviction policy plugin name", shown="cpu"),
    Field(
        "policy_module_path",
        NAME,
        None,
        "module defining the class named `policy` (out-of-tree fallback)",
        shown="cpu",
    ),
    Field("allow_module_path", BOOLEAN, True, "false forbids every `module_path` import"),
    Field("enable_events", BOOLEAN, False, "record `OffloadingEvent` batches", shown="cpu"),
    Field(
        "store_threshold",
        NON_NEGATIVE_INT,
        0,
        "reuse filter: store a block in the CPU tier from its n-th offer on (below 2: off)",
        shown="cpu",
    ),
    Field(
        "max_tracker_size",
        POSITIVE_INT,
        64000,
        "reuse filter: keys whose offers are counted (least recently offered forgotten first)",
        shown="cpu",
    ),
    Field(
        "admission",
        NAME,
        None,
        "admission plugin (`kv_offload.admission`) choosing which offered blocks the CPU tier "
        'stores (unset: all); `store_threshold = n` is `admission = "store-threshold"` with '
        "`admission_options = {threshold = n}`, so set one of the two",
        shown="cpu",
    ),
    Field("admission_options", TABLE, None, "the CPU tier admission's settings", shown="cpu"),
    Field(
        "admission_module_path",
        NAME,
        None,
        "module defining the class named `admission` (out-of-tree admission)",
        shown="cpu",
    ),
    Field(
        "write_back_buffer_blocks",
        POSITIVE_INT,
        None,
        "staging rows for blocks a `write-back` tier is still writing after the CPU tier "
        "evicted them (default: 1/16 of `num_blocks`, at least 64, at most `num_blocks`); "
        "more rows let a slow tier fall further behind before an eviction waits, and one "
        "store evicting more blocks than there are rows leaves the rest unwritten",
        shown=None,
    ),
    Field(
        "drain_timeout_s",
        POSITIVE_SECONDS,
        30.0,
        "how long shutdown and drain wait for tier jobs to report",
    ),
    Field(
        "promotion_timeout_s",
        POSITIVE_SECONDS,
        10.0,
        'a lookup answered `PENDING` (a promotion, or a tier\'s "ask again") becomes `MISS` '
        "after this long, whatever the tier does",
    ),
    Field(
        "promotion_backoff_s",
        POSITIVE_SECONDS,
        1.0,
        "after a failed promotion, the tier is not asked about the key for this long "
        "(doubling with each failure in a row)",
    ),
    Field(
        "promotion_max_failures",
        POSITIVE_INT,
        3,
        "failed promotions of a key in a row after which its tier is not asked about it "
        "until the key is stored to it again",
    ),
)

HOOK_FIELDS: Final[tuple[Field, ...]] = (
    Field("autoload", BOOLEAN, True, "load `kv_offload.hooks` entry points"),
    Field("enable", NAMES, (), "only these hook plugins load (empty: all)"),
    Field("block", NAMES, (), "these hook plugins never load"),
)

TIER_FIELDS: Final[tuple[Field, ...]] = (
    Field("type", NAME, REQUIRED, "secondary tier plugin name, in cascade order"),
    Field(
        "name",
        NAME,
        None,
        "what stats, events and hooks call the tier (default: the type); unique; unnamed "
        "repeats of a type are `<position>:<type>` (`1:fs`, `2:fs`)",
    ),
    Field("module_path", NAME, None, "module defining the class named `type`"),
)

#: Top-level keys that hold tables: ``[hooks]`` (one table), ``[[tiers]]`` (a list of them).
TABLES: Final[dict[str, tuple[Field, ...]]] = {"hooks": HOOK_FIELDS, "tiers": TIER_FIELDS}

#: Rows documenting keys no field declares: what plugins define for themselves.
