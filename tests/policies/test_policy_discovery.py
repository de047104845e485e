"""Policy discovery against real installed distributions.

Each distribution here is built as a wheel, installed by pip into a real throwaway virtual
environment (``tests/_dists.py``), and the checks run in a fresh interpreter of that
environment, so ``importlib.metadata`` sees exactly what a user's installation would show.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest
from _dists import DESCRIBE_EXCEPTION, DistSpec, PluginEnv, can_build_with_setuptools
from kv_offload.policies import POLICY_ENTRY_POINT_GROUP as GROUP

ROOT = Path(__file__).resolve().parents[2]
#: The shipped FIFO example policy, installed here under a test distribution's name.
FIFO_SOURCE = (ROOT / "examples" / "policy-fifo" / "kv_offload_fifo.py").read_text()

FIFO = DistSpec(
    name="kv-offload-fifo-test",
    version="1.2.3",
    files={"kv_offload_fifo_test/__init__.py": FIFO_SOURCE},
    entry_points={GROUP: {"fifo": "kv_offload_fifo_test:FIFOCachePolicy"}},
)
BROKEN = DistSpec(
    name="kv-offload-broken-test",
    version="0.0.1",
    files={
        "kv_offload_broken_test/__init__.py": (
            "raise RuntimeError('kv_offload_broken_test: native extension missing')\n"
        )
    },
    entry_points={GROUP: {"broken": "kv_offload_broken_test:BrokenPolicy"}},
)
DUP_SOURCE = "from kv_offload_fifo_test import FIFOCachePolicy as Policy\n"


def dup_dist(letter: str, version: str) -> DistSpec:
    """One of two distributions that both claim the policy name ``dup``."""
    module = f"kv_offload_dup_{letter}_test"
    return DistSpec(
        name=f"kv-offload-dup-{letter}-test",
        version=version,
        files={f"{module}.py": DUP_SOURCE},
        entry_points={GROUP: {"dup": f"{module}:Policy"}},
    )


DUP_A, DUP_B = dup_dist("a", "0.1.0"), dup_dist("b", "0.2.0")
NOTSUB = DistSpec(
    name="kv-offload-notsub-test",
    version="0.3.0",
    files={
        "kv_offload_notsub_test.py": '''
            class NotAPolicy:
                """Looks like a policy, but does not subclass CachePolicy."""

                def __init__(self, cache_capacity):
                    self.cache_capacity = cache_capacity
            '''
    },
    entry_points={
        GROUP: {
            "notsub": "kv_offload_notsub_test:NotAPolicy",
            "typo": "kv_offload_notsub_test:NoSuchClass",
        }
    },
)
ALL = [FIFO, BROKEN, DUP_A, DUP_B, NOTSUB]
OTHER_MODULES = [
    "kv_offload_broken_test",
    "kv_offload_dup_a_test",
    "kv_offload_dup_b_test",
    "kv_offload_notsub_test",
]

#: Helpers every child script starts with.
PRELUDE = (
    DESCRIBE_EXCEPTION
    + """
import dataclasses, json, subprocess, sys
from importlib import metadata
from kv_offload import (
    CPUOffloadingManager, ReqContext, get_offload_block_hash, make_offload_key,
)
from kv_offload.policies import CachePolicyFactory

CTX = ReqContext(req_id="discovery")


def k(i):
    return make_offload_key(i)


def ids(keys):
    return [int.from_bytes(get_offload_block_hash(key), "big") for key in keys]


def store(manager, *nums):
    out = manager.prepare_store([k(i) for i in nums], CTX)
    manager.complete_store(out.keys_to_store, CTX)
    return ids(out.evicted_keys)


def attempt(fn):
    try:
        return {"returned": repr(fn())}
    except Exception as exc:
        return describe(exc)


def infos(name):
    return [
        dataclasses.asdict(i) for i in CachePolicyFactory.available_policies() if i.name == name
    ]


def imported(*modules):
    return sorted(m for m in modules if m in sys.modules)


