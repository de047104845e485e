"""A plugin whose constructor returns something other than its kind's base class is a
PluginError naming the plugin and the class to subclass, one check for every kind built by
name (kv_offload.plugins.construct.named_instance); the instance it returns carries the name
it was built by."""

from __future__ import annotations

import pytest
from _dists import ModuleFactory
from kv_offload.admission import build_admission
from kv_offload.errors import PluginError
from kv_offload.fleet.routers import Router
from kv_offload.load_wait import build_load_wait
from kv_offload.plugins.construct import named_instance

pytestmark = pytest.mark.filterwarnings("ignore::kv_offload.plugins.ExperimentalPluginWarning")

IMPOSTORS = """
from kv_offload.admission import AdmissionPolicy
from kv_offload.load_wait import LoadWaitPolicy


class Wait(LoadWaitPolicy):
    def __new__(cls):
        return object()

    def budget_s(self, prefix_blocks, block_tokens):
        return 0.0


class Admit(AdmissionPolicy):
    def __new__(cls, **settings):
        return object()
"""


def test_a_load_wait_policy_building_something_else(make_module: ModuleFactory) -> None:
    module = make_module(IMPOSTORS)
    with pytest.raises(PluginError, match=r"load-wait policy 'Wait' built a object, not a "):
        build_load_wait("Wait", module_path=module)


def test_an_admission_building_something_else(make_module: ModuleFactory) -> None:
    module = make_module(IMPOSTORS)
    with pytest.raises(
        PluginError,
        match=r"admission 'Admit' for the CPU tier built a object, not an AdmissionPolicy; "
        r"subclass kv_offload\.admission\.AdmissionPolicy",
    ) as caught:
        build_admission("Admit", module_path=module, where="the CPU tier")
    assert (caught.value.kind, caught.value.plugin) == ("admission", "Admit")


def test_the_check_passes_an_instance_through_with_its_name() -> None:
    class Mine(Router):
        pass

    built = Mine()
    assert named_instance("router", "mine", built, Router, "kv_offload.fleet.Router") is built
    assert built.plugin_name == "mine"
    with pytest.raises(PluginError, match=r"router 'odd' built a int, not a Router; subclass"):
        named_instance("router", "odd", 3, Router, "kv_offload.fleet.Router")
