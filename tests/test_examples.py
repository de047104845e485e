"""The plugin templates under ``examples/``, pip-installed for real and selected by name, and
the guide (``docs/plugin-guide.md``) that shows them."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _dists import DistSpec, PluginEnv, can_build_with_setuptools

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GUIDE = ROOT / "docs" / "plugin-guide.md"

#: example folder -> (distribution, entry-point group, entry-point name, plugin kind)
TEMPLATES = {
    "policy-fifo": ("kv-offload-fifo", "kv_offload.policies", "fifo", "policy"),
    "tier-dict": ("kv-offload-dict-tier", "kv_offload.tiers", "dict", "tier"),
    "hook-eviction-log": ("kv-offload-eviction-log", "kv_offload.hooks", "eviction-log", "hook"),
    "admission-sampled": (
        "kv-offload-sampled-admission",
        "kv_offload.admission",
        "sampled",
        "admission",
    ),
}

PRELUDE = """
import json, logging, sys
import numpy as np
import kv_offload
from kv_offload import LookupResult, ReqContext, build_manager, make_offload_key
K = make_offload_key
"""


def template_dist(folder: str) -> DistSpec:
    """The distribution an example's ``pyproject.toml`` describes: its name, version, entry
    points and modules, read from the files themselves."""
    pyproject = tomllib.loads((EXAMPLES / folder / "pyproject.toml").read_text())
    project = pyproject["project"]
    modules = pyproject["tool"]["setuptools"]["py-modules"]
    return DistSpec(
        name=project["name"],
        version=project["version"],
        files={f"{m}.py": (EXAMPLES / folder / f"{m}.py").read_text() for m in modules},
        entry_points=project["entry-points"],
        summary=project["description"],
    )


@pytest.fixture(scope="module")
def env(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path_factory: pytest.TempPathFactory
) -> PluginEnv:
    """A real virtual environment with the three examples pip-installed as wheels built from
    their pyproject metadata and sources (in milliseconds, without a build backend)."""
    plugin_env = plugin_env_factory("examples")
    plugin_env.install_specs(
        [template_dist(folder) for folder in TEMPLATES], tmp_path_factory.mktemp("wheels")
    )
    return plugin_env


def test_templates_declare_their_entry_points_and_modules() -> None:
    for folder, (dist, group, name, _) in TEMPLATES.items():
        pyproject = tomllib.loads((EXAMPLES / folder / "pyproject.toml").read_text())
        assert pyproject["build-system"]["build-backend"] == "setuptools.build_meta"
        assert pyproject["project"]["name"] == dist
        module = pyproject["project"]["entry-points"][group][name].split(":")[0]
        # setuptools packages exactly the template's module, the one the entry point names
        modules = {path.stem for path in (EXAMPLES / folder).glob("*.py")}
        assert pyproject["tool"]["setuptools"]["py-modules"] == [module]
        assert modules == {module}


def test_a_template_builds_with_setuptools(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path: Path
) -> None:
    """One template through the real build backend (the others share its pyproject shape)."""
    reason = can_build_with_setuptools()
    if reason is not None:
        pytest.skip(reason)
    project = shutil.copytree(EXAMPLES / "policy-fifo", tmp_path / "policy-fifo")  # no build/
    built = plugin_env_factory("setuptools-build")
    built.install(project)
    found = built.run_json(
        "import json\nfrom kv_offload.policies import CachePolicyFactory\n"
        "cls = CachePolicyFactory.get_cache_policy_cls('fifo')\n"
        "print(json.dumps(cls.__module__ + '.' + cls.__name__))"
    )
    assert found == "kv_offload_fifo.FIFOCachePolicy"


def test_installed_and_listed_by_the_cli(env: PluginEnv) -> None:
    assert set(env.versions(*(t[0] for t in TEMPLATES.values())).values()) == {"0.1.0"}
    proc = env.run(
        "import sys\nfrom kv_offload.cli import main\nsys.exit(main(['plugins', '--json']))"
    )
    assert proc.returncode == 0, proc.stderr
    rows = {(p["name"], p["kind"]): p for p in json.loads(proc.stdout)}
    for dist, _, name, kind in TEMPLATES.values():
        info = rows[(name, kind)]
        assert (info["distribution"], info["version"], info["error"]) == (dist, "0.1.0", None)


def test_fifo_policy_evicts_in_fifo_order(env: PluginEnv) -> None:
    result = env.run_json(
        PRELUDE
        + """
