"""``docs/configuration.md``, rendered from the schema's declarations (:mod:`.schema`), plus
the rows of keys the core reads itself (a tier's ``write_policy``, ``admission``, ...) and the
global ``[backpressure]`` table. A test compares the file with :func:`docs_page`, quoting
:data:`REGENERATE` until the two agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from .rules import REQUIRED
from .schema import TABLES, TOP_FIELDS

__all__ = ["DOCS_PATH", "REGENERATE", "docs_page", "docs_table", "write_docs"]


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
REGENERATE: Final = "python -c 'from kv_offload.config.docs import write_docs; write_docs()'"

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
