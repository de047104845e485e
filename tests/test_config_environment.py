"""What the person running the process decides over a config file: ``module_path`` imports
(``KV_OFFLOAD_ALLOW_MODULE_PATH``, ``--no-module-path``), hook plugin selection (the
environment wins, booleans parse, overrides warn, ``validate`` shows what will load), and
whether the stack fits in this machine's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from _dists import DistSpec, ModuleFactory, _clean_env
from kv_offload import ConfigError, build_manager, load_config
from kv_offload.config.env import EnvironmentOverrideWarning, select_hooks
from kv_offload.config.memory import physical_memory_bytes
from kv_offload.plugins import ExperimentalPluginWarning
from test_cli import SCRIPT, assert_one_line_error, kvo_many

HOOK_ENVS = ("KV_OFFLOAD_PLUGINS", "KV_OFFLOAD_BLOCK_PLUGINS", "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD")


@pytest.fixture(autouse=True)
def _clean_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*HOOK_ENVS, "KV_OFFLOAD_ALLOW_MODULE_PATH"):
        monkeypatch.delenv(name, raising=False)


POLICY_MODULE = """
from kv_offload_lru import LRUCachePolicy


class Mine(LRUCachePolicy):
    pass
"""


# -- module_path: the environment and the CLI have the last word (issue 10, item 3) --------


@pytest.mark.parametrize("value", ["0", "false", "No", "off"])
def test_env_forbids_module_path_whatever_the_config_says(
    make_module: ModuleFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    name = make_module(POLICY_MODULE)
    path = tmp_path / "stack.toml"
    path.write_text(f'allow_module_path = true\npolicy = "Mine"\npolicy_module_path = "{name}"\n')
    monkeypatch.setenv("KV_OFFLOAD_ALLOW_MODULE_PATH", value)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:3: policy_module_path: ")
    assert "KV_OFFLOAD_ALLOW_MODULE_PATH=0" in str(info.value)
    assert name not in sys.modules, "never imported"
    block = {"block_size_bytes": 64, "tiers": [{"type": "mine", "module_path": name}]}
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.module_path: .*ALLOW_MODULE_PATH"):
        load_config(block)
    monkeypatch.setenv("KV_OFFLOAD_ALLOW_MODULE_PATH", "1")
    with pytest.warns(ExperimentalPluginWarning):
        assert load_config(path).policy == "Mine"


def test_env_module_path_flag_must_be_a_boolean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_OFFLOAD_ALLOW_MODULE_PATH", "nope")
    with pytest.raises(ConfigError, match="KV_OFFLOAD_ALLOW_MODULE_PATH='nope'") as info:
        load_config({"policy": "X", "policy_module_path": "x"})
    assert info.value.key == "KV_OFFLOAD_ALLOW_MODULE_PATH"


def test_cli_no_module_path_flag_before_or_after_the_command(tmp_path: Path) -> None:
    module = tmp_path / "mods" / "kvo_cli_mine.py"
    module.parent.mkdir()
    module.write_text("raise SystemExit('imported although forbidden')\n")
    config = tmp_path / "stack.toml"
    config.write_text('policy = "Mine"\npolicy_module_path = "kvo_cli_mine"\n')
    before, after = kvo_many(
        ["--no-module-path", "validate", config],
        ["validate", config, "--no-module-path"],
        pythonpath=module.parent,
    )
    for proc in (before, after):
        line = assert_one_line_error(proc, f"{config}:2", "policy_module_path", "forbidden")
        # Issue 37: the flag forbade it, not the environment the user never set.
        assert "forbidden by --no-module-path" in line and "ALLOW_MODULE_PATH" not in line


# -- module_path errors and warnings point at the user's config line (docs items) ---------


def test_experimental_warning_points_at_the_module_path_line(
    make_module: ModuleFactory, tmp_path: Path
) -> None:
    name = make_module(POLICY_MODULE)
    path = tmp_path / "stack.toml"
    path.write_text(f'num_blocks = 8\npolicy = "Mine"\npolicy_module_path = "{name}"\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(path)
    (warning,) = [w for w in caught if issubclass(w.category, ExperimentalPluginWarning)]
    assert (warning.filename, warning.lineno) == (str(path), 3)


def test_bad_module_path_error_points_at_the_module_path_line(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'policy = "Mine"\npolicy_module_path = "no_such_module_anywhere"\n'
        'block_size_bytes = 64\n\n[[tiers]]\ntype = "mytier"\nmodule_path = "nor_this_one"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: policy_module_path: "), message
    assert "PYTHONPATH" in message, "says how to make the module importable"
    path.write_text(path.read_text().replace('policy = "Mine"\npolicy_module_path', "#"))
    with pytest.raises(ConfigError, match=rf"^{path}:6: tiers\[0\]\.module_path: .*PYTHONPATH"):
        load_config(path)


# -- hook plugin selection: environment precedence (issue 10, item 7) -----------------------


def test_select_hooks_precedence_and_booleans() -> None:
    sel = select_hooks(True, ["beta"], [], {"KV_OFFLOAD_PLUGINS": "alpha"})
    assert sel.allow == {"alpha"}, "the environment replaces [hooks] enable, never widens it"
    assert sel.overrides and "overrides [hooks] enable" in sel.overrides[0]
    assert select_hooks(True, [], [], {"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "0"}).autoload
    assert select_hooks(True, [], [], {"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "false"}).autoload
    off = select_hooks(True, ["alpha"], [], {"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "yes"})
    assert not off.autoload and off.overrides, "dropping enabled plugins is reported"
    on = select_hooks(False, [], [], {"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "0"})
    assert on.autoload and on.overrides
    blocked = select_hooks(True, ["alpha"], ["x"], {"KV_OFFLOAD_BLOCK_PLUGINS": "alpha"})
    assert blocked.block == {"alpha", "x"} and blocked.overrides
    with pytest.raises(ConfigError, match="KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD='maybe'"):
        select_hooks(True, [], [], {"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "maybe"})


@pytest.fixture(scope="module")
def hook_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real distribution of two hook plugins, pip-installed into a directory (``--target``)."""
    spec = DistSpec(
        name="kvo-hooks-alpha-beta",
        files={
            f"kvo_hook_{n}.py": "from kv_offload.plugins import hookimpl\n"
            for n in ("alpha", "beta")
        },
        entry_points={"kv_offload.hooks": {n: f"kvo_hook_{n}" for n in ("alpha", "beta")}},
    )
    return spec.install_target(tmp_path_factory.mktemp("hooksite"))


