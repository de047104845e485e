"""``[hooks.<name>]`` settings tables: the ``parse_settings``/``create_plugin`` convention,
through plugins installed as real distributions.

``knob`` takes settings: ``parse_settings`` checks them (and ``kv-offload validate`` runs it),
``create_plugin`` builds the instance registered under the entry-point name, once per plugin
manager. ``plain`` takes none, so a table for it is an error. Everything runs in one fresh
interpreter in a real virtual environment with both wheels pip-installed.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _dists import DistSpec, PluginEnv
from kv_offload.plugins import HOOK_ENTRY_POINT_GROUP

KNOB = DistSpec(
    name="kv-offload-hook-knob-test",
    files={
        "kvo_knob_test.py": """
            from kv_offload import ConfigError
            from kv_offload.plugins import hookimpl

            SETTINGS = {"greeting", "fail_create"}

            def parse_settings(table):
                for key in table:
                    if key not in SETTINGS:
                        raise ConfigError(f"{key} is not a setting of knob")
                greeting = table.get("greeting", "hi")
                if not isinstance(greeting, str):
                    raise ConfigError(f"greeting must be a string, got {greeting!r}")
                return {"greeting": greeting, "fail_create": table.get("fail_create", False)}

            class Knob:
                def __init__(self, settings):
                    self.settings = settings
                    self.started = []

                @hookimpl
                def kv_offload_request_started(self, req_context):
                    self.started.append(self.settings["greeting"] + " " + req_context.req_id)

            def create_plugin(settings):
                if settings["fail_create"]:
                    raise ConfigError("fail_create: the resource is busy")
                return Knob(settings)
            """
    },
    entry_points={HOOK_ENTRY_POINT_GROUP: {"knob": "kvo_knob_test"}},
)
PLAIN = DistSpec(
    name="kv-offload-hook-plain-test",
    files={
        "kvo_plain_test.py": """
            from kv_offload.plugins import hookimpl

            @hookimpl
            def kv_offload_shutdown():
                pass
            """
    },
    entry_points={HOOK_ENTRY_POINT_GROUP: {"plain": "kvo_plain_test"}},
)

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from kv_offload import ConfigError, ReqContext, build_manager, load_config
    from kv_offload.plugins import create_plugin_manager

    folder = Path(sys.argv[1])
    result = {}

    def write(name, text):
        path = folder / name
        path.write_text(text)
        return path

    def error(call):
        try:
            call()
        except ConfigError as exc:
            return str(exc)
        return None

    base = 'num_blocks = 8\\n[hooks]\\nenable = ["knob", "plain"]\\n'
    good = write("good.toml", base + '[hooks.knob]\\ngreeting = "hello"\\n')
    first, second = build_manager(good), build_manager(good)
    for manager in (first, second):
        manager.on_new_request(ReqContext("r1"))
    knob1, knob2 = (m.plugin_manager.get_plugin("knob") for m in (first, second))
    result["instances_differ"] = knob1 is not knob2
    result["started"] = knob1.started
    result["settings"] = knob1.settings
    result["plain_registered"] = first.plugin_manager.get_plugin("plain") is not None
    result["defaults"] = build_manager(write("none.toml", base)).plugin_manager.get_plugin(
        "knob"
    ).settings
    result["direct"] = create_plugin_manager(settings={"knob": {"greeting": "yo"}}).get_plugin(
        "knob"
    ).settings
    result["bad_value"] = error(
        lambda: load_config(write("bad.toml", base + "[hooks.knob]\\ngreeting = 3\\n"))
    )
    result["unknown"] = error(
        lambda: load_config(write("unknown.toml", base + "[hooks.knob]\\nvolume = 11\\n"))
    )
    busy = write("busy.toml", base + "[hooks.knob]\\n\\nfail_create = true\\n")
    result["busy_validates"] = error(lambda: load_config(busy))
    result["busy_build"] = error(lambda: build_manager(busy))
    result["plain_table"] = error(
        lambda: load_config(write("plain.toml", base + "[hooks.plain]\\nx = 1\\n"))
    )
    result["not_installed"] = error(
        lambda: load_config(write("missing.toml", "[hooks.knobb]\\nx = 1\\n"))
    )
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def report(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    env = plugin_env_factory("hook-settings")
    env.install_specs([KNOB, PLAIN], tmp_path_factory.mktemp("wheels"))
    folder = tmp_path_factory.mktemp("configs")
    proc = env.run(CHILD.replace("sys.argv[1]", repr(str(folder))))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), folder


def test_settings_reach_one_instance_per_plugin_manager(
    report: tuple[dict[str, Any], Path],
) -> None:
    result, _ = report
    assert result["instances_differ"] is True
    assert result["settings"] == {"greeting": "hello", "fail_create": False}
    assert result["started"] == ["hello r1"]  # the created instance is what fires
    assert result["plain_registered"] is True  # plugins without settings load as before
    assert result["defaults"] == {"greeting": "hi", "fail_create": False}  # no table
    assert result["direct"] == {"greeting": "yo", "fail_create": False}


def test_a_plugins_rejection_is_located_at_the_setting(
    report: tuple[dict[str, Any], Path],
) -> None:
    result, folder = report
    assert result["bad_value"] == (
        f"{folder / 'bad.toml'}:5: hooks.knob.greeting: greeting must be a string, got 3"
    )
    assert result["unknown"] == (
        f"{folder / 'unknown.toml'}:5: hooks.knob.volume: volume is not a setting of knob"
    )


def test_create_plugin_errors_come_at_build_located_too(
    report: tuple[dict[str, Any], Path],
) -> None:
    result, folder = report
    assert result["busy_validates"] is None  # validation has no side effects
    assert result["busy_build"] == (
        f"{folder / 'busy.toml'}:6: hooks.knob.fail_create: fail_create: the resource is busy"
    )


def test_tables_for_plugins_without_settings_or_not_installed(
    report: tuple[dict[str, Any], Path],
) -> None:
    result, folder = report
    assert result["plain_table"].startswith(
        f"{folder / 'plain.toml'}:4: hooks.plain: hook plugin 'plain' takes no settings"
    )
    assert result["not_installed"].startswith(
        f"{folder / 'missing.toml'}:1: hooks.knobb: no hook plugin 'knobb' is installed; "
        "did you mean 'knob'?"
    )
