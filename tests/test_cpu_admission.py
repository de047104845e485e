"""The CPU tier's admission (issue 29): ``admission = "NAME"`` at the top level of a config
chooses which offered blocks the CPU tier stores, the same plugin kind, name resolution,
``module_path`` fallback and errors as a secondary tier's; vLLM's ``store_threshold`` is the
``store-threshold`` admission, and the two together are a config error."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from _dists import ModuleFactory
from _tiers import key
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    LookupResult,
    PluginError,
    ReqContext,
    build_manager,
    load_config,
)
from kv_offload.admission import StoreThreshold
from kv_offload.plugins import ExperimentalPluginWarning

ADMISSIONS = """
from kv_offload.admission import AdmissionPolicy


class EvenOnly(AdmissionPolicy):
    def __init__(self, *, capacity_blocks=None):
        super().__init__(capacity_blocks=capacity_blocks)
        self.finished = []

    def admit(self, keys, req_context):
        return [int.from_bytes(k[:8], "big") % 2 == 0 for k in keys]

    def on_request_finished(self, req_context):
        self.finished.append(req_context.req_id)


class Raises(AdmissionPolicy):
    def admit(self, keys, req_context):
        raise RuntimeError("admission state corrupted")


class Ints(AdmissionPolicy):
    def admit(self, keys, req_context):
        return [1 for _ in keys]
"""


def cpu(**top: Any) -> CPUOffloadingManager:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPluginWarning)
        m = build_manager({"num_blocks": 8, **top})
    assert isinstance(m, CPUOffloadingManager)
    return m


def offer(m: CPUOffloadingManager, ids: list[int], req: str = "r") -> list[bytes]:
    """Store ``ids`` as one request would; the keys the CPU tier stored."""
    ctx = ReqContext(req)
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)
    return [bytes(k) for k in out.keys_to_store]


def test_store_threshold_admission_by_name_is_store_threshold() -> None:
    named = cpu(admission="store-threshold", admission_options={"threshold": 2})
    classic = cpu(store_threshold=2)
    assert isinstance(named.admission, StoreThreshold)
    assert isinstance(classic.admission, StoreThreshold)
    for m in (named, classic):
        assert offer(m, [1, 2]) == []
        assert offer(m, [1, 3]) == [key(1)]
        assert m.get_stats().stores_skipped == 3
        m.shutdown()


def test_an_admission_plugin_chooses_what_the_cpu_tier_stores(make_module: ModuleFactory) -> None:
    m = cpu(admission="EvenOnly", admission_module_path=make_module(ADMISSIONS))
    assert offer(m, [0, 1, 2, 3]) == [key(0), key(2)]
    ctx = ReqContext("r")
    assert m.lookup(key(0), ctx) is LookupResult.HIT
    assert m.lookup(key(1), ctx) is LookupResult.MISS
    m.on_request_finished(ctx)
    assert m.admission is not None and m.admission.finished == ["r"]  # type: ignore[attr-defined]
    m.shutdown()


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("Raises", "raised RuntimeError: admission state corrupted"), ("Ints", "answered int 1")],
)
def test_a_broken_cpu_admission_is_a_plugin_error_and_stores_nothing(
    make_module: ModuleFactory, name: str, fragment: str
) -> None:
    m = cpu(admission=name, admission_module_path=make_module(ADMISSIONS))
    before = m.get_stats()
    with pytest.raises(PluginError, match=f"admission {name!r}") as info:
        m.prepare_store([key(1), key(2)], ReqContext("r"))
    assert fragment in str(info.value)
    assert info.value.kind == "admission" and info.value.plugin == name
    after = m.get_stats()
    assert (after.resident_blocks, after.pending_blocks, after.pinned_blocks) == (
        before.resident_blocks,
        0,
        0,
    )
    assert m.lookup(key(1), ReqContext("r")) is LookupResult.MISS
    m.shutdown()


def test_both_store_threshold_and_admission_by_hand_is_an_error() -> None:
    with pytest.raises(ConfigError, match="keep one"):
        CPUOffloadingManager(8, store_threshold=2, admission=StoreThreshold())
    with pytest.raises(ConfigError, match="AdmissionPolicy"):
        CPUOffloadingManager(8, admission="store-threshold")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lines", "key_line", "fragments"),
    [
        (
            'admission = "store-treshold"',
            2,
            ("unknown admission", "did you mean 'store-threshold'"),
        ),
        (
            'admission = "store-threshold"\nstore_threshold = 2',
            2,
            ("both admission 'store-threshold' and store_threshold = 2", "keep one"),
        ),
        ("admission_options = { threshold = 2 }", 2, ("admission_options without admission",)),
        ('admission_module_path = "somewhere"', 2, ("admission_module_path without admission",)),
        (
            'admission = "store-threshold"\nadmission_options = { threshold = 0 }',
            3,
            ("the CPU tier", "threshold must be >= 1"),
        ),
        (
            'admission = "store-threshold"\nadmission_options = { treshold = 2 }',
            3,
            ("admission_options", "treshold"),
        ),
        ("admission = 3", 2, ("admission", "must be a non-empty string")),
        ('admission = "store-threshold"\nadmission_options = 2', 3, ("must be a table",)),
        (
            'allow_module_path = false\nadmission = "X"\nadmission_module_path = "m"',
            4,
            ("forbidden by allow_module_path = false", "install the admission"),
        ),
    ],
)
def test_bad_cpu_admission_config_at_validate_with_file_and_line(
    tmp_path: Path, lines: str, key_line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("num_blocks = 8\n" + textwrap.dedent(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{key_line}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_a_tier_admission_module_path_is_forbidden_by_allow_module_path(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'allow_module_path = false\nblock_size_bytes = 64\n[[tiers]]\ntype = "example"\n'
        'admission = "X"\nadmission_module_path = "m"\n'
    )
    with pytest.raises(ConfigError, match="forbidden by allow_module_path") as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:6: ")
