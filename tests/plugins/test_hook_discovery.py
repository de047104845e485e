"""Hook plugins discovered from real installed distributions (entry-point group
``kv_offload.hooks``).

The distributions are built as wheels and installed by pip into real throwaway virtual
environments (``tests/_dists.py``); each check runs a fresh interpreter there, which builds a
manager on the default plugin manager (autoload) and runs one request. A plugin proves it was
*imported* by writing ``<name>.imported`` into ``$KVO_TEST_MARKERS`` at import time, and that
it *fired* by appending its events to ``$KVO_TEST_EVENTS``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from _dists import DESCRIBE_EXCEPTION, DistSpec, PluginEnv
from kv_offload.plugins import (
    ALLOW_ENV,
    AUTOLOAD_DISABLE_ENV,
    BLOCK_ENV,
    HOOK_ENTRY_POINT_GROUP,
)

PLUGIN_SOURCE = '''
"""A kv-offload hook plugin that logs what it sees."""
import json
import os
from pathlib import Path

from kv_offload.plugins import hookimpl

NAME = {name!r}

if os.environ.get("KVO_TEST_MARKERS"):
    Path(os.environ["KVO_TEST_MARKERS"], NAME + ".imported").write_text("imported\\n")


def _emit(**event):
    with open(os.environ["KVO_TEST_EVENTS"], "a") as log:
        log.write(json.dumps(dict(plugin=NAME, **event)) + "\\n")


@hookimpl
def kv_offload_request_started(req_context):
    _emit(hook="request_started", req=req_context.req_id)


@hookimpl
def kv_offload_blocks_stored(keys, medium):
    _emit(hook="blocks_stored", medium=medium, keys=len(keys))


@hookimpl
def kv_offload_shutdown():
    _emit(hook="shutdown")
'''


def hook_dist(name: str, version: str) -> DistSpec:
    module = f"kvo_hook_{name}_test"
    return DistSpec(
        name=f"kv-offload-hook-{name}-test",
        version=version,
        files={f"{module}.py": PLUGIN_SOURCE.format(name=name)},
        entry_points={HOOK_ENTRY_POINT_GROUP: {name: module}},
    )


ALPHA = hook_dist("alpha", "1.0.0")
BETA = hook_dist("beta", "2.0.0")
BROKEN = DistSpec(
    name="kv-offload-hook-broken-test",
    version="0.0.1",
    files={
        "kvo_hook_broken_test.py": """
            import os
            from pathlib import Path

            Path(os.environ["KVO_TEST_MARKERS"], "broken.imported").write_text("imported\\n")
            raise RuntimeError("kvo_hook_broken_test: native library missing")
            """
    },
    entry_points={HOOK_ENTRY_POINT_GROUP: {"broken": "kvo_hook_broken_test"}},
)
#: A second distribution advertising alpha's name.
ALPHA2 = DistSpec(
    name="kv-offload-hook-alpha-twin-test",
    version="9.0.0",
    files={"kvo_hook_alpha_twin_test.py": "def kv_offload_shutdown(manager):\n    pass\n"},
    entry_points={HOOK_ENTRY_POINT_GROUP: {"alpha": "kvo_hook_alpha_twin_test"}},
)
MODULES = ["kvo_hook_alpha_test", "kvo_hook_beta_test", "kvo_hook_broken_test"]
#: The test's own plugins. The environments also see the hook plugins installed where the
#: suite runs (the project's own, such as ``prometheus``); the checks are about these.
NAMES = ["alpha", "beta", "broken"]

CHILD = (
    DESCRIBE_EXCEPTION
    + f"""
import json, sys, warnings
from kv_offload import CPUOffloadingManager, ReqContext, make_offload_key
from kv_offload.plugins import get_plugin_manager

