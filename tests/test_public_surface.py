"""The public surface (issue 28): what an engine integrator imports from ``kv_offload`` (at
most 30 names), what each kind of plugin author imports from its module, each documented in
one place (docs/plugin-guide.md, "Plugin-author API", one table per module), and every
distribution under ``plugins/`` importing only those names. That they import only those
modules is import-linter's contract (pyproject.toml, ``lint-imports`` in ``nox -s lint``);
here, that its list of the core's other modules is complete. Names moved out of
``kv_offload`` no longer import from it: the ImportError names their module."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path

import kv_offload
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "plugin-guide.md"
INTEGRATOR_BOUND = 30


def documented() -> dict[str, set[str]]:
    """Module -> the names its table in the guide's "Plugin-author API" section lists."""
    text = GUIDE.read_text()
    section = text[text.index("## Plugin-author API") :]
    section = section[: section.index("\n## ", 1)]
    tables: dict[str, set[str]] = {}
    for block in re.split(r"\n### ", section)[1:]:
        module = re.match(r"`([\w.]+)`", block)
        assert module is not None, block[:80]
        tables[module.group(1)] = set(re.findall(r"^\| `(\w+)` \|", block, re.M))
    return tables


def test_the_integrator_surface_is_small_and_every_name_resolves() -> None:
    assert len(kv_offload.__all__) <= INTEGRATOR_BOUND
    assert len(set(kv_offload.__all__)) == len(kv_offload.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in kv_offload.__all__:
            getattr(kv_offload, name)


def test_each_documented_module_exports_exactly_its_table() -> None:
    tables = documented()
    assert {"kv_offload", "kv_offload.policies", "kv_offload.tiering", "kv_offload.admission"} <= (
        set(tables)
    )
    assert {"kv_offload.plugins", "kv_offload.errors"} <= set(tables)
    for module, names in tables.items():
        exported = set(importlib.import_module(module).__all__)
        assert names == exported, (
            f"docs/plugin-guide.md's table for {module} differs from its __all__: "
            f"only documented {sorted(names - exported)}, only exported {sorted(exported - names)}"
        )


def _core_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for every ``from kv_offload... import name`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "kv_offload" or node.module.startswith("kv_offload."):
                found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kv_offload.") and not alias.name.startswith(
                    "kv_offload_"
                ):
                    found.append((node.lineno, alias.name, "*"))
    return found


def test_plugins_import_only_documented_names() -> None:
    """Of the documented modules (import-linter keeps plugins out of the others; the examples
    are not packages it sees, so they are checked for both here)."""
    tables = documented()
    wrong = []
    plugins = sorted(ROOT.glob("plugins/*/src/**/*.py"))
    for path in plugins + sorted(ROOT.glob("examples/*/*.py")):
        if "/build/" in str(path):
            continue
        for line, module, name in _core_imports(path):
            if module not in tables and path in plugins:
                continue  # lint-imports' "Plugins import only the public API"
            if module not in tables or name not in tables[module]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: from {module} import {name}")
    assert not wrong, "imports of undocumented core names:\n" + "\n".join(wrong)


def _contract(name_start: str) -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = (c for c in config["contracts"] if c["name"].startswith(name_start))
    return dict(contract)


def test_the_public_api_contract_protects_every_other_core_module() -> None:
    """A core module added later is private unless the guide documents it: the contract's
    list must name it (or its package's ``.*``), else plugins could import it unchecked."""
    protected = set(_contract("Plugins import only the public API")["protected_modules"])
    core = ROOT / "core" / "kv_offload"
    public = set(documented())
    missing = []
    for path in sorted(core.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = ["kv_offload", *path.relative_to(core).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name in public or len(parts) == 1:
            continue
        covered = any(
            name == entry
            or name.startswith(entry + ".")
            or (entry.endswith(".*") and name.startswith(entry[:-1]))
            for entry in protected
        )
        if not covered:
            missing.append(name)
    assert not missing, f"pyproject.toml's public-API contract does not protect {missing}"
    assert not public & protected, "a documented module is in the contract's protected list"


def test_import_linter_sees_every_plugin_package() -> None:
    """A plugin whose package is not one of ``root_packages`` escapes every contract: each
    distribution under plugins/ must be listed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    packages = {
        init.parent.name
        for init in ROOT.glob("plugins/*/src/*/__init__.py")
        if "/build/" not in str(init)
    }
    missing = sorted(packages - set(config["root_packages"]))
    assert not missing, f"pyproject.toml's [tool.importlinter] root_packages lacks {missing}"


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("CachePolicy", "kv_offload.policies"),
        ("SecondaryTierManager", "kv_offload.tiering"),
        ("hookimpl", "kv_offload.plugins"),
        ("PluginNotFoundError", "kv_offload.errors"),
    ],
)
def test_a_moved_name_no_longer_imports_and_the_error_names_its_module(
    name: str, module: str
) -> None:
    with pytest.raises(ImportError, match=f"import it from {module}"):
        exec(f"from kv_offload import {name}", {})
    assert hasattr(importlib.import_module(module), name)


def test_the_deprecated_tier_module_is_gone() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"kv_offload\.tier'"):
        importlib.import_module("kv_offload.tier")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        kv_offload.NoSuchThing  # noqa: B018
