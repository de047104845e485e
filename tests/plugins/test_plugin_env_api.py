"""The environment has the last word for stacks built without a config file too (issue 10,
items 3 and 7): ``create_plugin_manager`` arguments, ``cache_policy_module_path``, a tier
config's ``module_path`` and a backpressure table's ``*_module_path`` obey the same variables,
parsed the same way, as a config file; overriding an explicit argument warns."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
from _dists import ModuleFactory
from kv_offload import ConfigError, CPUOffloadingManager, load_config
from kv_offload.config.env import EnvironmentOverrideWarning
from kv_offload.plugins import create_plugin_manager
from kv_offload.plugins import loading as hooks_module
from kv_offload.tier_types import Locality
from kv_offload.tiering import OffloadingConfig, SecondaryTierFactory
from kv_offload.tiering.cascade_gate import build_gate
from test_hook_registration import fake_entry_points, loaded

__all__ = ["fake_entry_points"]  # the fixture, shared with test_hook_registration

DISABLE = "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_MODULE_PATH = "KV_OFFLOAD_ALLOW_MODULE_PATH"

POLICY_MODULE = """
from kv_offload_lru import LRUCachePolicy


class Mine(LRUCachePolicy):
    pass
"""

TIER_MODULE = """
from kv_offload_example_tier import ExampleSecondaryTierManager


class MyTier(ExampleSecondaryTierManager):
    pass
"""

DETECTOR_MODULE = """
from kv_offload.tiering.backpressure import EMADetector


class MyDetector(EMADetector):
    pass
"""


# -- hook plugins ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "No", "off", ""])
def test_disable_autoload_false_values_do_not_disable(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``=0`` used to disable autoload (any non-empty value did)."""
    monkeypatch.setenv(DISABLE, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvironmentOverrideWarning)  # autoload=True: no override
        pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_disable_autoload_true_values_disable_quietly_by_default(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(DISABLE, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvironmentOverrideWarning)  # the default: no warning
        pm = create_plugin_manager()
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}


def test_disable_autoload_drops_an_explicit_allow_with_a_warning(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE, "1")
    with pytest.warns(
        EnvironmentOverrideWarning,
        match=r"PLUGIN_AUTOLOAD=1 overrides create_plugin_manager\(allow=\['alpha'\]\)",
    ):
        pm = create_plugin_manager(allow=["alpha"])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}


def test_disable_autoload_false_overrides_autoload_false_with_a_warning(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same rule as a config's ``[hooks] autoload = false``: the environment decides."""
    monkeypatch.setenv(DISABLE, "0")
    with pytest.warns(
        EnvironmentOverrideWarning, match=r"overrides create_plugin_manager\(autoload=False\)"
    ):
        pm = create_plugin_manager(autoload=False)
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}


def test_disable_autoload_not_a_boolean_is_a_config_error(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE, "maybe")
    with pytest.raises(ConfigError, match=r"KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD='maybe'") as info:
        create_plugin_manager()
    assert info.value.key == DISABLE
    monkeypatch.setattr(hooks_module, "_default", None)  # the managers' shared one too
    with pytest.raises(ConfigError, match="KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD"):
        CPUOffloadingManager(4)


