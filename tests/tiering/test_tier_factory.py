"""SecondaryTierFactory, in the spirit of vLLM's tests/v1/kv_offload/tiering/test_factory.py,
plus kv-offload's resolution rules: runtime registration, installed entry points
(``kv_offload.tiers``), ``module_path``, and clear errors."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata

import numpy as np
import pytest
from _dists import DESCRIBE_EXCEPTION, DistSpec, ModuleFactory, PluginEnv
from kv_offload import (
    ConfigError,
    CPUKVBuffer,
    CPUOffloadingManager,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
    make_offload_key,
)
from kv_offload.errors import (
    DuplicateRegistrationError,
    PluginImportError,
    PluginNotFoundError,
    PluginTypeError,
)
from kv_offload.plugins import ExperimentalPluginWarning
from kv_offload.tiering import (
    TIER_ENTRY_POINT_GROUP,
    JobDirection,
    JobMetadata,
    Locality,
    OffloadingConfig,
    SecondaryTierFactory,
    SecondaryTierManager,
)
from kv_offload.tiering.writes import WritePolicy
from kv_offload_example_tier import ExampleSecondaryTierManager

CONFIG = OffloadingConfig(num_blocks=8, block_size_bytes=64)

#: Tier classes for module_path and registration tests, written to a real module per test.
TIERS_SOURCE = '''
from kv_offload.tiering import JobResult, SecondaryTierManager


class _Base(SecondaryTierManager):
    def lookup(self, key, req_context):
        return False

    def submit_store(self, job):
        pass

    def submit_load(self, job):
        pass

    def get_finished(self):
        return []


class OutOfTree(_Base):
    """Named like its tier type, as module_path loading requires; records its arguments."""

    def __init__(self, config, primary_kv_view, tier_type, root="/tmp", shards=1):
        super().__init__(config, primary_kv_view, tier_type)
        self.root = root
        self.shards = shards


class KwargsTier(_Base):
    """Takes any argument: what reaches the constructor is exactly what it gets."""

    def __init__(self, config, primary_kv_view, tier_type, **options):
        super().__init__(config, primary_kv_view, tier_type)
        self.options = options


class NeedsUrl(_Base):
    def __init__(self, config, primary_kv_view, tier_type, *, url):
        super().__init__(config, primary_kv_view, tier_type)
        self.url = url


class NotATier:
    """Has the interface, does not subclass SecondaryTierManager."""

    def __init__(self, config, primary_kv_view, tier_type):
        pass

    def lookup(self, key, req_context):
        return False


def not_a_class(config, primary_kv_view, tier_type):
    return OutOfTree(config, primary_kv_view, tier_type)
'''


@pytest.fixture
def view() -> memoryview:
    return CPUKVBuffer(CONFIG.num_blocks, CONFIG.block_size_bytes).view


@pytest.fixture
def tiers_module(make_module: ModuleFactory) -> str:
    return make_module(TIERS_SOURCE, prefix="kvo_test_tiers")


def runtime_names() -> set[str]:
    return {
        i.name for i in SecondaryTierFactory.available_tiers() if i.source == "runtime registration"
    }


@pytest.fixture(autouse=True)
def no_leaked_registrations() -> Iterator[None]:
    before = runtime_names()
    yield
    assert runtime_names() == before, "a test left a runtime registration behind"


def create(config: dict, view: memoryview) -> SecondaryTierManager:
    return SecondaryTierFactory.create_secondary_tier(config, view, CONFIG)


# -- installed tiers (entry points) ----------------------------------------------------------


def test_example_tier_installed_as_entry_point() -> None:
    (ep,) = metadata.entry_points(group=TIER_ENTRY_POINT_GROUP, name="example")
    assert ep.dist is not None and ep.dist.name == "kv-offload-example-tier"
    cls = SecondaryTierFactory.get_tier_class({"type": "example"})
    assert cls is ep.load() is ExampleSecondaryTierManager
    assert issubclass(cls, SecondaryTierManager)
    (info,) = [i for i in SecondaryTierFactory.available_tiers() if i.name == "example"]
    assert (info.kind, info.source, info.distribution) == (
        "tier",
        "entry point",
        "kv-offload-example-tier",
    )


def test_create_tier_from_registry(view: memoryview) -> None:
    tier = create({"type": "example"}, view)
    assert isinstance(tier, ExampleSecondaryTierManager)
    assert tier.tier_type == "example"
    assert tier.config is CONFIG
    assert tier.primary_kv_view is view
    assert tier.capacity_blocks is None


def test_create_multiple_tiers(view: memoryview) -> None:
    configs = [
        {"type": "example", "capacity_blocks": 1},
        {"type": "example", "capacity_blocks": 2},
    ]
    tiers = [create(dict(cfg), view) for cfg in configs]
    assert len(tiers) == 2 and tiers[0] is not tiers[1]
    assert all(isinstance(t, ExampleSecondaryTierManager) for t in tiers)
    assert [t.tier_type for t in tiers] == ["example", "example"]
    assert [t.capacity_blocks for t in tiers] == [1, 2]  # type: ignore[attr-defined]
    assert configs[0] == {"type": "example", "capacity_blocks": 1}  # the config is not consumed


def test_tier_argument_validated_by_the_tier(view: memoryview) -> None:
    with pytest.raises(ConfigError, match="capacity_blocks must be a positive int"):
        create({"type": "example", "capacity_blocks": 0}, view)


# -- runtime registration ---------------------------------------------------------------------


def test_register_new_tier_type(view: memoryview, register_tier: Callable[..., None]) -> None:
    register_tier("custom_tier", "kv_offload_example_tier", "ExampleSecondaryTierManager")
    tier = create({"type": "custom_tier", "capacity_blocks": 99}, view)
    assert tier.tier_type == "custom_tier"
    assert isinstance(tier, ExampleSecondaryTierManager)
    assert tier.capacity_blocks == 99  # type: ignore[attr-defined]
    assert "custom_tier" in runtime_names()


def test_register_is_lazy(
    view: memoryview, register_tier: Callable[..., None], tiers_module: str
) -> None:
    register_tier("lazy-tier", tiers_module, "OutOfTree")
    assert tiers_module not in sys.modules, "registration must not import the module"
    tier = create({"type": "lazy-tier", "root": "/data"}, view)
    assert tiers_module in sys.modules
    assert type(tier).__name__ == "OutOfTree" and tier.tier_type == "lazy-tier"
    assert tier.root == "/data"  # type: ignore[attr-defined]


def test_registration_shadows_nothing_after_unregister(
    view: memoryview, register_tier: Callable[..., None], tiers_module: str
) -> None:
    register_tier("t-unreg", tiers_module, "OutOfTree")
    SecondaryTierFactory.unregister_tier("t-unreg")
    with pytest.raises(PluginNotFoundError):
        create({"type": "t-unreg"}, view)


def test_duplicate_registration_raises(
    register_tier: Callable[..., None], tiers_module: str
) -> None:
    register_tier("dup-tier", tiers_module, "OutOfTree")
    with pytest.raises(DuplicateRegistrationError, match="is already registered"):
        SecondaryTierFactory.register_tier("dup-tier", "some.module", "SomeClass")


def test_registered_module_that_fails_to_import(
    view: memoryview, register_tier: Callable[..., None], make_module: ModuleFactory
) -> None:
    broken = make_module("raise RuntimeError('no native backend')\n", prefix="kvo_broken_tier")
    register_tier("broken-tier", broken, "Tier")
    with pytest.raises(PluginImportError, match=r"broken-tier.*failed to import") as info:
        create({"type": "broken-tier"}, view)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert (info.value.kind, info.value.plugin) == ("tier", "broken-tier")


# -- error paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [{}, {"capacity_blocks": 4}, {"type": ""}, {"type": None}])
def test_missing_tier_type_raises(view: memoryview, config: dict) -> None:
    with pytest.raises(ConfigError, match="has no 'type'"):
        create(config, view)


def test_bad_tier_config_shapes(view: memoryview) -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        create({"type": 3}, view)
    with pytest.raises(ConfigError, match="must be a mapping"):
        SecondaryTierFactory.create_secondary_tier(["example"], view, CONFIG)  # type: ignore[arg-type]


def test_unknown_tier_type_raises(view: memoryview) -> None:
    with pytest.raises(PluginNotFoundError) as info:
        create({"type": "nonexistent_tier"}, view)
    message = str(info.value)
    assert "unknown tier 'nonexistent_tier'" in message
    assert "available: " in message and "'example'" in message  # the supported types
    assert "module_path" in message  # how to load an out-of-tree class
    assert isinstance(info.value, LookupError)
    assert (info.value.kind, info.value.plugin) == ("tier", "nonexistent_tier")


def test_unknown_tier_lists_runtime_registrations(
    view: memoryview, register_tier: Callable[..., None], tiers_module: str
) -> None:
    register_tier("listed-tier", tiers_module, "OutOfTree")
    with pytest.raises(PluginNotFoundError, match="'listed-tier'"):
        create({"type": "nope"}, view)


def test_module_path_load(view: memoryview, tiers_module: str) -> None:
    config = {"type": "OutOfTree", "module_path": tiers_module, "root": "/mnt", "shards": 3}
    with pytest.warns(ExperimentalPluginWarning, match="experimental"):
        tier = create(config, view)
    assert type(tier).__module__ == tiers_module and type(tier).__name__ == "OutOfTree"
    assert tier.tier_type == "OutOfTree"
    assert (tier.root, tier.shards) == ("/mnt", 3)  # type: ignore[attr-defined]
    assert "OutOfTree" not in runtime_names()  # not registered by loading it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is one-time per (type, module_path)
        create(config, view)


def test_module_path_never_reaches_the_constructor(view: memoryview, tiers_module: str) -> None:
    with pytest.warns(ExperimentalPluginWarning):
        tier = create({"type": "KwargsTier", "module_path": tiers_module, "a": 1, "b": "x"}, view)
    assert tier.options == {"a": 1, "b": "x"}  # type: ignore[attr-defined]


def test_installed_type_wins_over_module_path(view: memoryview, tiers_module: str) -> None:
    tier = create({"type": "example", "module_path": tiers_module}, view)
    assert type(tier) is ExampleSecondaryTierManager


@pytest.mark.parametrize(
    "module_path", ["kvo_no_such_module_xyz", "kv_offload_example_tier"], ids=["absent", "no-attr"]
)
def test_invalid_module_path(view: memoryview, module_path: str) -> None:
    with pytest.raises(PluginImportError, match="could not be loaded from module_path") as info:
        create({"type": "OutOfTreeMissing", "module_path": module_path}, view)
    assert info.value.__cause__ is not None
    assert "OutOfTreeMissing" in str(info.value)


def test_module_path_that_raises_on_import(view: memoryview, make_module: ModuleFactory) -> None:
    broken = make_module("import kvo_definitely_missing_dependency\n", prefix="kvo_broken")
    with pytest.raises(PluginImportError, match="kvo_definitely_missing_dependency") as info:
        create({"type": "Tier", "module_path": broken}, view)
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.parametrize("name", ["NotATier", "not_a_class"])
def test_class_not_a_tier_subclass(view: memoryview, tiers_module: str, name: str) -> None:
    with pytest.raises(PluginTypeError, match=r"not a subclass of .*SecondaryTierManager"):
        create({"type": name, "module_path": tiers_module}, view)


def test_registered_class_not_a_tier_subclass(
    view: memoryview, register_tier: Callable[..., None], tiers_module: str
) -> None:
    register_tier("impostor", tiers_module, "NotATier")
    with pytest.raises(PluginTypeError, match="impostor"):
        create({"type": "impostor"}, view)


def test_unknown_constructor_argument(view: memoryview) -> None:
    with pytest.raises(ConfigError) as info:
        create({"type": "example", "capacity_blocks": 4, "custom_param": 1}, view)
    message = str(info.value)
    assert "tier 'example'" in message and "'custom_param'" in message
    assert "capacity_blocks" in message  # what it does accept


def test_missing_required_argument(view: memoryview, tiers_module: str) -> None:
    with pytest.warns(ExperimentalPluginWarning), pytest.raises(ConfigError, match="url"):
        create({"type": "NeedsUrl", "module_path": tiers_module}, view)
    tier = create({"type": "NeedsUrl", "module_path": tiers_module, "url": "redis://x"}, view)
    assert tier.url == "redis://x"  # type: ignore[attr-defined]


@pytest.mark.parametrize("tier_type", ["example", "KwargsTier"])
@pytest.mark.parametrize("reserved", ["config", "primary_kv_view", "tier_type"])
def test_reserved_keys_rejected(
    view: memoryview, tiers_module: str, tier_type: str, reserved: str
) -> None:
    """Even a tier taking **kwargs cannot be handed the arguments kv-offload sets."""
    config = {"type": tier_type, "module_path": tiers_module, reserved: 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        with pytest.raises(ConfigError, match=f"'{reserved}' is set by kv-offload"):
            create(config, view)


# -- the stack's settings for a tier are the manager's, never the tier's -------------------------

#: A full ``[[tiers]]`` entry: every stack setting, with the tier's own argument.
ENTRY = {
    "type": "example",
    "name": "hot",
    "locality": "remote",
    "backpressure": {"max_in_flight_jobs": 4},
    "write_policy": "write-through-selective",
    "admission": "store-threshold",
    "capacity_blocks": 16,
}


def test_the_factory_and_the_manager_set_nothing_on_a_tier(view: memoryview) -> None:
    entry = SecondaryTierFactory.create_tier_entry(ENTRY, view, CONFIG)
    tier = entry.tier
    assert isinstance(tier, ExampleSecondaryTierManager)
    assert (entry.name, entry.locality) == ("hot", Locality.REMOTE)
    assert entry.cascade_gate is not None and entry.cascade_gate.max_in_flight_jobs == 4
    assert entry.write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE
    assert entry.admission is not None and entry.admission.capacity_blocks == 16
    own = dict(vars(tier))  # what the tier's constructor set, and nothing else
    assert set(own) == set(vars(ExampleSecondaryTierManager(CONFIG, view, "example")))
    primary = CPUOffloadingManager(CONFIG.num_blocks, kv_buffer=CPUKVBuffer(8, 64))
    m = TieringOffloadingManager(primary, [entry])
    assert m.entries == (entry,) and m.tiers == [tier]
    assert vars(tier).keys() == own.keys()
    m.shutdown()


@pytest.mark.parametrize(
    "setting", ["name", "locality", "backpressure", "write_policy", "admission"]
)
def test_create_secondary_tier_refuses_the_stack_s_settings(view: memoryview, setting: str) -> None:
    with pytest.raises(
        ConfigError, match=f"'{setting}' is a setting of the stack.*create_tier_entry"
    ):
        create({"type": "example", setting: ENTRY[setting]}, view)


COUNTED_ADMISSION = """
from kv_offload.admission import AdmissionPolicy


