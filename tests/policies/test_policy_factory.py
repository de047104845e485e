"""CachePolicyFactory: name -> policy class, in the spirit of vLLM's
tests/v1/kv_offload/test_factory.py, plus kv-offload's plugin resolution rules
(runtime registration, installed entry points, ``module_path``, clear errors)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata

import pytest
from _dists import DESCRIBE_EXCEPTION, ModuleFactory
from kv_offload import (
    CPUOffloadingManager,
    KVOffloadError,
    LookupResult,
    PluginError,
    ReqContext,
    make_offload_key,
)
from kv_offload.errors import (
    DuplicateRegistrationError,
    PluginImportError,
    PluginNotFoundError,
    PluginTypeError,
)
from kv_offload.plugins import ExperimentalPluginWarning, PluginInfo
from kv_offload.plugins.registry import KNOWN_DISTRIBUTIONS
from kv_offload.policies import POLICY_ENTRY_POINT_GROUP, CachePolicy, CachePolicyFactory

#: (policy name, distribution, top-level module) of the policies the project publishes.
INSTALLED = [
    ("lru", "kv-offload-lru", "kv_offload_lru"),
    ("arc", "kv-offload-arc", "kv_offload_arc"),
]
INSTALLED_IDS = [name for name, _, _ in INSTALLED]

#: A module of test policies, written to a real file per test (see ``make_module``).
POLICIES_SOURCE = '''
from collections import OrderedDict

from kv_offload.policies import CachePolicy


class _OrderedPolicy(CachePolicy):
    """Blocks in an OrderedDict; victims are the first idle, unprotected ones of _order()."""

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self._blocks = OrderedDict()

    def get(self, key):
        return self._blocks.get(key)

    def insert(self, key, block):
        self._blocks[key] = block

    def remove(self, key):
        self._blocks.pop(key, None)

    def touch(self, keys, req_context):
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def clear(self):
        self._blocks.clear()

    def _order(self):
        return list(self._blocks.items())

    def evict(self, n, protected):
        victims = []
        for key, block in self._order():
            if len(victims) == n:
                break
            if block.ref_cnt == 0 and key not in protected:
                victims.append((key, block))
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self._blocks[key]
        return victims


class MRUPolicy(_OrderedPolicy):
    """Evicts the most recently stored or touched idle block."""

    def _order(self):
        return list(reversed(self._blocks.items()))


class FIFOPolicy(_OrderedPolicy):
    """Evicts in store order; touch() changes nothing."""

    def touch(self, keys, req_context):
        pass


class OutOfTreeFIFO(FIFOPolicy):
    """Named like the policy, as module_path loading requires."""


class NotAPolicy:
    """Has the whole interface, but does not subclass CachePolicy."""

    def __init__(self, cache_capacity):
        self.cache_capacity = cache_capacity

    def get(self, key):
        return None

    def insert(self, key, block):
        pass

    def remove(self, key):
        pass

    def touch(self, keys, req_context):
        pass

    def evict(self, n, protected):
        return None

    def clear(self):
        pass


def not_a_class(cache_capacity):
    return FIFOPolicy(cache_capacity)


an_instance = FIFOPolicy(4)
'''

CTX = ReqContext(req_id="req-0")


def k(i: int) -> bytes:
    return make_offload_key(i)


def store(manager: CPUOffloadingManager, *ids: int) -> list[bytes]:
    """Store the keys ``ids`` (prepare + successful complete); returns the evicted keys."""
    out = manager.prepare_store([k(i) for i in ids], CTX)
    assert out is not None, f"prepare_store({ids}) found nothing to evict"
    assert out.keys_to_store == [k(i) for i in ids]
    manager.complete_store(out.keys_to_store, CTX)
    return list(out.evicted_keys)


def resident(manager: CPUOffloadingManager, *ids: int) -> list[int]:
    return [i for i in ids if manager.lookup(k(i), CTX) is LookupResult.HIT]


def evicted_after_touch(manager: CPUOffloadingManager) -> list[bytes]:
    """Store 1, 2, 3 into a 3-block manager, touch 2, store 4: the victim tells the policy
    apart (LRU and FIFO evict 1; MRU evicts 2)."""
    assert manager.num_blocks == 3
    assert store(manager, 1, 2, 3) == []
    manager.touch([k(2)], CTX)
    return store(manager, 4)


@pytest.fixture
def policies_module(make_module: ModuleFactory) -> str:
    """The name of a fresh module holding POLICIES_SOURCE (not imported yet)."""
    return make_module(POLICIES_SOURCE)


def runtime_names() -> set[str]:
    return {
        info.name
        for info in CachePolicyFactory.available_policies()
        if info.source == "runtime registration"
    }


@pytest.fixture(autouse=True)
def no_leaked_registrations() -> Iterator[None]:
    before = runtime_names()
    yield
    assert runtime_names() == before, "a test left a runtime registration behind"


# -- installed policies ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dist", "module"), INSTALLED, ids=INSTALLED_IDS)
def test_installed_policy_resolves_by_name(name: str, dist: str, module: str) -> None:
    cls = CachePolicyFactory.get_cache_policy_cls(name)
    assert isinstance(cls, type) and issubclass(cls, CachePolicy)
    assert cls is not CachePolicy
    assert cls.__module__.split(".")[0] == module
    # It is exactly what the distribution's entry point names.
    (ep,) = metadata.entry_points(group=POLICY_ENTRY_POINT_GROUP, name=name)
    assert ep.dist is not None and ep.dist.name == dist
    assert ep.load() is cls
    assert CachePolicyFactory.get_cache_policy_cls(name) is cls


@pytest.mark.parametrize(("name", "dist", "module"), INSTALLED, ids=INSTALLED_IDS)
def test_installed_policy_drives_manager(name: str, dist: str, module: str) -> None:
    manager = CPUOffloadingManager(4, cache_policy=name)
    assert type(manager.policy) is CachePolicyFactory.get_cache_policy_cls(name)
    assert manager.cache_policy_name == name
    assert manager.policy.cache_capacity == 4
    assert store(manager, 1, 2, 3, 4) == []
    assert resident(manager, 1, 2, 3, 4) == [1, 2, 3, 4]
    spec = manager.prepare_load([k(1)], CTX)
    assert spec.block_ids.tolist() == [manager.block_id(k(1))]
    assert manager.ref_count(k(1)) == 1
    manager.complete_load([k(1)], CTX)
    evicted = store(manager, 5)
    assert len(evicted) == 1 and evicted[0] in {k(i) for i in (1, 2, 3, 4)}
    assert manager.lookup(evicted[0], CTX) is LookupResult.MISS
    assert manager.lookup(k(5), CTX) is LookupResult.HIT


def test_default_policy_is_lru() -> None:
    manager = CPUOffloadingManager(3)
    assert manager.cache_policy_name == "lru"
    assert type(manager.policy) is CachePolicyFactory.get_cache_policy_cls("lru")
    assert evicted_after_touch(manager) == [k(1)]


# -- runtime registration -------------------------------------------------------------------


def test_register_resolves_lazily(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("mru-test", policies_module, "MRUPolicy")
    assert policies_module not in sys.modules, "registration must not import the module"
    cls = CachePolicyFactory.get_cache_policy_cls("mru-test")
    assert policies_module in sys.modules
    assert cls.__name__ == "MRUPolicy"
    assert cls.__module__ == policies_module
    assert issubclass(cls, CachePolicy)
    assert CachePolicyFactory.get_cache_policy_cls("mru-test") is cls


def test_registered_policy_end_to_end(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("mru-test", policies_module, "MRUPolicy")
    manager = CPUOffloadingManager(3, cache_policy="mru-test")
    assert manager.cache_policy_name == "mru-test"
    assert type(manager.policy).__name__ == "MRUPolicy"
    # MRU: the block touched last (2) goes, where LRU would evict 1.
    assert evicted_after_touch(manager) == [k(2)]
    assert resident(manager, 1, 2, 3, 4) == [1, 3, 4]
    # Pinned blocks are never victims: pin 4 (the most recent), the next victim is 3.
    manager.prepare_load([k(4)], CTX)
    assert store(manager, 5) == [k(3)]
    manager.complete_load([k(4)], CTX)
    stats = manager.get_stats()
    assert stats.evictions == 2
    assert stats.resident_blocks == 3


def test_registered_policy_listed_without_import(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("mru-test", policies_module, "MRUPolicy")
    infos = [i for i in CachePolicyFactory.available_policies() if i.name == "mru-test"]
    assert infos == [
        PluginInfo("mru-test", "policy", f"{policies_module}:MRUPolicy", "runtime registration")
    ]
    assert policies_module not in sys.modules


def test_registration_takes_precedence_over_installed_policy(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    lru = CachePolicyFactory.get_cache_policy_cls("lru")  # resolved (and cached) first
    register_policy("lru", policies_module, "MRUPolicy")
    shadow = CachePolicyFactory.get_cache_policy_cls("lru")
    assert shadow is not lru
    assert (shadow.__module__, shadow.__name__) == (policies_module, "MRUPolicy")
    assert evicted_after_touch(CPUOffloadingManager(3)) == [k(2)]
    CachePolicyFactory.unregister_cache_policy("lru")
    assert CachePolicyFactory.get_cache_policy_cls("lru") is lru
    assert evicted_after_touch(CPUOffloadingManager(3)) == [k(1)]


def test_unregister_forgets_the_name(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("fifo-test", policies_module, "FIFOPolicy")
    assert CachePolicyFactory.get_cache_policy_cls("fifo-test").__name__ == "FIFOPolicy"
    CachePolicyFactory.unregister_cache_policy("fifo-test")
    with pytest.raises(PluginNotFoundError, match="unknown policy 'fifo-test'"):
        CachePolicyFactory.get_cache_policy_cls("fifo-test")
    CachePolicyFactory.unregister_cache_policy("never-registered")  # ignored


def test_duplicate_registration_raises(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("dup-test", policies_module, "MRUPolicy")
    with pytest.raises(DuplicateRegistrationError) as excinfo:
        register_policy("dup-test", policies_module, "FIFOPolicy")
    err = excinfo.value
    assert isinstance(err, PluginError) and isinstance(err, KVOffloadError)
    assert (err.kind, err.plugin) == ("policy", "dup-test")
    message = str(err)
    assert "'dup-test' is already registered" in message
    assert f"{policies_module}:MRUPolicy" in message
    assert "unregister('dup-test')" in message
    # The first registration is untouched.
    assert CachePolicyFactory.get_cache_policy_cls("dup-test").__name__ == "MRUPolicy"
    # And after unregistering, the name is free again.
    CachePolicyFactory.unregister_cache_policy("dup-test")
    register_policy("dup-test", policies_module, "FIFOPolicy")
    assert CachePolicyFactory.get_cache_policy_cls("dup-test").__name__ == "FIFOPolicy"


# -- unknown names --------------------------------------------------------------------------


def test_unknown_policy_lists_installed_and_mentions_module_path(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("mru-test", policies_module, "MRUPolicy")
    with pytest.raises(PluginNotFoundError) as excinfo:
        CachePolicyFactory.get_cache_policy_cls("no-such-policy")
    err = excinfo.value
    assert isinstance(err, LookupError) and isinstance(err, KVOffloadError)
    assert (err.kind, err.plugin) == ("policy", "no-such-policy")
    message = str(err)
    assert message.startswith("unknown policy 'no-such-policy'; available: ")
    for name in ("'lru'", "'arc'", "'mru-test'"):
        assert name in message
    assert "cache_policy_module_path" in message
    assert "a class named 'no-such-policy'" in message
    assert "pip install" not in message  # nobody publishes that name


def test_unknown_policy_through_manager() -> None:
    with pytest.raises(PluginNotFoundError, match="unknown policy 'no-such-policy'"):
        CPUOffloadingManager(4, cache_policy="no-such-policy")


def test_known_but_not_installed_says_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KNOWN_DISTRIBUTIONS, ("policy", "lfu"), "kv-offload-lfu")
    with pytest.raises(PluginNotFoundError) as excinfo:
        CPUOffloadingManager(4, cache_policy="lfu")
    message = str(excinfo.value)
    assert "unknown policy 'lfu'" in message
    assert "'lfu' is provided by kv-offload-lfu: pip install kv-offload-lfu" in message
    assert "cache_policy_module_path" in message


def test_known_name_of_another_kind_gives_no_pip_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KNOWN_DISTRIBUTIONS, ("tier", "lfu"), "kv-offload-lfu-tier")
    with pytest.raises(PluginNotFoundError) as excinfo:
        CachePolicyFactory.get_cache_policy_cls("lfu")
    assert "pip install" not in str(excinfo.value)


@pytest.mark.parametrize("bad", ["", None, 3])
def test_name_must_be_a_non_empty_string(bad: object) -> None:
    with pytest.raises(PluginNotFoundError, match="policy name must be a non-empty string"):
        CachePolicyFactory.get_cache_policy_cls(bad)  # type: ignore[arg-type]


# -- module_path ----------------------------------------------------------------------------


def test_module_path_end_to_end_warns_once_and_logs(
    policies_module: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kv_offload.plugins")
    with pytest.warns(ExperimentalPluginWarning) as record:
        first = CPUOffloadingManager(
            3, cache_policy="OutOfTreeFIFO", cache_policy_module_path=policies_module
        )
        second = CPUOffloadingManager(
            3, cache_policy="OutOfTreeFIFO", cache_policy_module_path=policies_module
        )
    experimental = [w for w in record if issubclass(w.category, ExperimentalPluginWarning)]
    assert len(experimental) == 1, [str(w.message) for w in experimental]
    text = str(experimental[0].message)
    assert "'OutOfTreeFIFO'" in text
    assert repr(policies_module) in text
    assert "experimental" in text
    assert "'kv_offload.policies' entry point" in text

    infos = [
        r for r in caplog.records if r.name == "kv_offload.plugins" and r.levelno == logging.INFO
    ]
    assert len(infos) == 1, [r.getMessage() for r in infos]
    assert infos[0].getMessage() == (
        f"using policy class OutOfTreeFIFO from module {policies_module}"
    )

    for manager in (first, second):
        assert type(manager.policy).__name__ == "OutOfTreeFIFO"
        assert type(manager.policy).__module__ == policies_module
    # FIFO: touching 2 does not save 1, and a touched block is not the victim either.
    assert evicted_after_touch(first) == [k(1)]
    assert store(first, 5) == [k(2)]


def test_module_path_is_per_module(make_module: ModuleFactory) -> None:
    mod_a = make_module(POLICIES_SOURCE)
    mod_b = make_module(POLICIES_SOURCE)
    with pytest.warns(ExperimentalPluginWarning) as record:
        cls_a = CachePolicyFactory.get_cache_policy_cls("OutOfTreeFIFO", mod_a)
        cls_b = CachePolicyFactory.get_cache_policy_cls("OutOfTreeFIFO", mod_b)
        assert CachePolicyFactory.get_cache_policy_cls("OutOfTreeFIFO", mod_a) is cls_a
        assert CachePolicyFactory.get_cache_policy_cls("OutOfTreeFIFO", mod_b) is cls_b
    assert (cls_a.__module__, cls_b.__module__) == (mod_a, mod_b)
    warned = [str(w.message) for w in record if w.category is ExperimentalPluginWarning]
    assert len(warned) == 2
    assert repr(mod_a) in warned[0] and repr(mod_b) in warned[1]
    # A module_path load is not remembered as *the* class of that name.
    with pytest.raises(PluginNotFoundError):
        CachePolicyFactory.get_cache_policy_cls("OutOfTreeFIFO")


def test_module_path_ignored_when_name_resolves_earlier(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("mru-test", policies_module, "MRUPolicy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = CPUOffloadingManager(3, cache_policy_module_path="kvo_no_such_module")
        mru = CachePolicyFactory.get_cache_policy_cls("mru-test", "kvo_no_such_module")
    assert type(manager.policy) is CachePolicyFactory.get_cache_policy_cls("lru")
    assert mru.__name__ == "MRUPolicy"
    assert not [w for w in caught if issubclass(w.category, ExperimentalPluginWarning)]


def test_module_path_missing_module_chains_cause() -> None:
    with pytest.raises(PluginImportError) as excinfo:
        CPUOffloadingManager(
            3, cache_policy="OutOfTreeFIFO", cache_policy_module_path="kvo_no_such_module"
        )
    err = excinfo.value
    assert isinstance(err, ImportError) and isinstance(err, PluginError)
    assert (err.kind, err.plugin) == ("policy", "OutOfTreeFIFO")
    assert isinstance(err.__cause__, ModuleNotFoundError)
    assert err.__cause__.name == "kvo_no_such_module"
    message = str(err)
    assert "policy 'OutOfTreeFIFO' could not be loaded from module_path 'kvo_no_such_module'" in (
        message
    )
    assert "ModuleNotFoundError" in message
    assert "defines a class named 'OutOfTreeFIFO'" in message


def test_module_path_without_the_class(policies_module: str) -> None:
    with pytest.raises(PluginImportError) as excinfo:
        CachePolicyFactory.get_cache_policy_cls("NoSuchClass", policies_module)
    assert isinstance(excinfo.value.__cause__, AttributeError)
    message = str(excinfo.value)
    assert f"module {policies_module!r} has no attribute 'NoSuchClass'" in message
    assert "defines a class named 'NoSuchClass'" in message


# -- import failures of registered policies -------------------------------------------------


def test_registered_missing_module_chains_cause(register_policy: Callable[..., None]) -> None:
    register_policy("ghost", "kvo_no_such_module", "Ghost")
    with pytest.raises(PluginImportError) as excinfo:
        CPUOffloadingManager(3, cache_policy="ghost")
    err = excinfo.value
    assert isinstance(err.__cause__, ModuleNotFoundError)
    assert err.__cause__.name == "kvo_no_such_module"
    assert (err.kind, err.plugin) == ("policy", "ghost")
    assert "policy 'ghost' registered at run time as kvo_no_such_module:Ghost" in str(err)


def test_registered_missing_class_chains_cause(
    register_policy: Callable[..., None], policies_module: str
) -> None:
    register_policy("ghost", policies_module, "Ghost")
    with pytest.raises(PluginImportError) as excinfo:
        CachePolicyFactory.get_cache_policy_cls("ghost")
    assert isinstance(excinfo.value.__cause__, AttributeError)
    assert f"{policies_module}:Ghost failed to import" in str(excinfo.value)


def test_registered_module_raising_on_import(
    register_policy: Callable[..., None], make_module: ModuleFactory
) -> None:
    module = make_module("raise RuntimeError('no GPU driver here')\n")
    register_policy("explodes", module, "Policy")
    for _ in range(2):  # a failed import is not cached as a success, nor hidden the 2nd time
        with pytest.raises(PluginImportError) as excinfo:
            CachePolicyFactory.get_cache_policy_cls("explodes")
        assert isinstance(excinfo.value.__cause__, RuntimeError)
        assert "RuntimeError: no GPU driver here" in str(excinfo.value)


# -- not a CachePolicy subclass -------------------------------------------------------------


@pytest.mark.parametrize("attr", ["NotAPolicy", "not_a_class", "an_instance"])
def test_registered_non_subclass_raises_type_error(
    register_policy: Callable[..., None], policies_module: str, attr: str
) -> None:
    register_policy("impostor", policies_module, attr)
    for _ in range(2):  # not cached either
        with pytest.raises(PluginTypeError) as excinfo:
            CPUOffloadingManager(3, cache_policy="impostor")
    err = excinfo.value
    assert isinstance(err, TypeError) and isinstance(err, PluginError)
    assert (err.kind, err.plugin) == ("policy", "impostor")
    message = str(err)
    assert "policy 'impostor'" in message
    assert f"registered as {policies_module}:{attr}" in message
    assert "not a subclass of kv_offload.policies.CachePolicy" in message


def test_module_path_non_subclass_raises_type_error_without_warning(
    make_module: ModuleFactory,
) -> None:
    module = make_module(POLICIES_SOURCE + "\nImpostor = NotAPolicy\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = r"not a subclass of kv_offload\.policies\.CachePolicy"
        with pytest.raises(PluginTypeError, match=expected):
            CachePolicyFactory.get_cache_policy_cls("Impostor", module)
    assert not [w for w in caught if issubclass(w.category, ExperimentalPluginWarning)]


def test_type_check_survives_python_O(make_module: ModuleFactory) -> None:
    """The subclass check is a real ``raise``, not an ``assert`` that ``-O`` strips."""
    module = make_module(POLICIES_SOURCE + "\nImpostor = NotAPolicy\n")
    folder = str(make_module.folder)
    code = f"""
