"""Name -> class resolution shared by every plugin kind (policies, tiers).

Resolution order, first match wins:

1. names registered at run time with :meth:`PluginRegistry.register` (imported lazily);
2. installed entry points of the kind's group; only the selected one is imported;
3. ``module_path``: import it and take the attribute called ``name`` (an out-of-tree plugin
   needs no registration), with a one-time experimental warning and an info line. Under
   ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` any ``module_path`` is refused before anything is
   resolved, for every kind (policies, tiers, backpressure detectors, drop policies) and
   whoever passes it (a config file or the API);
4. otherwise :class:`~kv_offload.errors.PluginNotFoundError` saying what is installed, which
   distribution provides a known name, and how to add one: ``module_path``, or for a kind
   selected where no ``module_path`` can be given (``--load-wait``, ``--router``), an
   installed entry point.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Generic, TypeVar

from ..errors import (
    ConfigError,
    DuplicateRegistrationError,
    PluginConflictError,
    PluginImportError,
    PluginNotFoundError,
    PluginTypeError,
)
from .env import module_path_forbidden_by_env, module_path_forbidder, module_path_unforbid_hint

__all__ = ["PluginInfo", "PluginRegistry", "ExperimentalPluginWarning", "KNOWN_DISTRIBUTIONS"]

logger = logging.getLogger("kv_offload.plugins")

T = TypeVar("T")

#: Plugins the project publishes, so an unknown-name error can say what to install.
KNOWN_DISTRIBUTIONS: dict[tuple[str, str], str] = {
    ("policy", "lru"): "kv-offload-lru",
    ("policy", "arc"): "kv-offload-arc",
    ("tier", "example"): "kv-offload-example-tier",
    ("admission", "always"): "kv-offload-admission",
    ("admission", "seen-before"): "kv-offload-admission",
    ("admission", "tinylfu"): "kv-offload-admission",
    ("admission", "conversation-share"): "kv-offload-admission",
}

RUNTIME = "runtime registration"
ENTRY_POINT = "entry point"


class ExperimentalPluginWarning(UserWarning):
    """Loading a plugin straight from ``module_path`` bypasses packaging; its API may change."""


@dataclass(frozen=True)
class PluginInfo:
    """One plugin as ``kv-offload plugins`` lists it."""

    name: str
    kind: str
    target: str
    source: str
    distribution: str | None = None
    version: str | None = None
    error: str | None = None

    @classmethod
    def from_entry_point(
        cls, ep: metadata.EntryPoint, kind: str, error: str | None = None
    ) -> PluginInfo:
        dist = ep.dist
        return cls(
            ep.name,
            kind,
            ep.value,
            ENTRY_POINT,
            dist.name if dist is not None else None,
            dist.version if dist is not None else None,
            error,
        )


def _normalize(dist_name: str) -> str:
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def _import_attr(module_path: str, attr: str) -> object:
    module = importlib.import_module(module_path)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"module {module_path!r} has no attribute {attr!r}") from None


def public_name(cls: type) -> str:
    """``cls`` as a plugin author imports it: from the shortest enclosing package whose
    ``__all__`` exports it (``kv_offload.policies.CachePolicy``), else its own module."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        package = sys.modules.get(".".join(parts[:end]))
        if package is not None and cls.__qualname__ in getattr(package, "__all__", ()):
            return f"{package.__name__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


