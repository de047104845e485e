"""Sessions: tests (fresh venv, every distribution installed as a user would), lint,
typecheck, bench, demo. `python3 -m nox` runs tests, lint and typecheck."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = False

ROOT = Path(__file__).parent
PLUGINS = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "plugins").iterdir()
    if (path / "pyproject.toml").is_file()
)
TRACE = "data/conversation_trace.jsonl"
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
# The vllm session: vLLM 0.33.0 without its dependencies (they pin a CUDA torch and GBs of
# CUDA wheels), the CPU torch wheel this machine kind provides under /opt/wheels, and only
# the packages importing vllm.v1.kv_offload (cpu + tiering managers and specs) needs.
VLLM = "vllm==0.33.0"
VLLM_TORCH = "torch==2.13.0"
VLLM_KV_OFFLOAD_IMPORTS = [
    *("aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "annotated-types"),
    *("anyio", "apache-tvm-ffi==0.1.11", "attrs", "cachetools", "cbor2", "certifi"),
    *("charset-normalizer", "cloudpickle", "fastapi", "frozenlist", "h11", "httpcore2"),
    *("httpx2", "huggingface-hub", "idna", "llguidance", "msgspec", "multidict", "openai"),
    *("openai-harmony", "opentelemetry-api", "packaging", "partial-json-parser", "pillow"),
    *("prometheus-client", "propcache", "psutil", "py-cpuinfo", "pybase64", "pydantic"),
    *("pydantic-core", "pyyaml", "pyzmq", "regex", "requests", "safetensors", "sniffio"),
    *("starlette", "tokenizers", "transformers", "truststore", "typing-inspection"),
    *("urllib3", "uvloop", "xgrammar", "yarl"),
]


def install_stack(session: nox.Session, *extras: str) -> None:
    """The core and every plugin distribution, non-editable, in one resolver run."""
    core = f".[{','.join(extras)}]" if extras else "."
    session.install(core, *PLUGINS)


@nox.session
def tests(session: nox.Session) -> None:
    """The suite. tests/redis_tier needs `redis-server` and `redis-cli` on PATH
    (`apt-get install -y redis-server`; .ci/run installs them): skipped without, failed under CI."""
    install_stack(session, "test")
    session.run("pytest", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """The kv-offload-vllm bridge against vLLM 0.33's real managers (tests/vllm_bridge)."""
    start = time.monotonic()
    session.install(VLLM_TORCH)
    session.install("--no-deps", VLLM, *VLLM_KV_OFFLOAD_IMPORTS)
    install_stack(session, "test")
    seconds = time.monotonic() - start
    venv = Path(session.virtualenv.location)
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    session.log(f"vLLM environment: installed in {seconds:.0f} s, {size / 1e9:.2f} GB")
    # Fail, never skip, when vLLM does not import in the environment built for it.
    session.run("pytest", "tests/vllm_bridge", *session.posargs, env={"KVO_REQUIRE_VLLM": "1"})
    shutil.rmtree(venv, ignore_errors=True)  # GBs; nox rebuilds it on every run anyway


@nox.session
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    install_stack(session)
    session.install(MYPY)
    session.run("mypy", "core/kv_offload", *(f"{p}/src" for p in PLUGINS))
    for example in sorted((ROOT / "examples").iterdir()):
        session.run("mypy", "--strict", str(example.relative_to(ROOT)))


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark; each reports ratios against a baseline measured in the same run."""
    install_stack(session)
    session.run("python", "benchmarks/replay.py", *session.posargs)
    session.run("python", "benchmarks/ceiling.py")
    session.run("python", "benchmarks/memory.py")
    session.run("python", "benchmarks/dataplane.py")
    session.run("python", "benchmarks/guard_overhead.py")
    session.run("python", "benchmarks/hooks_overhead.py")
    session.run("python", "benchmarks/prometheus_overhead.py")
    session.run("python", "benchmarks/fs_tier.py")
    session.run("python", "benchmarks/vllm_side_by_side.py")
    session.run("python", "benchmarks/redis_tier.py")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: the embedded default stack (CPU tier + example tier, real bytes) on the
    bundled trace, then LRU against ARC across CPU-tier sizes."""
    install_stack(session)
    session.run("kv-offload", "plugins")
    session.run("kv-offload", "replay", "default", TRACE, "--no-progress")
    session.run(
        "kv-offload",
        "compare",
        TRACE,
        "--no-progress",
        "--policy",
        "lru",
        "--policy",
        "arc",
        "--capacity",
        "5000",
        "--capacity",
        "20000",
    )