def fifo_vs_lru():
    # Store 1, 2, 3; touch 1; store 4; touch 2; store 5. FIFO evicts 1 then 2 whatever
    # was touched; LRU evicts 2 (1 was touched) then 3.
    result = {}
    for name in ("fifo", "lru"):
        manager = CPUOffloadingManager(3, cache_policy=name)
        victims = [store(manager, 1, 2, 3)]
        manager.touch([k(1)], CTX)
        victims.append(store(manager, 4))
        manager.touch([k(2)], CTX)
        victims.append(store(manager, 5))
        policy = type(manager.policy)
        result[name] = {
            "class": f"{policy.__module__}:{policy.__qualname__}",
            "victims": victims,
            "hits": [i for i in range(1, 6) if manager.lookup(k(i), CTX).name == "HIT"],
        }
    return result
"""
)


def run(env: PluginEnv, body: str) -> dict[str, object]:
    result = env.run_json(PRELUDE + body)
    assert isinstance(result, dict)
    return result


@pytest.fixture(scope="module")
def env(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path_factory: pytest.TempPathFactory
) -> PluginEnv:
    """One environment with every test distribution installed by a single pip run."""
    plugin_env = plugin_env_factory("policy-discovery")
    plugin_env.install_specs(ALL, tmp_path_factory.mktemp("wheels"))
    return plugin_env


# -- (a) a working third-party policy -------------------------------------------------------


def test_installed_distribution_is_what_metadata_sees(env: PluginEnv) -> None:
    assert env.versions(*(spec.name for spec in ALL)) == {s.name: s.version for s in ALL}
    # ...and only inside that environment, not in the one running the tests.
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(FIFO.name)


def test_fifo_selected_by_name_through_manager(env: PluginEnv) -> None:
    result = run(
        env,
        f"""
print(json.dumps({{
    "policies": fifo_vs_lru(),
    "imported": imported(*{OTHER_MODULES!r}),
}}))
""",
    )
    policies = result["policies"]
    assert policies["fifo"] == {
        "class": "kv_offload_fifo_test:FIFOCachePolicy",
        "victims": [[], [1], [2]],
        "hits": [3, 4, 5],
    }
    # The same sequence under LRU evicts differently, so the FIFO order above is the plugin's.
    assert policies["lru"] == {
        "class": "kv_offload_lru.policy:LRUCachePolicy",
        "victims": [[], [2], [3]],
        "hits": [1, 4, 5],
    }
    # Only the selected plugins were imported: the broken, duplicated and impostor
    # distributions installed beside them were never touched.
    assert result["imported"] == []


def test_fifo_listed_with_distribution_and_version(env: PluginEnv) -> None:
    result = run(env, 'print(json.dumps({"fifo": infos("fifo"), "lru": infos("lru")}))')
    assert result["fifo"] == [
        {
            "name": "fifo",
            "kind": "policy",
            "target": "kv_offload_fifo_test:FIFOCachePolicy",
            "source": "entry point",
            "distribution": "kv-offload-fifo-test",
            "version": "1.2.3",
            "error": None,
        }
    ]
    (lru,) = result["lru"]
    assert lru["distribution"] == "kv-offload-lru"  # the test environment's own plugins too


def test_uninstall_then_clear_not_found_error(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path: Path
) -> None:
    """Install and uninstall with pip while a process runs, then start a fresh one."""
    env = plugin_env_factory("fifo-uninstall")
    wheel = FIFO.build_wheel(tmp_path / "wheels")

    def pip(*args: str) -> str:
        """A line of child code running pip in the child's own environment."""
        argv = ", ".join(map(repr, ["-m", "pip", *args]))
        return f"subprocess.run([sys.executable, {argv}], check=True, capture_output=True)"

    live = run(
        env,
        f"""
result = {{"before": attempt(lambda: CachePolicyFactory.get_cache_policy_cls("fifo"))}}
{pip("install", "--no-deps", "--no-index", str(wheel))}
CachePolicyFactory.registry.refresh()
result["installed"] = fifo_vs_lru()["fifo"]
{pip("uninstall", "-y", FIFO.name)}
CachePolicyFactory.registry.refresh()
result["after"] = attempt(lambda: CPUOffloadingManager(3, cache_policy="fifo"))
print(json.dumps(result))
""",
    )
    assert live["before"]["type"] == "PluginNotFoundError"
    assert live["installed"]["victims"] == [[], [1], [2]]
    assert live["after"]["type"] == "PluginNotFoundError", live["after"]

    fresh = run(
        env,
        """
from kv_offload.plugins.registry import KNOWN_DISTRIBUTIONS
result = {"plain": attempt(lambda: CPUOffloadingManager(3, cache_policy="fifo"))}
KNOWN_DISTRIBUTIONS[("policy", "fifo")] = "kv-offload-fifo-test"
result["known"] = attempt(lambda: CPUOffloadingManager(3, cache_policy="fifo"))
result["module"] = attempt(lambda: __import__("kv_offload_fifo_test"))
result["metadata"] = attempt(lambda: metadata.version("kv-offload-fifo-test"))
print(json.dumps(result))
""",
    )
    plain = fresh["plain"]
    assert plain["type"] == "PluginNotFoundError"
    assert "LookupError" in plain["mro"]
    assert (plain["kind"], plain["plugin"]) == ("policy", "fifo")
    message = plain["message"]
    assert message.startswith("unknown policy 'fifo'; available: ")
    available = message.split("; ")[1]
    assert "'lru'" in available and "'arc'" in available
    assert "'fifo'" not in available
    assert "cache_policy_module_path" in message
    assert "pip install" not in message
    assert "pip install kv-offload-fifo-test" in fresh["known"]["message"]
    # pip really removed the files and the metadata.
    assert fresh["module"]["type"] == "ModuleNotFoundError"
    assert fresh["metadata"]["type"] == "PackageNotFoundError"