manager = build_manager({"num_blocks": 3, "policy": "fifo", "hooks": {"autoload": False}})
ctx = ReqContext("r")
manager.on_new_request(ctx)
for i in (1, 2, 3):
    out = manager.prepare_store([K(i)], ctx)
    manager.complete_store(out.keys_to_store, ctx)
manager.touch([K(1)], ctx)  # LRU would now keep block 1; FIFO ignores reuse
evicted = []
for i in (4, 5):
    evicted += manager.prepare_store([K(i)], ctx).evicted_keys
    manager.complete_store([K(i)], ctx)
print(json.dumps({
    "policy": type(manager.policy).__module__ + "." + type(manager.policy).__name__,
    "evicted": [k.hex() for k in evicted],
}))
"""
    )
    assert result == {
        "policy": "kv_offload_fifo.FIFOCachePolicy",
        "evicted": [_key_hex(1), _key_hex(2)],
    }


def _key_hex(block_hash: int) -> str:
    from kv_offload import make_offload_key

    return make_offload_key(block_hash).hex()


def test_dict_tier_round_trips_bytes_through_a_promotion(env: PluginEnv) -> None:
    result = env.run_json(
        PRELUDE
        + """
config = {
    "num_blocks": 2,
    "block_size_bytes": 64,
    "tiers": [{"type": "dict", "max_blocks": 16}],
    "hooks": {"autoload": False},
}
manager = build_manager(config)
buffer = manager.kv_buffer
ctx = ReqContext("store")
manager.on_new_request(ctx)
payload = {i: np.full(64, i * 7, np.uint8) for i in (1, 2, 3)}
for i in (1, 2, 3):  # the third store evicts block 1 from the 2-block CPU tier
    out = manager.prepare_store([K(i)], ctx)
    buffer.write_blocks(out.store_spec.block_ids, payload[i][None, :])
    manager.complete_store([K(i)], ctx)
    manager.on_schedule_end()  # the cascade to the dict tier finishes
manager.on_request_finished(ctx)

ctx = ReqContext("load")
manager.on_new_request(ctx)
first = manager.lookup(K(1), ctx)  # CPU miss, dict hit: a promotion is submitted
manager.on_schedule_end()
second = manager.lookup(K(1), ctx)
spec = manager.prepare_load([K(1)], ctx)
back = buffer.read_blocks(spec.block_ids)[0]
manager.complete_load([K(1)], ctx)
manager.on_request_finished(ctx)
tier = manager.get_stats().tiers[0]
print(json.dumps({
    "tier": type(manager.tiers[0]).__name__,
    "first": first.name,
    "second": second.name,
    "same_bytes": bool((back == payload[1]).all()),
    "promoted": tier.promoted_blocks,
    "cascaded": tier.cascaded_blocks,
}))
manager.shutdown()
"""
    )
    assert result == {
        "tier": "DictTier",
        "first": "PENDING",
        "second": "HIT",
        "same_bytes": True,
        "promoted": 1,
        "cascaded": 3,
    }


def test_hook_plugin_logs_evictions(env: PluginEnv) -> None:
    code = (
        PRELUDE
        + """
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
manager = build_manager({"num_blocks": 1, "hooks": {"enable": ["eviction-log"]}})
ctx = ReqContext("req-7")
manager.on_new_request(ctx)
for i in (0xAB, 0xCD):
    manager.prepare_store([K(i)], ctx)
    manager.complete_store([K(i)], ctx)
"""
    )
    proc = env.run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "kv_offload.eviction_log: evicted 1 block(s) from CPU for request req-7: "
        + (0xAB).to_bytes(8, "big").hex()
    ]
    blocked = env.run(code.replace('"enable": ["eviction-log"]', '"block": ["eviction-log"]'))
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout == ""


def test_sampled_admission_writes_its_share_to_the_tier(env: PluginEnv) -> None:
    result = env.run_json(
        PRELUDE
        + """
