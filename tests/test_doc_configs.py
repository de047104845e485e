"""Every config block of the docs is one users can copy: each TOML block of ``README.md``,
``docs/*.md`` and ``plugins/*/README.md`` is validated by the project's own loader
(:func:`kv_offload.load_config`, what ``kv-offload validate`` runs).

What is not a stack config is recognised, not guessed:

* a ``pyproject.toml`` (a ``[project]`` or ``[build-system]`` table) is a distribution's
  metadata: it must parse, nothing more;
* a block preceded by the line ``<!-- config-fragment -->`` shows a few keys of a larger table
  (a tier's keys without their ``[[tiers]]``): it must parse. Use the marker sparingly: a
  block that can be a whole table should be one.

A block showing one section only (a ``[[tiers]]`` entry, a ``[hooks.*]`` table) is validated
as a stack of its own: the loader is given the smallest CPU tier (``num_blocks``, and
``block_size_bytes`` when there are tiers) where the block does not set them. The machine the
docs describe is stood in for: the environment variables they name are set (a 32-byte
secret), each absolute ``*_file`` is an existing file and each absolute ``root_dir`` a
creatable directory under the test's temporary directory, and the machine has the memory of a
GPU server (:data:`SERVER_MEMORY`; the memory check is the machine's, not the block's).

``docs/plugin-guide.md``'s blocks select the plugin templates of ``examples/``, which only
exist once installed: ``tests/test_examples.py`` validates each of them in an environment where
the templates are pip-installed (``test_guide_toml_snippets_parse_and_validate``); here they
must parse.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kv_offload import load_config
from kv_offload.config import resolve

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT_MARKER = "<!-- config-fragment -->"
#: validated where the plugins it selects are installed (see the module docstring)
VALIDATED_ELSEWHERE = {"docs/plugin-guide.md"}

_BLOCK = re.compile(r"^([ \t]*)```toml[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
_ENV_NAME = re.compile(r"_env$")
#: the physical memory of the machine the docs' stacks are written for
SERVER_MEMORY = 1 << 40


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    text: str
    fragment: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "plugins").glob("*/README.md")),
    ]


def toml_blocks() -> list[Block]:
    """Every fenced TOML block of the docs, with its place and whether it is marked as a
    fragment (an indented block, in a list item, is dedented)."""
    blocks = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            indent = match.group(1)
            body = "".join(
                line[len(indent) :] if line.startswith(indent) else line
                for line in match.group(2).splitlines(keepends=True)
            )
            before = text[: match.start()].rstrip().rsplit("\n", 1)[-1].strip()
            blocks.append(
                Block(
                    str(path.relative_to(ROOT)),
                    text.count("\n", 0, match.start()) + 1,
                    body,
                    before == FRAGMENT_MARKER,
                )
            )
    return blocks


def is_stack_config(block: Block, data: dict[str, Any]) -> bool:
    return not (
        block.fragment
        or block.path in VALIDATED_ELSEWHERE
        or "project" in data
        or "build-system" in data
    )


def stand_in(value: Any, tmp: Path, env: dict[str, str], key: str = "") -> Any:
    """``value`` with the documented machine's paths under ``tmp``; the environment
    variables it names collected in ``env``."""
    if isinstance(value, dict):
        return {k: stand_in(v, tmp, env, k) for k, v in value.items()}
    if isinstance(value, list):
        return [stand_in(v, tmp, env, key) for v in value]
    if isinstance(value, str) and _ENV_NAME.search(key):
        env[value] = "d" * 32
    if isinstance(value, str) and value.startswith("/"):
        stand = tmp / value.strip("/").replace("/", "_")
        if key.endswith("_file"):
            stand.write_text("")
            return str(stand)
        if key == "root_dir":
            return str(stand)
    return value


BLOCKS = toml_blocks()


def test_the_docs_have_config_blocks_and_the_fragment_marker_is_rare() -> None:
    configs = [b for b in BLOCKS if is_stack_config(b, tomllib.loads(b.text))]
    assert len(configs) >= 10, [str(b) for b in configs]
    assert sum(b.fragment for b in BLOCKS) <= 3, [str(b) for b in BLOCKS if b.fragment]


# The documented machine's disk is larger than this one's: the fs tier warns, rightly.
@pytest.mark.filterwarnings("ignore:.*the capacity needs .* bytes on disk")
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_every_toml_block_of_the_docs_validates(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tomllib.loads(block.text)  # every block parses, whatever it is
    if not is_stack_config(block, data):
        return
    env: dict[str, str] = {}
    config = stand_in(data, tmp_path, env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(resolve, "physical_memory_bytes", lambda: SERVER_MEMORY)
    if "num_blocks" not in config and "cpu_bytes" not in config:
        config["num_blocks"] = 16
    if config.get("tiers") and "block_size_bytes" not in config:
        config["block_size_bytes"] = 4096
    load_config(config)  # a ConfigError here names the block's bad key
    assert not any(tmp_path.iterdir()) or all(p.is_file() for p in tmp_path.iterdir()), (
        "validating created a directory"
    )