class Counted(AdmissionPolicy):
    built = 0

    def __init__(self, *, capacity_blocks=None):
        super().__init__(capacity_blocks=capacity_blocks)
        type(self).built += 1

    def admit(self, keys, req_context):
        return [True for _ in keys]
"""


def test_the_gate_and_the_admission_are_built_once(
    view: memoryview, make_module: ModuleFactory
) -> None:
    module = make_module(COUNTED_ADMISSION, prefix="kvo_counted_admission")
    config = {"type": "example", "admission": "Counted", "admission_module_path": module}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        entry = SecondaryTierFactory.create_tier_entry(config, view, CONFIG)
    assert type(entry.admission).built == 1  # type: ignore[attr-defined]
    entry.tier.shutdown()


COUNTED_DETECTOR = """
from kv_offload.tiering.backpressure import EMADetector


class CountedDetector(EMADetector):
    built = 0

    def __init__(self, **options):
        super().__init__(**options)
        type(self).built += 1
"""


def test_build_manager_builds_each_gate_and_admission_once(make_module: ModuleFactory) -> None:
    """Config validation builds the admissions and the gate (a constructor is what rejects a
    bad option) and the stack is built from those: a plugin that counts its constructions
    (or allocates, or logs) is constructed once per build_manager, not at validate and
    again at build."""
    admission = make_module(COUNTED_ADMISSION, prefix="kvo_counted_admission")
    detector = make_module(COUNTED_DETECTOR, prefix="kvo_counted_detector")
    config = {
        "num_blocks": 16,
        "block_size_bytes": 64,
        "admission": "Counted",
        "admission_module_path": admission,
        "tiers": [
            {
                "type": "example",
                "admission": "Counted",
                "admission_module_path": admission,
                "backpressure": {"detector": "CountedDetector", "detector_module_path": detector},
            }
        ],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        manager = build_manager(config)
    assert isinstance(manager, TieringOffloadingManager)
    (entry,) = manager.entries
    assert entry.cascade_gate is not None
    assert type(entry.admission).built == 2  # type: ignore[attr-defined]  # CPU's, tier's
    assert type(entry.cascade_gate.detector).built == 1  # type: ignore[attr-defined]
    manager.shutdown()


def test_a_bad_setting_builds_no_tier(view: memoryview, tiers_module: str) -> None:
    """The gate and the admission are built (once) before the tier: a bad one constructs
    nothing that would have to be shut down."""
    config = {"type": "NeedsUrl", "module_path": tiers_module, "write_policy": "sometimes"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        with pytest.raises(ConfigError, match="write_policy must be one of"):
            SecondaryTierFactory.create_tier_entry(config, view, CONFIG)  # no url: not built


# -- a third-party tier distribution, installed for real ----------------------------------------

DICT_TIER_SOURCE = '''
"""A third-party tier: blocks as bytes in a dict, copied at submit time."""
import numpy as np

from kv_offload.tiering import JobResult, SecondaryTierManager


class DictTier(SecondaryTierManager):
    def __init__(self, config, primary_kv_view, tier_type, label="dict"):
        super().__init__(config, primary_kv_view, tier_type)
        self.label = label
        self._cpu = np.asarray(primary_kv_view)
        self._blocks = {}
        self._done = []

    def lookup(self, key, req_context):
        return key in self._blocks

    def submit_store(self, job):
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            self._blocks[key] = self._cpu[slot].tobytes()
        self._done.append(JobResult(job.job_id, True))

    def submit_load(self, job):
        if not all(key in self._blocks for key in job.keys):
            self._done.append(JobResult(job.job_id, False))
            return
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            self._cpu[slot] = np.frombuffer(self._blocks[key], np.uint8)
        self._done.append(JobResult(job.job_id, True))

    def get_finished(self):
        done, self._done = self._done, []
        return done
'''

DICT_TIER = DistSpec(
    name="kv-offload-dict-tier-test",
    version="2.0.1",
    files={"kv_offload_dict_tier_test/__init__.py": DICT_TIER_SOURCE},
    entry_points={TIER_ENTRY_POINT_GROUP: {"dict": "kv_offload_dict_tier_test:DictTier"}},
)

CHILD = (
    DESCRIBE_EXCEPTION
    + """