def test_same_allow_list_in_the_environment_is_not_an_override(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_PLUGINS", "beta, alpha")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvironmentOverrideWarning)
        pm = create_plugin_manager(allow=["alpha", "beta"])
    assert loaded(pm, fake_entry_points) == {"alpha": (True, True), "beta": (True, True)}


def test_env_block_beats_an_explicit_allow_with_a_warning(
    fake_entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_OFFLOAD_BLOCK_PLUGINS", "alpha broken")
    with pytest.warns(EnvironmentOverrideWarning, match=r"blocks \['alpha'\] that allow= names"):
        pm = create_plugin_manager(allow=["alpha", "beta"])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (True, True)}


def test_empty_allow_loads_no_entry_point(fake_entry_points: dict[str, str]) -> None:
    pm = create_plugin_manager(allow=[])
    assert loaded(pm, fake_entry_points) == {"alpha": (False, False), "beta": (False, False)}


# -- module_path -------------------------------------------------------------------------------


@pytest.fixture
def forbid(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv(ALLOW_MODULE_PATH, "0")
    return monkeypatch


@pytest.mark.parametrize("value", ["0", "false", "Off", "no"])
def test_env_forbids_cache_policy_module_path(
    make_module: ModuleFactory, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    name = make_module(POLICY_MODULE)
    monkeypatch.setenv(ALLOW_MODULE_PATH, value)
    with pytest.raises(ConfigError) as info:
        CPUOffloadingManager(8, cache_policy="Mine", cache_policy_module_path=name)
    message = str(info.value)
    assert f"cache_policy_module_path={name!r}" in message and "policy 'Mine'" in message
    assert "KV_OFFLOAD_ALLOW_MODULE_PATH=0" in message
    assert info.value.key == "cache_policy_module_path"
    assert name not in sys.modules  # refused before the import


def test_env_forbids_module_path_even_for_an_installed_name(forbid: pytest.MonkeyPatch) -> None:
    """As for a config file: the ``module_path`` itself is refused, not only its use."""
    with pytest.raises(ConfigError, match="cache_policy_module_path='anything'"):
        CPUOffloadingManager(8, cache_policy="lru", cache_policy_module_path="anything")


def test_module_path_works_when_the_environment_allows_it(
    make_module: ModuleFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_module(POLICY_MODULE)
    monkeypatch.setenv(ALLOW_MODULE_PATH, "1")
    with pytest.warns(Warning, match="experimental"):
        manager = CPUOffloadingManager(8, cache_policy="Mine", cache_policy_module_path=name)
    assert type(manager.policy).__name__ == "Mine"


def test_env_not_a_boolean_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_MODULE_PATH, "sometimes")
    with pytest.raises(ConfigError, match="KV_OFFLOAD_ALLOW_MODULE_PATH='sometimes'"):
        CPUOffloadingManager(8, cache_policy="Mine", cache_policy_module_path="x")


def test_env_forbids_a_tier_module_path(
    make_module: ModuleFactory, forbid: pytest.MonkeyPatch
) -> None:
    name = make_module(TIER_MODULE)
    config = {"type": "MyTier", "module_path": name}
    with pytest.raises(ConfigError) as info:
        SecondaryTierFactory.create_secondary_tier(
            config, memoryview(bytearray(64)), OffloadingConfig(1, 64)
        )
    assert f"module_path={name!r} (tier 'MyTier')" in str(info.value)
    assert info.value.key == "module_path"
    with pytest.raises(ConfigError, match="KV_OFFLOAD_ALLOW_MODULE_PATH=0"):
        SecondaryTierFactory.get_tier_class(config)
    assert name not in sys.modules


def test_env_forbids_a_backpressure_detector_module_path(
    make_module: ModuleFactory, forbid: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The backpressure tables' ``detector_module_path``/``drop_policy_module_path`` import
    code as well: the same variable forbids them."""
    name = make_module(DETECTOR_MODULE)
    for key in ("detector", "drop_policy"):
        table = {key: "MyDetector", f"{key}_module_path": name}
        with pytest.raises(ConfigError) as info:
            build_gate(table, "disk", Locality.LOCAL)
        assert f"{key}_module_path={name!r}" in str(info.value)
        assert "KV_OFFLOAD_ALLOW_MODULE_PATH=0" in str(info.value)
    assert name not in sys.modules


@pytest.mark.parametrize("where", ["global", "tier"])
def test_allow_module_path_false_forbids_backpressure_module_paths(
    make_module: ModuleFactory, tmp_path: Path, where: str
) -> None:
    """``allow_module_path = false`` forbids *every* ``module_path`` import, these too (they
    were imported before)."""
    name = make_module(DETECTOR_MODULE)
    table = f'detector = "MyDetector"\ndetector_module_path = "{name}"\n'
    path = tmp_path / "stack.toml"
    if where == "global":
        text = f'[backpressure]\n{table}\n[[tiers]]\ntype = "example"\n'
    else:
        text = f'[[tiers]]\ntype = "example"\n[tiers.backpressure]\n{table}'
    path.write_text("allow_module_path = false\nnum_blocks = 8\nblock_size_bytes = 64\n" + text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "detector_module_path" in message and "allow_module_path = false" in message
    line = 6 if where == "global" else 8
    assert f"stack.toml:{line}" in message
    assert name not in sys.modules
