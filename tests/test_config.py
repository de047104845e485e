"""Config validation: one clear message per problem, naming the key (and file:line for TOML),
raised before anything is built; and ``build_manager`` turning a valid config into a stack."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import kv_offload
import pytest
from _dists import ModuleFactory
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    StackConfig,
    TieringOffloadingManager,
    build_manager,
    load_config,
)
from kv_offload.config import DEFAULT_CONFIG
from kv_offload.config import parse as config_module
from kv_offload.config.docs import DOCS_PATH, REGENERATE, docs_page, docs_table
from kv_offload.config.schema import HOOK_FIELDS, TOP_FIELDS

ROOT = Path(__file__).resolve().parents[1]

# (id, TOML text, line the message must point at, fragments the message must contain)
BAD_TOML: list[tuple[str, str, int, tuple[str, ...]]] = [
    (
        "unknown-top-level-key",
        """
        num_blocks = 100
        polcy = "lru"
        """,
        2,
        ("polcy", "unknown key", "did you mean 'policy'"),
    ),
    (
        "unknown-key-in-hooks",
        """
        policy = "lru"

        [hooks]
        autoload = true
        enabel = []
        """,
        5,
        ("hooks.enabel", "did you mean 'enable'"),
    ),
    (
        "unknown-dotted-key-in-hooks",
        """
        num_blocks = 100
        hooks.blok = ["x"]
        """,
        2,
        ("hooks.blok", "did you mean 'block'"),
    ),
    (
        "unknown-tier-argument",
        """
        block_size_bytes = 64

        [[tiers]]
        type = "example"
        capacity = 5
        """,
        5,
        ("tiers[0].capacity", "tier 'example'", "'capacity'", "capacity_blocks"),
    ),
    (
        "missing-tier-type",
        """
        block_size_bytes = 64
        [[tiers]]
        capacity_blocks = 5
        """,
        2,
        ("tiers[0]", "'type'"),
    ),
    (
        "unknown-policy-name",
        """
        num_blocks = 100
        policy = "lur"
        """,
        2,
        ("policy", "unknown policy 'lur'", "did you mean 'lru'", "policy_module_path"),
    ),
    (
        "unknown-tier-type-after-commented-header",
        """
        block_size_bytes = 64
        [[tiers]]  # the fast tier
        type = "disk"
        """,
        3,
        ("tiers[0].type", "unknown tier 'disk'", "'example'"),
    ),
    (
        "string-num-blocks",
        """
        num_blocks = "5000"
        """,
        1,
        ("num_blocks", "must be an integer", "str"),
    ),
    (
        "bool-block-size-bytes",
        """
        num_blocks = 5
        block_size_bytes = true
        """,
        2,
        ("block_size_bytes", "must be an integer", "bool"),
    ),
    (
        "zero-num-blocks",
        """
        # a comment first
        num_blocks = 0
        """,
        2,
        ("num_blocks", "must be > 0", "got 0"),
    ),
    (
        "negative-cpu-bytes",
        """
        cpu_bytes = -4096
        block_size_bytes = 64
        """,
        1,
        ("cpu_bytes", "must be > 0", "-4096"),
    ),
    (
        "cpu-bytes-without-block-size",
        """
        policy = "lru"
        cpu_bytes = 4096
        """,
        2,
        ("cpu_bytes", "block_size_bytes"),
    ),
    (
        "num-blocks-and-cpu-bytes",
        """
        num_blocks = 10
        cpu_bytes = 4096
        block_size_bytes = 64
        """,
        2,
        ("cpu_bytes", "num_blocks", "not both"),
    ),
    (
        "tiers-without-block-size",
        """
        num_blocks = 10

        [[tiers]]
        type = "example"
        """,
        3,  # the [[tiers]] table that needs it
        ("block_size_bytes", "tiers"),
    ),
    (
        "policy-module-path-forbidden",
        """
        allow_module_path = false
        policy = "MyPolicy"
        policy_module_path = "my_policies"
        """,
        3,
        ("policy_module_path", "allow_module_path = false"),
    ),
    (
        "tier-module-path-forbidden",
        """
        allow_module_path = false
        block_size_bytes = 64

        [[tiers]]
        type = "mine"
        module_path = "my_tiers"
        """,
        6,
        ("tiers[0].module_path", "allow_module_path = false"),
    ),
    (
        "invalid-toml-syntax",
        """
        num_blocks = 10
        policy =
        """,
        2,
        ("invalid TOML",),
    ),
    (
        "hook-enabled-and-blocked",
        """
        [hooks]
        enable = ["a"]
        block = ["b", "a"]
        """,
        3,
        ("hooks.block", "'a'", "both enabled and blocked"),
    ),
    (
        "duplicate-tier-name",
        """
        block_size_bytes = 64

        [[tiers]]
        type = "example"
        name = "a"

        [[tiers]]
        type = "example"
        name = "a"
        """,
        9,
        ("tiers[1].name", "'a'", "tiers[0]"),
    ),
    (
        "unknown-hook-plugin-enabled",
        """
        num_blocks = 10
        [hooks]
        enable = ["no-such-hook-plugin"]
        """,
        3,
        ("hooks.enable", "'no-such-hook-plugin'"),
    ),
    (
        "hooks-not-a-table",
        """
        hooks = ["a"]
        """,
        1,
        ("hooks", "must be a table"),
    ),
    (
        "autoload-not-a-bool",
        """
        [hooks]
        autoload = "yes"
        """,
        2,
        ("hooks.autoload", "true or false"),
    ),
    (
        "policy-not-a-string",
        """
        policy = 5
        """,
        1,
        ("policy", "non-empty string"),
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "fragments"), [c[1:] for c in BAD_TOML], ids=[c[0] for c in BAD_TOML]
)
def test_bad_toml_config_names_key_file_and_line(
    tmp_path: Path, text: str, line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message
    # build_manager validates the same way, before building anything.
    with pytest.raises(ConfigError, match=f"^{path}:{line}: "):
        build_manager(path)


# (id, config dict, fragments the message must contain)
BAD_DICTS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("unknown-key", {"num_blokcs": 10}, ("num_blokcs", "did you mean 'num_blocks'")),
    ("string-num-blocks", {"num_blocks": "10"}, ("num_blocks", "must be an integer")),
    ("float-num-blocks", {"num_blocks": 10.0}, ("num_blocks", "must be an integer")),
    ("bool-block-size", {"block_size_bytes": False}, ("block_size_bytes", "must be an integer")),
    ("negative-num-blocks", {"num_blocks": -1}, ("num_blocks", "must be > 0")),
    ("cpu-bytes-hold-no-block", {"cpu_bytes": 100, "block_size_bytes": 4096}, ("cpu_bytes",)),
    ("unknown-hooks-key", {"hooks": {"autolaod": True}}, ("hooks.autolaod", "'autoload'")),
    ("enable-not-a-list", {"hooks": {"enable": "a"}}, ("hooks.enable", "list")),
    ("tiers-not-a-list", {"tiers": {"type": "example"}}, ("tiers", "list")),
    ("tier-not-a-table", {"block_size_bytes": 64, "tiers": ["example"]}, ("tiers[0]",)),
    ("tier-without-type", {"block_size_bytes": 64, "tiers": [{}]}, ("tiers[0]", "'type'")),
    (
        "unknown-tier-argument",
        {"block_size_bytes": 64, "tiers": [{"type": "example", "capacity_block": 1}]},
        ("tiers[0].capacity_block", "tier 'example'", "capacity_blocks"),
    ),
    (
        "reserved-tier-argument",
        {"block_size_bytes": 64, "tiers": [{"type": "example", "config": 1}]},
        ("tiers[0].config", "set by kv-offload"),
    ),
    ("unknown-tier-type", {"block_size_bytes": 64, "tiers": [{"type": "s3"}]}, ("'s3'",)),
    ("unknown-policy", {"policy": "mru"}, ("policy", "'mru'", "'lru'")),
    ("tiers-without-block-size", {"tiers": [{"type": "example"}]}, ("block_size_bytes",)),
    (
        "module-path-forbidden",
        {"allow_module_path": False, "policy": "X", "policy_module_path": "x"},
        ("policy_module_path", "forbidden"),
    ),
    ("allow-module-path-not-bool", {"allow_module_path": "no"}, ("allow_module_path",)),
    ("enable-events-not-bool", {"enable_events": 1}, ("enable_events", "true or false")),
    ("store-threshold-negative", {"store_threshold": -1}, ("store_threshold", ">= 0, got -1")),
    ("store-threshold-float", {"store_threshold": 2.5}, ("store_threshold", "2.5")),
    ("tracker-size-zero", {"max_tracker_size": 0}, ("max_tracker_size", "> 0, got 0")),
]


@pytest.mark.parametrize(
    ("data", "fragments"), [c[1:] for c in BAD_DICTS], ids=[c[0] for c in BAD_DICTS]
)
def test_bad_dict_config_names_the_key(data: Any, fragments: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        build_manager(data)
    message = str(info.value)
    assert message.startswith("<dict>: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message


@pytest.mark.parametrize("value", ['"many"', "-3", "0", "true"])
def test_tier_argument_value_the_tier_rejects_fails_validation_located(
    tmp_path: Path, value: str
) -> None:
    """Argument *values* are the tier's business: validation runs the tier's own
    ``validate_arguments`` (nothing allocated), and the error names file:line."""
    path = tmp_path / "stack.toml"
    path.write_text(
        f'block_size_bytes = 64\n\n[[tiers]]\ntype = "example"\ncapacity_blocks = {value}\n'
    )
    for check in (load_config, build_manager):
        with pytest.raises(ConfigError) as info:
            check(path)
        message = str(info.value)
        assert message.startswith(f"{path}:5: tiers[0].capacity_blocks: "), message
        assert "positive int" in message
        assert info.value.key == "tiers[0].capacity_blocks"


def test_non_mapping_config_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must be a table/dict"):
        load_config([("num_blocks", 10)])  # type: ignore[arg-type]


def test_missing_and_non_utf8_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        load_config(tmp_path / "missing.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"num_blocks = 1\n\xff\xfe\n")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        load_config(binary)


def test_forbidden_module_path_is_never_imported(make_module: ModuleFactory) -> None:
    name = make_module("IMPORTED = True\n")
    with pytest.raises(ConfigError, match="forbidden"):
        build_manager({"allow_module_path": False, "policy": "X", "policy_module_path": name})
    assert name not in sys.modules


def test_validation_runs_before_anything_is_imported(make_module: ModuleFactory) -> None:
    """A bad key after a module_path policy fails validation before the module is imported."""
    name = make_module("raise RuntimeError('imported before validation finished')\n")
    with pytest.raises(ConfigError, match="num_blocks"):
        build_manager({"policy": "Mine", "policy_module_path": name, "num_blocks": "many"})
    assert name not in sys.modules


def test_full_toml_config_builds_the_whole_stack(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        textwrap.dedent(
            """
            cpu_bytes = 65536          # 16 blocks of 4 KiB
            block_size_bytes = 4096
            policy = "arc"
            allow_module_path = false
            enable_events = true
            store_threshold = 2

            [hooks]
            autoload = false

            [[tiers]]
            type = "example"
            capacity_blocks = 64
            """
        )
    )
    stack = load_config(path)
    assert isinstance(stack, StackConfig)
    assert stack.num_blocks == 16
    assert stack.describe() == {
        "source": str(path),
        "cpu": {
            "num_blocks": 16,
            "block_size_bytes": 4096,
            "policy": "arc",
            "policy_module_path": None,
            "enable_events": True,
            "store_threshold": 2,
            "max_tracker_size": 64000,
            "admission": None,
            "admission_options": None,
            "admission_module_path": None,
        },
        "tiers": [{"type": "example", "capacity_blocks": 64}],
        "hooks": {"autoload": False, "enable": [], "block": []},
        "allow_module_path": False,
        "drain_timeout_s": 30.0,
        "promotion_timeout_s": 10.0,
        "promotion_backoff_s": 1.0,
        "promotion_max_failures": 3,
    }
    manager = build_manager(path)
    try:
        assert isinstance(manager, TieringOffloadingManager)
        assert type(manager.primary.policy).__name__ == "ARCCachePolicy"
        assert manager.kv_buffer.block_size_bytes == 4096
        assert [entry.name for entry in manager.entries] == ["example"]
        assert manager.tiers[0].capacity_blocks == 64  # type: ignore[attr-defined]
        assert manager.primary.num_free_blocks == 16
        assert manager.primary.admission is not None  # allowed with tiers
        assert manager.primary.admission.threshold == 2
        assert manager.primary.admission.max_size == 64000
    finally:
        manager.shutdown()


def test_dict_and_stackconfig_build_a_cpu_manager() -> None:
    manager = build_manager({"num_blocks": 32, "policy": "lru"})
    assert isinstance(manager, CPUOffloadingManager)
    assert manager.num_free_blocks == 32
    assert manager.kv_buffer is None
    stack = load_config({"num_blocks": 8})
    assert build_manager(stack).num_free_blocks == 8
    assert load_config({}).num_blocks == 20000  # the documented default


def test_default_config_builds() -> None:
    manager = build_manager(DEFAULT_CONFIG)
    try:
        assert isinstance(manager, TieringOffloadingManager)
        assert manager.primary.num_free_blocks == DEFAULT_CONFIG["num_blocks"]
    finally:
        manager.shutdown()


def test_public_api_exports() -> None:
    for name in ("build_manager", "load_config", "StackConfig"):
        assert name in kv_offload.__all__
        assert getattr(kv_offload, name) is not None


def test_configuration_docs_are_the_table_the_schema_renders() -> None:
    """The key table is written from the field declarations; a key changed without
    regenerating the page fails here with the command that does it."""
    page = (ROOT / DOCS_PATH).read_text(encoding="utf-8")
    assert page == docs_page(), (
        f"{DOCS_PATH} differs from the config schema; from the repository root, run\n"
        f"    {REGENERATE}"
    )


def test_configuration_docs_name_every_key_the_parser_accepts() -> None:
    # Keys the parser knows without a field (``[backpressure]``, the tables) need a row too.
    table = docs_table()
    for key in config_module._TOP_KEYS:
        forms = (f"| `{key}`", f"| `[{key}]", f"| `[[{key}]]")
        assert any(form in table for form in forms), key
    for key in config_module._HOOK_KEYS:
        assert f"| `[hooks] {key}`" in table, key


def test_stackconfig_defaults_are_the_declared_ones() -> None:
    stack = load_config({})
    for f in TOP_FIELDS:
        if f.shown is not None:
            assert getattr(stack, f.name) == f.default, f.name
    for f in HOOK_FIELDS:
        assert getattr(stack.hooks, f.name) == f.default, f.name
    assert stack == StackConfig()


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"polcy": "lru"}, "polcy"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"hooks": {"enable": "a"}}, "hooks.enable"),
        (
            {"block_size_bytes": 64, "tiers": [{"type": "example", "capacity": 1}]},
            "tiers[0].capacity",
        ),
        ({"block_size_bytes": 64, "tiers": [{}]}, "tiers[0]"),
        ({"tiers": [{"type": "example"}]}, "block_size_bytes"),
    ],
)
def test_config_error_names_its_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert info.value.key == key


def test_location_comes_from_the_key_not_the_message(tmp_path: Path) -> None:
    """A tier error whose message happens to mention another argument is still located at
    the key it names through ``ConfigError.key``."""
    path = tmp_path / "stack.toml"
    path.write_text('block_size_bytes = 64\n\n[[tiers]]\ntype = "example"\ncapacity_blocks = 0\n')
    with pytest.raises(ConfigError) as info:
        build_manager(path)
    assert info.value.key == "tiers[0].capacity_blocks"
    assert str(info.value).startswith(f"{path}:5: tiers[0].capacity_blocks: ")