import json, sys
import numpy as np
from kv_offload import (
    CPUOffloadingManager, LookupResult, ReqContext, TieringOffloadingManager, make_offload_key,
)
from kv_offload.tiering import OffloadingConfig, SecondaryTierFactory

infos = [
    {"name": i.name, "distribution": i.distribution, "version": i.version, "source": i.source}
    for i in SecondaryTierFactory.available_tiers()
]
before = "kv_offload_dict_tier_test" in sys.modules
primary = CPUOffloadingManager(2, block_size_bytes=256)
config = OffloadingConfig(2, 256)
tier = SecondaryTierFactory.create_secondary_tier(
    {"type": "dict", "label": "third-party"}, primary.kv_buffer.view, config
)
m = TieringOffloadingManager(primary, [tier])
ctx = ReqContext("r")
rows = np.random.default_rng(7).integers(0, 256, (4, 256), dtype=np.uint8)
keys = [make_offload_key(i) for i in range(4)]
for batch in (slice(0, 2), slice(2, 4)):
    out = m.prepare_store(keys[batch], ctx)
    m.kv_buffer.write_blocks(out.store_spec.block_ids, rows[batch])
    m.complete_store(out.keys_to_store, ctx)
    m.on_schedule_end()
first = [m.lookup(k, ctx).name for k in keys[:2]]
m.on_schedule_end()
second = [m.lookup(k, ctx).name for k in keys[:2]]
spec = m.prepare_load(keys[:2], ctx)
same = m.kv_buffer.read_blocks(spec.block_ids).tobytes() == rows[:2].tobytes()
m.complete_load(keys[:2], ctx)
m.shutdown()
try:
    SecondaryTierFactory.create_secondary_tier({"type": "dict", "bogus": 1}, None, config)
    bad_arg = None
