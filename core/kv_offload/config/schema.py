"""Every config key, declared once: name, type, default, meaning and the rule its value obeys.

Everything else about config keys is derived from :data:`TOP_FIELDS`, :data:`HOOK_FIELDS`
and :data:`TIER_FIELDS`: the key table in ``docs/configuration.md`` (:func:`docs_page`, which
:func:`write_docs` writes there; a test compares the file with it), the known-key sets
behind "unknown key; did you mean ...", the per-key checks, the defaults of
:class:`~kv_offload.config.StackConfig` and what ``describe()`` (``kv-offload validate``)
shows. Rules that relate two keys (``num_blocks`` or ``cpu_bytes``, tiers needing
``block_size_bytes``) live with the parser, which applies them after the per-key checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "Field",
    "Invalid",
    "REQUIRED",
    "TOP_FIELDS",
    "HOOK_FIELDS",
    "TIER_FIELDS",
    "TABLES",
    "DOCS_PATH",
    "REGENERATE",
    "docs_table",
    "docs_page",
    "write_docs",
]


class Invalid(ValueError):
    """A value broke its key's rule; the message says how (``must be > 0, got 0``)."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a key that must be set.
REQUIRED: Final = _Required()


@dataclass(frozen=True)
class _Rule:
    """A value check: ``check(value)`` returns the value to keep or raises :class:`Invalid`."""

    type_text: str
    check: Callable[[Any], Any]


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be an integer, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise Invalid(f"must be > 0, got {value}")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise Invalid(f"must be >= 0, got {value}")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"must be a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {value!r}")
    return value


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"must be a list of plugin names, got {value!r}")
    return tuple(value)


def _positive_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"must be a number of seconds, got {type(value).__name__} {value!r}")
    if not 0 < value < float("inf"):
        raise Invalid(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(f"must be a table, got {type(value).__name__} {value!r}")
    return dict(value)


POSITIVE_INT = _Rule("int > 0", _positive_int)
NON_NEGATIVE_INT = _Rule("int >= 0", _non_negative_int)
POSITIVE_SECONDS = _Rule("float > 0", _positive_seconds)
NAME = _Rule("str", _name)
BOOLEAN = _Rule("bool", _boolean)
NAMES = _Rule("list[str]", _names)
TABLE = _Rule("table", _table)
ANY = _Rule("any", lambda value: value)


@dataclass(frozen=True)
class Field:
    """One config key.

    ``default`` is the value an absent key takes (``None``: unset, :data:`REQUIRED`: must be
    given). ``shown`` is the section of ``describe()`` that reports it: ``"cpu"``, ``""`` for
    the top level, ``None`` for an input folded into another key (``cpu_bytes``).
    ``description`` is Markdown: it is written as is into ``docs/configuration.md``.
    """

    name: str
    rule: _Rule
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
_HOOK_SETTINGS_ROW = (
    "`[hooks.<name>]`",
    "table",
    "unset",
    "settings of hook plugin `<name>`, checked by the plugin's `parse_settings` (see "
    "`kv_offload.hooks`)",
)
#: Keys the tier factory handles for every tier (``kv_offload.tiering.factory``), and the
#: top-level default of one of them.
_CORE_TIER_ROWS = (
    (
        "`[[tiers]] locality`",
        "str",
        "unset",
        '"local" or "remote" (tier filters, and the backpressure defaults)',
    ),
    (
        "`[[tiers]] backpressure`",
        "table",
        "unset",
        "the tier's backpressure (cascade gate); see `kv_offload.tiering.cascade_gate`",
    ),
    (
        "`[[tiers]] write_policy`",
        "str",
        '"write-through"',
        'when the tier is written: `"write-through"` (every CPU store), '
        '`"write-through-selective"` (the stores its admission admits; default admission '
        '`store-threshold`) or `"write-back"` (when the CPU tier evicts a block); see '
        "`kv_offload.tiering.writes`",
    ),
    (
        "`[[tiers]] admission`",
        "str",
        "unset",
        "admission plugin (`kv_offload.admission`) choosing which offered blocks the tier "
        "writes (unset: all)",
    ),
    (
        "`[[tiers]] admission_options`",
        "table",
        "unset",
        "the admission's settings",
    ),
    (
        "`[[tiers]] admission_module_path`",
        "str",
        "unset",
        "module defining the class named `admission` (out-of-tree admission)",
    ),
    (
        "`[backpressure]`",
        "table",
        "unset",
        "default of every tier's `backpressure` (a tier's own keys win, key by key)",
    ),
)
_TIER_ARGUMENTS_ROW = ("`[[tiers]] <other>`", "any", "", "the tier's own constructor arguments")

#: Where the rendered page lives (from the repository root), and the command, run there, that
#: rewrites it after a key changes; a test fails, quoting the command, until the two agree.
DOCS_PATH: Final = "docs/configuration.md"
REGENERATE: Final = "python -c 'from kv_offload.config.schema import write_docs; write_docs()'"

_INTRO = (
    "Every key a config (a TOML file or a dict, see the README's Configuration section) "
    "accepts;\na TOML file may set any subset. Generated from the declarations in\n"
    "`core/kv_offload/config/schema.py`; after changing a key, regenerate it with\n"
    f"`{REGENERATE}`."
)


def _default_text(default: Any) -> str:
    if default is REQUIRED or default is None:
        return "required" if default is REQUIRED else "unset"
    # TOML writes booleans, numbers, strings and lists of strings as JSON does.
    return f"`{json.dumps(default)}`"


def _rows() -> list[tuple[str, str, str, str]]:
    rows = [
        (f"`{f.name}`", f.rule.type_text, _default_text(f.default), f.description)
        for f in TOP_FIELDS
    ]
    for table, fields in TABLES.items():
        header = f"[[{table}]]" if table == "tiers" else f"[{table}]"
        rows += [
            (f"`{header} {f.name}`", f.rule.type_text, _default_text(f.default), f.description)
            for f in fields
        ]
        if table == "hooks":
            rows.append(_HOOK_SETTINGS_ROW)
    rows += _CORE_TIER_ROWS
    rows.append(_TIER_ARGUMENTS_ROW)
    return rows


def docs_table() -> str:
    """The Markdown table of every key: key, type, default, meaning. The short columns are
    padded so the file reads as a table too; the meaning, last and long, is not."""
    rows = [("key", "type", "default", "meaning"), *_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "| " + " | ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[3]]) for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|---")
    return "\n".join(lines)


def docs_page() -> str:
    """The whole of :data:`DOCS_PATH`: a heading, where the table comes from, the table."""
    return f"# Configuration keys\n\n{_INTRO}\n\n{docs_table()}\n"


def write_docs(root: str | Path = ".") -> Path:
    """Rewrite :data:`DOCS_PATH` under ``root`` (the repository root) from the declarations."""
    path = Path(root) / DOCS_PATH
    path.write_text(docs_page(), encoding="utf-8", newline="\n")
    return path