result = {{}}
warnings.simplefilter("always")
caught = warnings.catch_warnings(record=True)
result["warnings"] = seen = caught.__enter__()
try:
    manager = CPUOffloadingManager(4)  # the default plugin manager: entry points autoload
    ctx = ReqContext("child")
    manager.on_new_request(ctx)
    out = manager.prepare_store([make_offload_key(i) for i in range(3)], ctx)
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    manager.shutdown()
    pm = get_plugin_manager()
    # (blocked names are listed too, with plugin None)
    ours = [(n, plugin) for n, plugin in pm.list_name_plugin() if n in {NAMES!r}]
    result["registered"] = sorted(n for n, plugin in ours if plugin is not None)
    result["blocked"] = sorted(n for n, _ in ours if pm.is_blocked(n))
except Exception as exc:
    result["error"] = describe(exc)
result["imported"] = sorted(m for m in {MODULES!r} if m in sys.modules)
result["warnings"] = [f"{{w.category.__name__}}: {{w.message}}" for w in seen]
print(json.dumps(result))
"""
)


#: Each scenario: which environment, and which ``KV_OFFLOAD_*`` switches are set.
SCENARIOS: dict[str, tuple[str, dict[str, str]]] = {
    "autoload": ("plain", {}),
    "disabled": ("plain", {AUTOLOAD_DISABLE_ENV: "1"}),
    "blocked": ("plain", {BLOCK_ENV: "alpha"}),
    "allowed": ("plain", {ALLOW_ENV: "beta"}),
    "broken": ("broken", {}),
    "broken-allowed": ("broken", {ALLOW_ENV: "alpha,broken"}),
    "conflict": ("conflict", {}),
    "broken-blocked": ("broken", {BLOCK_ENV: "broken"}),
}


def run(env: PluginEnv, folder: Path, variables: dict[str, str]) -> dict[str, Any]:
    """Run the child with only the given ``KV_OFFLOAD_*`` switches set; return its report
    plus ``events`` (per plugin) and ``markers`` (the plugins whose module was imported)."""
    markers = folder / "markers"
    markers.mkdir()
    events = folder / "events.jsonl"
    child_env: dict[str, str | None] = dict.fromkeys((AUTOLOAD_DISABLE_ENV, ALLOW_ENV, BLOCK_ENV))
    child_env.update(variables, KVO_TEST_MARKERS=str(markers), KVO_TEST_EVENTS=str(events))
    result = env.run_json(CHILD, env=child_env)
    assert isinstance(result, dict)
    log = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    result["events"] = {}
    for event in log:
        result["events"].setdefault(event.pop("plugin"), []).append(event)
    result["markers"] = sorted(path.stem for path in markers.iterdir())
    return result


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PluginEnv]:
    """``plain``: alpha and beta; ``broken``: alpha and a plugin that raises on import. Each
    is a real environment with its distributions installed by one pip run (both are built
    concurrently: the work is in child processes)."""
    contents = {"plain": [ALPHA, BETA], "broken": [ALPHA, BROKEN], "conflict": [ALPHA, ALPHA2]}
    roots = {label: tmp_path_factory.mktemp(f"hook-{label}") for label in contents}

    def make(label: str) -> PluginEnv:
        env = PluginEnv(roots[label] / "venv")
        env.install_specs(contents[label], roots[label] / "wheels")
        return env

    with ThreadPoolExecutor(len(contents)) as pool:
        return dict(zip(contents, pool.map(make, contents)))


@pytest.fixture(scope="module")
def reports(
    envs: dict[str, PluginEnv], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """What the child reported in each scenario (all run concurrently, one process each)."""
    folders = {name: tmp_path_factory.mktemp(f"scenario-{name}") for name in SCENARIOS}
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        futures = {
            name: pool.submit(run, envs[env], folders[name], variables)
            for name, (env, variables) in SCENARIOS.items()
        }
        return {name: future.result() for name, future in futures.items()}


FIRED = [
    {"hook": "request_started", "req": "child"},
    {"hook": "blocks_stored", "medium": "CPU", "keys": 3},
    {"hook": "shutdown"},
]


def test_distributions_are_installed_only_in_their_environment(
    envs: dict[str, PluginEnv],
) -> None:
    assert envs["plain"].versions(ALPHA.name, BETA.name, BROKEN.name) == {
        ALPHA.name: "1.0.0",
        BETA.name: "2.0.0",
        BROKEN.name: None,
    }
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(ALPHA.name)


def test_installed_plugins_are_autoloaded_and_fire(reports: dict[str, dict[str, Any]]) -> None:
    result = reports["autoload"]
    assert "error" not in result, result["error"]
    assert result["registered"] == ["alpha", "beta"]
    assert result["events"] == {"alpha": FIRED, "beta": FIRED}
    assert result["markers"] == ["alpha", "beta"]


def test_disable_autoload_env(reports: dict[str, dict[str, Any]]) -> None:
    result = reports["disabled"]
    assert result["registered"] == []
    assert result["events"] == {}
    assert result["markers"] == [] and result["imported"] == []


def test_blocked_plugin_is_never_imported(reports: dict[str, dict[str, Any]]) -> None:
    result = reports["blocked"]
    assert result["registered"] == ["beta"] and result["blocked"] == ["alpha"]
    assert result["events"] == {"beta": FIRED}
    assert result["markers"] == ["beta"]
    assert result["imported"] == ["kvo_hook_beta_test"]


def test_allow_list_picks_one_of_two(reports: dict[str, dict[str, Any]]) -> None:
    result = reports["allowed"]
    assert result["registered"] == ["beta"]
    assert result["events"] == {"beta": FIRED}
    assert result["markers"] == ["beta"]
    assert result["imported"] == ["kvo_hook_beta_test"]


def test_broken_autoloaded_plugin_is_skipped_with_a_warning(
    reports: dict[str, dict[str, Any]],
) -> None:
    """One broken installed distribution must not take down every manager."""
    result = reports["broken"]
    assert "error" not in result, result["error"]
    assert result["registered"] == ["alpha"]
    assert result["events"] == {"alpha": FIRED}
    (warning,) = [w for w in result["warnings"] if "'broken'" in w]
    assert warning.startswith("BrokenPluginWarning: hook plugin 'broken'")
    assert "distribution kv-offload-hook-broken-test 0.0.1" in warning
    assert "native library missing" in warning and "(skipped)" in warning


def test_broken_plugin_enabled_by_name_is_a_plugin_import_error(
    reports: dict[str, dict[str, Any]],
) -> None:
    result = reports["broken-allowed"]
    error = result["error"]
    assert error["type"] == "PluginImportError"
    assert {"PluginError", "ImportError"} <= set(error["mro"])
    assert (error["kind"], error["plugin"]) == ("hook", "broken")
    message = error["message"]
    assert "hook plugin 'broken'" in message
    assert "distribution kv-offload-hook-broken-test 0.0.1" in message
    assert "RuntimeError: kvo_hook_broken_test: native library missing" in message
    assert "KV_OFFLOAD_BLOCK_PLUGINS=broken" in message  # how to get going again
    assert error["cause_type"] == "RuntimeError"
    assert "broken" in result["markers"]


def test_two_distributions_with_one_hook_name_conflict(
    reports: dict[str, dict[str, Any]],
) -> None:
    error = reports["conflict"]["error"]
    assert error["type"] == "PluginConflictError"
    assert (error["kind"], error["plugin"]) == ("hook", "alpha")
    assert "kv-offload-hook-alpha-test 1.0.0" in error["message"]
    assert "kv-offload-hook-alpha-twin-test 9.0.0" in error["message"]


def test_blocking_the_broken_plugin_lets_the_others_load(
    reports: dict[str, dict[str, Any]],
) -> None:
    result = reports["broken-blocked"]
    assert "error" not in result, result["error"]
    assert result["registered"] == ["alpha"] and result["blocked"] == ["broken"]
    assert result["events"] == {"alpha": FIRED}
    assert result["markers"] == ["alpha"]
    assert result["imported"] == ["kvo_hook_alpha_test"]
