"""docs/architecture.md's "Layout" names every module of the core and every distribution
under plugins/, and names nothing that does not exist: the map a new maintainer reads first
cannot drift from the tree (as docs/configuration.md cannot drift from the schema)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "kv_offload"
DOC = ROOT / "docs" / "architecture.md"


def layout_block() -> str:
    text = DOC.read_text()
    section = text[text.index("## Layout") :]
    match = re.search(r"```\n(.*?)```", section, re.S)
    assert match is not None, "docs/architecture.md's Layout has no code block"
    return match.group(1)


def core_modules() -> list[Path]:
    return sorted(
        p.relative_to(CORE)
        for p in CORE.rglob("*.py")
        if "__pycache__" not in p.parts and (p.name != "__init__.py" or p.parent == CORE)
    )


def test_the_layout_names_every_core_module_and_package() -> None:
    block = layout_block()
    named = set(re.findall(r"[\w]+\.py", block))
    missing = [str(p) for p in core_modules() if p.name not in named]
    packages = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
    missing += [f"{p}/" for p in packages if f"{p}/" not in block]
    assert not missing, f"docs/architecture.md's Layout does not name: {', '.join(missing)}"


def test_the_layout_names_every_plugin_distribution() -> None:
    block = layout_block()
    plugins = sorted(
        p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file()
    )
    missing = [p for p in plugins if not re.search(rf"\b{re.escape(p)}\b", block)]
    assert not missing, f"docs/architecture.md's Layout does not name plugins: {missing}"


def test_every_module_the_layout_names_exists() -> None:
    block = layout_block().split("\nplugins/", 1)[0]  # the core's part
    existing = {p.name for p in CORE.rglob("*.py")}
    ghosts = sorted(set(re.findall(r"[\w]+\.py", block)) - existing)
    assert not ghosts, f"docs/architecture.md's Layout names modules that do not exist: {ghosts}"