except Exception as exc:
    bad_arg = describe(exc)
print(json.dumps({
    "infos": [i for i in infos if i["name"] in ("dict", "example")],
    "imported_before_use": before,
    "class": f"{type(tier).__module__}:{type(tier).__qualname__}",
    "tier_type": tier.tier_type,
    "label": tier.label,
    "first": first,
    "second": second,
    "same_bytes": same,
    "promoted": m.get_stats().tiers[0].promoted_blocks,
    "bad_arg": bad_arg,
}))
"""
)


@pytest.fixture(scope="module")
def dict_tier_env(
    plugin_env_factory: Callable[[str], PluginEnv], tmp_path_factory: pytest.TempPathFactory
) -> PluginEnv:
    env = plugin_env_factory("tier-dist")
    env.install_specs([DICT_TIER], tmp_path_factory.mktemp("tier-wheels"))
    return env


def test_third_party_tier_installed_and_selected_by_type(dict_tier_env: PluginEnv) -> None:
    assert dict_tier_env.versions(DICT_TIER.name) == {DICT_TIER.name: "2.0.1"}
    result = dict_tier_env.run_json(CHILD)
    assert isinstance(result, dict)
    assert result["infos"] == [
        {
            "name": "dict",
            "distribution": "kv-offload-dict-tier-test",
            "version": "2.0.1",
            "source": "entry point",
        },
        {
            "name": "example",
            "distribution": "kv-offload-example-tier",
            "version": "0.1.0",
            "source": "entry point",
        },
    ]
    assert result["imported_before_use"] is False  # listing does not import plugins
    assert result["class"] == "kv_offload_dict_tier_test:DictTier"
    assert (result["tier_type"], result["label"]) == ("dict", "third-party")
    assert result["first"] == ["PENDING", "PENDING"]
    assert result["second"] == ["HIT", "HIT"]
    assert result["same_bytes"] is True
    assert result["promoted"] == 2
    bad = result["bad_arg"]
    assert bad["type"] == "ConfigError"
    assert "tier 'dict'" in bad["message"] and "'bogus'" in bad["message"]
    assert "label" in bad["message"]


def test_third_party_tier_not_visible_outside_its_environment(view: memoryview) -> None:
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(DICT_TIER.name)
    with pytest.raises(PluginNotFoundError):
        create({"type": "dict"}, view)


def test_example_tier_round_trip_via_factory() -> None:
    """The tier the factory builds copies real bytes in and out of the CPU buffer's rows."""
    buffer = CPUKVBuffer(CONFIG.num_blocks, CONFIG.block_size_bytes)
    tier = create({"type": "example"}, buffer.view)
    ctx = ReqContext("r")
    rows = np.random.default_rng(3).integers(0, 256, (2, CONFIG.block_size_bytes), np.uint8)
    buffer.write_blocks([1, 5], rows)
    k = [make_offload_key(1), make_offload_key(2)]
    tier.submit_store(JobMetadata(0, k, np.array([1, 5]), JobDirection.STORE, ctx))
    buffer.write_blocks([1, 5], np.zeros_like(rows))
    tier.submit_load(JobMetadata(1, k, np.array([7, 0]), JobDirection.LOAD, ctx))
    assert [(r.job_id, r.success) for r in tier.get_finished()] == [(0, True), (1, True)]
    np.testing.assert_array_equal(buffer.read_blocks([7, 0]), rows)