def _validate(config: Path, site: Path, **env: str) -> subprocess.Popen[str]:
    """``kv-offload validate CONFIG --json``, started (several run at once)."""
    assert SCRIPT is not None
    full = {k: v for k, v in _clean_env().items() if not k.startswith("KV_OFFLOAD_")}
    full.update(PYTHONPATH=str(site), **env)
    return subprocess.Popen(
        [SCRIPT, "validate", str(config), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def test_validate_shows_the_hook_plugins_that_will_load(hook_site: Path, tmp_path: Path) -> None:
    config = tmp_path / "stack.toml"
    config.write_text('num_blocks = 10\n\n[hooks]\nenable = ["beta"]\n')
    cases = [
        ({}, ["beta"], False),
        ({"KV_OFFLOAD_PLUGINS": "alpha"}, ["alpha"], True),
        ({"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "1"}, [], True),
        ({"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "0"}, ["beta"], False),
        ({"KV_OFFLOAD_BLOCK_PLUGINS": "beta"}, [], True),
    ]
    running = [_validate(config, hook_site, **env) for env, _, _ in cases]
    bad = _validate(config, hook_site, KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD="maybe")
    for proc, (env, loading, overridden) in zip(running, cases):
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        hooks = json.loads(out)["hooks"]
        assert hooks["will_load"] == loading, env
        assert bool(hooks["environment_overrides"]) is overridden, env
    _, err = bad.communicate()
    assert bad.returncode == 2 and "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD" in err


def test_build_manager_loads_what_validate_shows_and_warns(
    hook_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(hook_site))
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "alpha")
    config = {"num_blocks": 10, "hooks": {"enable": ["beta"]}}
    with pytest.warns(EnvironmentOverrideWarning, match="KV_OFFLOAD_PLUGINS=alpha overrides"):
        manager = build_manager(config)
    names = {name for name, _ in manager.plugin_manager.list_name_plugin()}
    assert "alpha" in names and "beta" not in names
    assert load_config(config).hook_selection().will_load() == ["alpha"]
    monkeypatch.setenv("KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD", "0")
    monkeypatch.delenv("KV_OFFLOAD_PLUGINS")
    manager = build_manager(config)
    assert "beta" in {name for name, _ in manager.plugin_manager.list_name_plugin()}


# -- memory (issue 10, item 11) -----------------------------------------------------------


def test_a_stack_larger_than_the_machine_is_refused_with_the_figure(tmp_path: Path) -> None:
    physical = physical_memory_bytes()
    assert physical is not None
    path = tmp_path / "stack.toml"
    path.write_text("num_blocks = 1000000000000\n")
    for check in (load_config, build_manager):
        with pytest.raises(ConfigError) as info:
            check(path)
        message = str(info.value)
        assert message.startswith(f"{path}:1: num_blocks: the stack needs about "), message
        assert "bookkeeping" in message and "this machine has" in message
    blocks = physical // 4096 // 2  # the CPU buffer alone fits; a tier ten times it does not
    tiers = {"type": "example", "capacity_blocks": 10 * blocks}
    with pytest.raises(ConfigError, match=r"tiers\[0\]: the stack needs .* tier 'example'"):
        load_config({"num_blocks": 1000, "block_size_bytes": 4096, "tiers": [tiers]})


def test_validate_prints_what_the_stack_costs(tmp_path: Path) -> None:
    config = tmp_path / "stack.toml"
    config.write_text(
        textwrap.dedent(
            """
            num_blocks = 1000
            block_size_bytes = 4096

            [[tiers]]
            type = "example"
            capacity_blocks = 2000
            """
        )
    )
    text, js = kvo_many(["validate", config], ["validate", config, "--json"])
    assert text.returncode == 0, text.stderr
    memory_line = next(line for line in text.stdout.splitlines() if "memory:" in line)
    assert "4.1 MB CPU buffer" in memory_line and "8.2 MB tier 'example'" in memory_line
    memory = json.loads(js.stdout)["memory"]
    assert memory["cpu_buffer_bytes"] == 1000 * 4096
    assert memory["tier_bytes"] == {"example": 2000 * 4096}