# -- (b) a plugin whose import fails --------------------------------------------------------


def test_broken_plugin_raises_import_error_naming_plugin_and_distribution(
    env: PluginEnv,
) -> None:
    result = run(
        env,
        """
print(json.dumps({
    "factory": attempt(lambda: CachePolicyFactory.get_cache_policy_cls("broken")),
    "manager": attempt(lambda: CPUOffloadingManager(3, cache_policy="broken")),
    "others": [attempt(lambda: CachePolicyFactory.get_cache_policy_cls(n)) for n in ("fifo",)],
}))
""",
    )
    for outcome in (result["factory"], result["manager"]):
        assert outcome["type"] == "PluginImportError"
        assert "ImportError" in outcome["mro"] and "PluginError" in outcome["mro"]
        assert (outcome["kind"], outcome["plugin"]) == ("policy", "broken")
        message = outcome["message"]
        assert "policy plugin 'broken'" in message
        assert "distribution kv-offload-broken-test 0.0.1" in message
        assert "kv_offload_broken_test:BrokenPolicy" in message
        assert "RuntimeError: kv_offload_broken_test: native extension missing" in message
        assert outcome["cause_type"] == "RuntimeError"
        assert outcome["cause_message"] == "kv_offload_broken_test: native extension missing"
    # A broken distribution does not break the others.
    assert "FIFOCachePolicy" in result["others"][0]["returned"]


def test_broken_plugin_listed_without_importing_it(env: PluginEnv) -> None:
    result = run(
        env,
        """
from kv_offload.plugins import PluginInfo
listed = infos("broken")
before = imported("kv_offload_broken_test")
checked = CachePolicyFactory.registry.check(PluginInfo(**listed[0]))
print(json.dumps({"listed": listed, "imported": before, "checked": checked.error}))
""",
    )
    assert result["listed"] == [
        {
            "name": "broken",
            "kind": "policy",
            "target": "kv_offload_broken_test:BrokenPolicy",
            "source": "entry point",
            "distribution": "kv-offload-broken-test",
            "version": "0.0.1",
            "error": None,
        }
    ]
    assert result["imported"] == []
    # Checking it (what a `plugins --check` listing does) reports the failure instead of raising.
    assert "kv-offload-broken-test 0.0.1 failed to import" in result["checked"]


