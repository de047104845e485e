"""Build and really install throwaway distributions, for plugin-discovery tests.

Entry-point discovery can only be tested honestly against distributions that ``pip`` installed
into a real environment, because that is what ``importlib.metadata`` reads in production. This
module gives any test (policies, tiers, hooks: any entry-point group) three pieces:

* :class:`DistSpec` describes a distribution: name, version, source files, entry points. It can
  be written out as a setuptools project (``pyproject.toml`` + sources) or built straight into a
  wheel with the standard library (:meth:`DistSpec.build_wheel`, milliseconds, no build backend,
  works offline and with any setuptools/wheel version).
* :class:`PluginEnv` is a real virtual environment (``python -m venv --without-pip``) that also
  sees the test environment's packages (kv-offload itself, installed plugins, pip), through a
  ``.pth`` file that calls ``site.addsitedir`` for each of them. ``pip install`` and
  ``pip uninstall`` run *inside* it, so both really work. (``pip install --target DIR`` is no
  good here: ``pip uninstall`` then prints "Not uninstalling ..., outside environment" and
  exits 0 without removing anything.)
* :meth:`PluginEnv.run` / :meth:`PluginEnv.run_json` run Python code in that environment.

pip runs isolated from the machine's configuration (no config files, no ``PIP_*`` variables,
``--no-index``), so the tests neither reach the network nor depend on local pip settings.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DESCRIBE_EXCEPTION",
    "DistSpec",
    "ModuleFactory",
    "PluginEnv",
    "can_build_with_setuptools",
]

#: Python source defining ``describe(exc) -> dict``: a JSON-able picture of an exception, for
#: child processes to report what they raised (type, MRO names, message, chained cause and the
#: ``kind``/``plugin`` attributes of kv-offload's plugin errors).
DESCRIBE_EXCEPTION = textwrap.dedent(
    """
    def describe(exc):
        cause = exc.__cause__
        return {
            "type": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
            "cause_type": type(cause).__name__ if cause is not None else None,
            "cause_message": str(cause) if cause is not None else None,
            "kind": getattr(exc, "kind", None),
            "plugin": getattr(exc, "plugin", None),
        }
    """
)


def _escape(name: str) -> str:
    """The distribution name as it appears in wheel and ``.dist-info`` file names."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class DistSpec:
    """A throwaway distribution.

    ``files`` maps paths relative to site-packages (``"pkg/__init__.py"``, ``"mod.py"``) to
    their source (dedented when written). ``entry_points`` maps a group to ``{name: value}``,
    e.g. ``{"kv_offload.policies": {"fifo": "pkg:FIFOPolicy"}}``.
    """

    name: str
    version: str = "0.1.0"
    files: Mapping[str, str] = field(default_factory=dict)
    entry_points: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    summary: str = "throwaway distribution built by the kv-offload test suite"

    # -- metadata ----------------------------------------------------------------------

    def _entry_points_txt(self) -> str:
        lines: list[str] = []
        for group, eps in self.entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{name} = {value}" for name, value in eps.items())
            lines.append("")
        return "\n".join(lines)

    def _sources(self) -> dict[str, bytes]:
        return {
            path: textwrap.dedent(source).encode("utf-8") for path, source in self.files.items()
        }

    # -- a wheel, built by hand ---------------------------------------------------------

    def build_wheel(self, out_dir: Path) -> Path:
        """A PEP 427 ``py3-none-any`` wheel of this distribution in ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        dist_info = f"{_escape(self.name)}-{self.version}.dist-info"
        contents = self._sources()
        contents[f"{dist_info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {self.version}\n"
            f"Summary: {self.summary}\n"
        ).encode()
        contents[f"{dist_info}/WHEEL"] = (
            b"Wheel-Version: 1.0\nGenerator: kv-offload-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        )
        if self.entry_points:
            contents[f"{dist_info}/entry_points.txt"] = self._entry_points_txt().encode()
        record = "".join(
            f"{path},{_record_hash(data)},{len(data)}\n" for path, data in contents.items()
        )
        record += f"{dist_info}/RECORD,,\n"
        contents[f"{dist_info}/RECORD"] = record.encode()
        wheel = out_dir / f"{_escape(self.name)}-{self.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for path, data in contents.items():
                zf.writestr(path, data)
        return wheel

    def install_target(self, tmp: Path) -> Path:
        """This distribution really pip-installed into ``tmp/site`` (``pip install --target``,
        offline, from a wheel built in ``tmp/wheels``): a directory to put on PYTHONPATH."""
        wheel = self.build_wheel(tmp / "wheels")
        target = tmp / "site"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        subprocess.run(
            [*pip, "--target", str(target), str(wheel)],
            check=True,
            capture_output=True,
            env=_clean_env(),
        )
        return target

    # -- a setuptools project -----------------------------------------------------------

    def write_project(self, project_dir: Path) -> Path:
        """Write a setuptools project (``pyproject.toml`` + sources) that pip can build."""
        project_dir.mkdir(parents=True, exist_ok=True)
        sources = self._sources()
        packages = sorted(
            str(Path(path).parent).replace("/", ".")
            for path in sources
            if Path(path).name == "__init__.py"
        )
        modules = sorted(
            Path(path).stem for path in sources if "/" not in path and path.endswith(".py")
        )
        toml = [
            "[build-system]",
            'requires = ["setuptools>=64"]',
            'build-backend = "setuptools.build_meta"',
            "",
            "[project]",
            f"name = {json.dumps(self.name)}",
            f"version = {json.dumps(self.version)}",
            f"description = {json.dumps(self.summary)}",
            "",
        ]
        for group, eps in self.entry_points.items():
            toml.append(f"[project.entry-points.{json.dumps(group)}]")
            toml.extend(f"{json.dumps(name)} = {json.dumps(value)}" for name, value in eps.items())
            toml.append("")
        toml += [
            "[tool.setuptools]",
            f"packages = {json.dumps(packages)}",
            f"py-modules = {json.dumps(modules)}",
            "",
        ]
        (project_dir / "pyproject.toml").write_text("\n".join(toml))
        for path, data in sources.items():
            target = project_dir / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return project_dir


def can_build_with_setuptools() -> str | None:
    """``None`` if pip can build a setuptools project without build isolation here, else why
    not (setuptools older than 70.1 needs the ``wheel`` package for ``bdist_wheel``)."""
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed"
    major_minor = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    if major_minor >= (70, 1):
        return None
    try:
        import wheel  # noqa: F401
    except ImportError:
        return f"setuptools {setuptools.__version__} needs the 'wheel' package to build wheels"
    return None


def _clean_env() -> dict[str, str]:
    """The environment for child processes: no pip configuration, no inherited import path."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PIP_") and key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONIOENCODING="utf-8",
    )
    return env