import json, sys
sys.path.insert(0, {folder!r})
from kv_offload.policies import CachePolicyFactory
{DESCRIBE_EXCEPTION}
results = {{"optimize": sys.flags.optimize}}
CachePolicyFactory.register_cache_policy("impostor", {module!r}, "NotAPolicy")
for label, call in [
    ("registered", lambda: CachePolicyFactory.get_cache_policy_cls("impostor")),
    ("module_path", lambda: CachePolicyFactory.get_cache_policy_cls("Impostor", {module!r})),
]:
    try:
        results[label] = {{"returned": repr(call())}}
    except Exception as exc:
        results[label] = describe(exc)
print(json.dumps(results))
"""
    proc = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["optimize"] == 1  # asserts really are stripped in the child
    for label in ("registered", "module_path"):
        assert results[label]["type"] == "PluginTypeError", results[label]
        assert "TypeError" in results[label]["mro"]
        assert "not a subclass of kv_offload.policies.CachePolicy" in results[label]["message"]


# -- listing --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dist", "module"), INSTALLED, ids=INSTALLED_IDS)
def test_available_policies_lists_installed(name: str, dist: str, module: str) -> None:
    infos = [i for i in CachePolicyFactory.available_policies() if i.name == name]
    (ep,) = metadata.entry_points(group=POLICY_ENTRY_POINT_GROUP, name=name)
    assert infos == [
        PluginInfo(
            name=name,
            kind="policy",
            target=ep.value,
            source="entry point",
            distribution=dist,
            version=metadata.version(dist),
            error=None,
        )
    ]
    assert ep.value.split(":")[0].split(".")[0] == module


def test_available_policies_imports_no_plugin() -> None:
    code = """
import json, sys
from kv_offload.policies import CachePolicyFactory
infos = CachePolicyFactory.available_policies()
print(json.dumps({
    "names": sorted(i.name for i in infos),
    "imported": sorted(
        m for m in sys.modules if m.startswith(("kv_offload_lru", "kv_offload_arc"))
    ),
}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"lru", "arc"} <= set(result["names"])
    assert result["imported"] == []