class PluginRegistry(Generic[T]):
    """Resolves plugin names of one kind (``"policy"``, ``"tier"``) to subclasses of ``base``."""

    def __init__(
        self,
        kind: str,
        group: str,
        base: type[T],
        config_hint: str,
        *,
        takes_module_path: bool = True,
    ) -> None:
        """``config_hint`` is where users select the kind (``cache_policy_module_path``,
        ``--router NAME``); ``takes_module_path`` is false for a kind whose users cannot
        give a ``module_path`` there, so an unknown name is not answered with one."""
        self.kind = kind
        self.group = group
        self.base = base
        self._config_hint = config_hint
        self._takes_module_path = takes_module_path
        self._registered: dict[str, tuple[str, str]] = {}
        self._loaded: dict[str, type[T]] = {}
        self._entry_points: dict[str, list[metadata.EntryPoint]] | None = None
        self._warned_module_paths: set[tuple[str, str]] = set()

    # -- runtime registration -------------------------------------------------------------

    def register(self, name: str, module_path: str, class_name: str) -> None:
        """Make ``name`` resolve to ``module_path:class_name``, imported on first use."""
        if name in self._registered:
            module, cls = self._registered[name]
            raise DuplicateRegistrationError(
                f"{self.kind} {name!r} is already registered (-> {module}:{cls}); "
                f"pick another name or call unregister({name!r}) first",
                kind=self.kind,
                plugin=name,
            )
        self._registered[name] = (module_path, class_name)
        # A class cached for this name (an entry point resolved earlier) must not shadow the
        # registration, which comes first in the resolution order.
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        """Forget a runtime registration (tests, hot reload); unknown names are ignored."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    # -- entry points ---------------------------------------------------------------------

    def _scan(self, refresh: bool = False) -> dict[str, list[metadata.EntryPoint]]:
        """Installed entry points by name, one per distribution (the first on ``sys.path``)."""
        if self._entry_points is None or refresh:
            found: dict[str, dict[str, metadata.EntryPoint]] = {}
            for ep in metadata.entry_points(group=self.group):
                dist = _normalize(ep.dist.name) if ep.dist is not None else "<unknown>"
                found.setdefault(ep.name, {}).setdefault(dist, ep)
            self._entry_points = {name: list(by_dist.values()) for name, by_dist in found.items()}
        return self._entry_points

    def refresh(self) -> None:
        """Rescan installed distributions (after a ``pip install`` in this process)."""
        importlib.invalidate_caches()
        self._entry_points = None
        self._loaded.clear()

    def _load_entry_point(self, name: str, candidates: list[metadata.EntryPoint]) -> type[T]:
        if len(candidates) > 1:
            dists = ", ".join(sorted(dist_label(ep) for ep in candidates))
            raise PluginConflictError(
                f"{self.kind} {name!r} is provided by more than one installed distribution "
                f"({dists}); uninstall all but one of them",
                kind=self.kind,
                plugin=name,
            )
        (ep,) = candidates
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginImportError(
                f"{self.kind} plugin {name!r} from distribution {dist_label(ep)} failed to "
                f"import ({ep.value}): {type(exc).__name__}: {exc}; reinstall or fix the "
                f"distribution, or uninstall it",
                kind=self.kind,
                plugin=name,
            ) from exc
        return self._check(name, obj, f"entry point {ep.value} of {dist_label(ep)}")

    # -- resolution -----------------------------------------------------------------------

    def _check(self, name: str, obj: object, origin: str) -> type[T]:
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise PluginTypeError(
                f"{self.kind} {name!r} ({origin}) resolved to {obj!r}, which is not a subclass "
                f"of {public_name(self.base)}; plugins must subclass it",
                kind=self.kind,
                plugin=name,
            )
        return obj

    def resolve(self, name: str, module_path: str | None = None) -> type[T]:
        """The class for ``name``; see the module docstring for the order."""
        if not isinstance(name, str) or not name:
            raise PluginNotFoundError(
                f"{self.kind} name must be a non-empty string, got {name!r}",
                kind=self.kind,
                plugin=str(name),
            )
        if module_path is not None and module_path_forbidden_by_env():
            raise self._forbidden(name, module_path)
        cached = self._loaded.get(name)
        if cached is not None:
            return cached
        if name in self._registered:
            cls = self._load_registered(name)
        else:
            candidates = self._scan().get(name) or self._scan(refresh=True).get(name)
            if candidates:
                cls = self._load_entry_point(name, candidates)
            elif module_path is not None:
                return self._load_module_path(name, module_path)
            else:
                raise self._not_found(name)
        self._loaded[name] = cls
        return cls

    def _load_registered(self, name: str) -> type[T]:
        module_path, class_name = self._registered[name]
        try:
            obj = _import_attr(module_path, class_name)
        except Exception as exc:
            raise PluginImportError(
                f"{self.kind} {name!r} registered at run time as {module_path}:{class_name} "
                f"failed to import: {type(exc).__name__}: {exc}",
                kind=self.kind,
                plugin=name,
            ) from exc
        return self._check(name, obj, f"registered as {module_path}:{class_name}")

    def _load_module_path(self, name: str, module_path: str) -> type[T]:
        try:
            obj = _import_attr(module_path, name)
        except Exception as exc:
            raise PluginImportError(
                f"{self.kind} {name!r} could not be loaded from module_path {module_path!r}: "
                f"{type(exc).__name__}: {exc}; module_path must be an importable module that "
                f"defines a class named {name!r}",
                kind=self.kind,
                plugin=name,
            ) from exc
        cls = self._check(name, obj, f"module_path {module_path!r}")
        if (name, module_path) not in self._warned_module_paths:
            self._warned_module_paths.add((name, module_path))
            warnings.warn(
                f"loading out-of-tree {self.kind} {name!r} from module_path {module_path!r}: "
                f"this path is experimental; publish the {self.kind} as a distribution with "
                f"a {self.group!r} entry point for a stable interface",
                ExperimentalPluginWarning,
                stacklevel=4,
            )
            logger.info(
                "using %s class %s from module %s", self.kind, cls.__qualname__, cls.__module__
            )
        return cls

    def _forbidden(self, name: str, module_path: str) -> ConfigError:
        key = self._config_hint.split()[-1].strip('"')  # "cache_policy_module_path", ...
        return ConfigError(
            f"{key}={module_path!r} ({self.kind} {name!r}): module_path imports are forbidden "
            f"by {module_path_forbidder()}; install the {self.kind} as a distribution with a "
            f"{self.group!r} entry point, or {module_path_unforbid_hint()}",
            key=key,
        )

    def _not_found(self, name: str) -> PluginNotFoundError:
        installed = sorted(set(self._registered) | set(self._scan()))
        parts = [
            f"unknown {self.kind} {name!r}; available: "
            + (", ".join(repr(n) for n in installed) if installed else "none installed")
        ]
        dist = KNOWN_DISTRIBUTIONS.get((self.kind, name))
        if dist is not None:
            parts.append(f"{name!r} is provided by {dist}: pip install {dist}")
        if self._takes_module_path:
            parts.append(
                f"for an out-of-tree class, set {self._config_hint} to the module that "
                f"defines a class named {name!r}"
            )
        else:
            parts.append(
                f"to add one, install a distribution that declares it as an entry point of "
                f"the {self.group!r} group (docs/plugin-guide.md), then pass its name to "
                f"{self._config_hint}"
            )
        return PluginNotFoundError("; ".join(parts), kind=self.kind, plugin=name)

    # -- listing --------------------------------------------------------------------------

    def available(self) -> list[PluginInfo]:
        """Every runtime-registered and installed plugin, without importing any of them."""
        infos = [
            PluginInfo(name, self.kind, f"{module}:{cls}", RUNTIME)
            for name, (module, cls) in sorted(self._registered.items())
        ]
        for _name, eps in sorted(self._scan(refresh=True).items()):
            error = None
            if len(eps) > 1:
                error = "claimed by " + ", ".join(sorted(dist_label(ep) for ep in eps))
            infos += [PluginInfo.from_entry_point(ep, self.kind, error) for ep in eps]
        return infos

    def check(self, info: PluginInfo) -> PluginInfo:
        """``info`` with ``error`` filled in if importing the plugin fails."""
        if info.error is not None:
            return info
        try:
            self.resolve(info.name)
        except Exception as exc:  # a listing must survive any broken plugin
            return PluginInfo(**{**info.__dict__, "error": str(exc)})
        return info


def dist_label(ep: metadata.EntryPoint) -> str:
    """``"name version"`` of the distribution advertising ``ep``, for error messages."""
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