class PluginEnv:
    """A real, throwaway virtual environment layered over the test environment.

    Distributions installed here shadow nothing outside it and vanish with ``root``; the test
    environment's own packages (kv-offload, installed plugins, pip) stay importable and
    visible to ``importlib.metadata`` inside it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(root)],
            check=True,
            capture_output=True,
            env=_clean_env(),
        )
        bindir = "Scripts" if os.name == "nt" else "bin"
        self.python = root / bindir / ("python.exe" if os.name == "nt" else "python")
        probe = self.run_json(
            "import json, sys, sysconfig\n"
            "print(json.dumps({'path': sys.path, 'purelib': sysconfig.get_paths()['purelib']}))"
        )
        assert isinstance(probe, dict)
        self.site_packages = Path(probe["purelib"])
        own = set(probe["path"])
        # Every directory the test process imports from that the bare venv lacks; addsitedir
        # also runs their .pth files, so editable installs keep working.
        parent_dirs = [
            p
            for p in dict.fromkeys(sys.path)
            if os.path.isabs(p) and os.path.isdir(p) and p not in own
        ]
        pth = "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parent_dirs)
        (self.site_packages / "_kv_offload_tests_parent.pth").write_text(pth + "\n")

    # -- running code -------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        python_args: Sequence[str] = (),
        cwd: Path | None = None,
        env: Mapping[str, str | None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with this environment's interpreter; never raises on failure.

        ``env`` adjusts the child's environment: a ``None`` value removes that variable.
        """
        child_env = _clean_env()
        for name, value in (env or {}).items():
            if value is None:
                child_env.pop(name, None)
            else:
                child_env[name] = value
        return subprocess.run(
            [str(self.python), *python_args, "-c", code],
            capture_output=True,
            text=True,
            env=child_env,
            cwd=cwd or self.root,
            timeout=120,
        )

    def run_json(
        self,
        code: str,
        *,
        python_args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
    ) -> object:
        """Run ``code`` and parse the last line it prints as JSON; fail loudly otherwise."""
        proc = self.run(code, python_args=python_args, env=env)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise AssertionError(
                f"child process failed (exit {proc.returncode})\n--- code ---\n{code}\n"
                f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
            )
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # -- pip ----------------------------------------------------------------------------

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run this environment's pip (the test environment's pip, running inside it)."""
        proc = subprocess.run(
            [str(self.python), "-m", "pip", *args],
            capture_output=True,
            text=True,
            env=_clean_env(),
            cwd=self.root,
            timeout=300,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"pip {' '.join(args)} failed (exit {proc.returncode})\n"
                f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
            )
        return proc

    def install(self, *targets: Path) -> None:
        """``pip install`` wheels or project directories, offline and without dependencies
        (a project is built by the installed setuptools, see :func:`can_build_with_setuptools`)."""
        self.pip(
            "install",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            *(str(t) for t in targets),
        )

    def install_specs(self, specs: Sequence[DistSpec], wheel_dir: Path) -> list[Path]:
        """Build each spec into a wheel in ``wheel_dir`` and install them all in one pip run."""
        wheels = [spec.build_wheel(wheel_dir) for spec in specs]
        self.install(*wheels)
        return wheels

    def uninstall(self, *names: str) -> None:
        """``pip uninstall -y``, then check the distributions really are gone."""
        self.pip("uninstall", "-y", *names)
        left = {name: v for name, v in self.versions(*names).items() if v is not None}
        if left:
            raise AssertionError(f"pip uninstall left {left} installed in {self.root}")

    def versions(self, *dist_names: str) -> dict[str, str | None]:
        """The installed version of each distribution as seen inside the environment, or
        ``None`` for one that is not installed there."""
        result = self.run_json(
            "import json\nfrom importlib import metadata\n"
            "def version(name):\n"
            "    try:\n"
            "        return metadata.version(name)\n"
            "    except metadata.PackageNotFoundError:\n"
            "        return None\n"
            f"print(json.dumps({{n: version(n) for n in {list(dist_names)!r}}}))"
        )
        assert isinstance(result, dict)
        return result


_module_ids = itertools.count()


class ModuleFactory:
    """``make_module(source) -> name``: writes ``source`` as a real module file in
    ``make_module.folder`` (which is on ``sys.path``) under a name unique in the session."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.created: list[str] = []

    def __call__(self, source: str, prefix: str = "kvo_test_mod") -> str:
        name = f"{prefix}_{next(_module_ids)}"
        (self.folder / f"{name}.py").write_text(textwrap.dedent(source))
        self.created.append(name)
        return name