# -- (c) two distributions claiming one name ------------------------------------------------


def test_name_claimed_by_two_distributions_conflicts(env: PluginEnv) -> None:
    result = run(
        env,
        """
print(json.dumps({
    "factory": attempt(lambda: CachePolicyFactory.get_cache_policy_cls("dup")),
    "manager": attempt(lambda: CPUOffloadingManager(3, cache_policy="dup")),
    "imported": imported("kv_offload_dup_a_test", "kv_offload_dup_b_test"),
    "listed": infos("dup"),
}))
""",
    )
    for outcome in (result["factory"], result["manager"]):
        assert outcome["type"] == "PluginConflictError"
        assert "PluginError" in outcome["mro"]
        assert (outcome["kind"], outcome["plugin"]) == ("policy", "dup")
        message = outcome["message"]
        assert "policy 'dup' is provided by more than one installed distribution" in message
        assert "(kv-offload-dup-a-test 0.1.0, kv-offload-dup-b-test 0.2.0)" in message
        assert "uninstall all but one" in message
    assert result["imported"] == []  # neither candidate is imported
    claim = "claimed by kv-offload-dup-a-test 0.1.0, kv-offload-dup-b-test 0.2.0"
    assert sorted((i["distribution"], i["target"], i["error"]) for i in result["listed"]) == [
        ("kv-offload-dup-a-test", "kv_offload_dup_a_test:Policy", claim),
        ("kv-offload-dup-b-test", "kv_offload_dup_b_test:Policy", claim),
    ]


# -- (d) an entry point that is not a CachePolicy -------------------------------------------


def test_entry_point_to_non_subclass_raises_type_error(env: PluginEnv) -> None:
    result = run(
        env,
        """
print(json.dumps({
    "notsub": attempt(lambda: CPUOffloadingManager(3, cache_policy="notsub")),
    "typo": attempt(lambda: CachePolicyFactory.get_cache_policy_cls("typo")),
}))
""",
    )
    notsub = result["notsub"]
    assert notsub["type"] == "PluginTypeError"
    assert "TypeError" in notsub["mro"]
    assert (notsub["kind"], notsub["plugin"]) == ("policy", "notsub")
    message = notsub["message"]
    assert "policy 'notsub'" in message
    assert "entry point kv_offload_notsub_test:NotAPolicy of kv-offload-notsub-test 0.3.0" in (
        message
    )
    assert "not a subclass of kv_offload.policies.CachePolicy" in message

    typo = result["typo"]
    assert typo["type"] == "PluginImportError"
    assert typo["cause_type"] == "AttributeError"
    assert "distribution kv-offload-notsub-test 0.3.0" in typo["message"]
    assert "kv_offload_notsub_test:NoSuchClass" in typo["message"]


# -- the same distribution built from its pyproject.toml by setuptools ----------------------


def test_setuptools_project_exposes_the_entry_point(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path: Path
) -> None:
    reason = can_build_with_setuptools()
    if reason is not None:
        pytest.skip(reason)
    env = plugin_env_factory("setuptools-fifo")
    env.install(FIFO.write_project(tmp_path / "kv-offload-fifo-test"))
    result = run(env, 'print(json.dumps({"listed": infos("fifo"), "run": fifo_vs_lru()}))')
    assert [(i["distribution"], i["version"], i["target"]) for i in result["listed"]] == [
        ("kv-offload-fifo-test", "1.2.3", "kv_offload_fifo_test:FIFOCachePolicy")
    ]
    assert result["run"]["fifo"]["victims"] == [[], [1], [2]]
    env.uninstall(FIFO.name)  # the helper checks the distribution is really gone
    assert env.versions(FIFO.name) == {FIFO.name: None}