tier = {"type": "example", "capacity_blocks": 400, "write_policy": "write-through-selective",
        "admission": "sampled", "admission_options": {"percent": 25}}
manager = build_manager({"num_blocks": 400, "block_size_bytes": 64, "tiers": [tier],
                         "hooks": {"autoload": False}})
ctx = ReqContext("r")
out = manager.prepare_store([K(i) for i in range(400)], ctx)
manager.complete_store(out.keys_to_store, ctx)
manager.drain()
stats = manager.tier_stats()[0]
print(json.dumps([stats.admission, stats.cascaded_blocks, stats.refused_blocks]))
manager.shutdown()
"""
    )
    name, written, refused = result
    assert name == "sampled" and written + refused == 400
    assert 60 <= written <= 140  # about a quarter


def test_sampled_admission_rejects_a_bad_percent(env: PluginEnv, tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'block_size_bytes = 64\n[[tiers]]\ntype = "example"\nadmission = "sampled"\n'
        "admission_options = { percent = 101 }\n"
    )
    proc = env.run(
        f"import sys\nfrom kv_offload.cli import main\nsys.exit(main(['validate', {str(path)!r}]))"
    )
    assert proc.returncode != 0
    assert f"{path}:5:" in proc.stderr and "percent must be an int from 0 to 100" in proc.stderr


# -- the guide -------------------------------------------------------------------------------

_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
_FILE_BLOCK = re.compile(r"^`(examples/[^`]+)`[^\n]*\n\n```\w+\n(.*?)```", re.S | re.M)


def _config_snippets() -> list[str]:
    return [
        body
        for lang, body in _BLOCK.findall(GUIDE.read_text())
        if lang == "toml" and "[project]" not in body
    ]


def test_guide_shows_the_templates_verbatim() -> None:
    shown = dict(_FILE_BLOCK.findall(GUIDE.read_text()))
    expected = {
        f"examples/{folder}/{path.name}"
        for folder in TEMPLATES
        for path in (EXAMPLES / folder).iterdir()
        # The template's own files only: a config a reader saved next to it is not one.
        if path.name == "pyproject.toml" or (path.suffix == ".py" and path.stem.startswith("kv_"))
    }
    assert set(shown) == expected
    for path, body in shown.items():
        assert body == (ROOT / path).read_text(), f"the guide's copy of {path} is out of date"


def test_guide_toml_snippets_parse_and_validate(env: PluginEnv) -> None:
    toml_blocks = [body for lang, body in _BLOCK.findall(GUIDE.read_text()) if lang == "toml"]
    for body in toml_blocks:
        tomllib.loads(body)  # every TOML block parses, pyproject files included
    snippets = _config_snippets()
    assert len(snippets) >= 4
    names = " ".join(snippets)
    for _, _, name, _ in TEMPLATES.values():
        assert f'"{name}"' in names  # each template is selected by name somewhere
    parsed = json.dumps([tomllib.loads(s) for s in snippets])  # tomllib: 3.11+ only
    described = env.run_json(
        "import json\nfrom kv_offload import load_config\n"
        f"configs = json.loads({parsed!r})\n"
        "print(json.dumps([load_config(c).describe() for c in configs]))"
    )
    assert isinstance(described, list) and len(described) == len(snippets)
    whole = described[-1]  # "All three in one stack"
    assert whole["cpu"]["policy"] == "fifo"
    assert whole["tiers"] == [{"type": "dict", "max_blocks": 50000}]
    assert whole["hooks"]["enable"] == ["eviction-log"]


def test_guide_stack_builds_from_a_toml_file(env: PluginEnv, tmp_path: Path) -> None:
    path = tmp_path / "my-stack.toml"
    path.write_text(_config_snippets()[-1])
    result = env.run_json(
        "import json\nimport kv_offload\n"
        f"manager = kv_offload.build_manager({str(path)!r})\n"
        "print(json.dumps([type(manager.primary.policy).__name__,"
        " [type(t).__name__ for t in manager.tiers],"
        " manager.plugin_manager.get_plugin('eviction-log').__name__]))\n"
        "manager.shutdown()"
    )
    assert result == ["FIFOCachePolicy", ["DictTier"], "kv_offload_eviction_log"]
