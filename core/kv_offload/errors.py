"""The exception hierarchy of kv-offload.

Every error a user can cause derives from :class:`KVOffloadError`, so an engine can catch one
type at its boundary. Messages name the offending thing (key, plugin, distribution, config key)
and say how to fix it; plugin errors also carry structured attributes for programmatic use.
"""

from __future__ import annotations

__all__ = [
    "KVOffloadError",
    "ConfigError",
    "ManagerError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "KeyStateError",
    "ConcurrentUseError",
    "PluginError",
    "PluginNotFoundError",
    "PluginImportError",
    "PluginConflictError",
    "PluginTypeError",
    "DuplicateRegistrationError",
    "PluginValidationError",
    "PluginSettingsError",
    "HookError",
]


class KVOffloadError(Exception):
    """Base class of every error raised by kv-offload on purpose."""


class ConfigError(KVOffloadError, ValueError):
    """A configuration value is missing, malformed or out of range.

    ``key`` names the config key at fault as the message does (``num_blocks``,
    ``hooks.enable``, ``tiers[0].capacity_blocks``; a tier's own check names just its
    argument, ``capacity_blocks``), or is ``None`` when no single key is; locations
    (``file:line``) are found from it, never from the message.
    """

    def __init__(self, message: str, *, key: str | None = None, **kwargs: str) -> None:
        super().__init__(message, **kwargs)  # PluginSettingsError passes kind= and plugin=
        self.key = key


class ManagerError(KVOffloadError):
    """The manager API was misused; the manager's state is unchanged."""


class InvalidArgumentError(ManagerError, ValueError):
    """An argument is malformed (duplicate keys, a context without ``req_id``, ...)."""


class InvalidKeyError(InvalidArgumentError, TypeError):
    """A value cannot be used as an offload key (keys are ``bytes``: a str, unhashable, ...)."""


class KeyStateError(ManagerError):
    """An operation does not fit the current state of a block (missing, pending, unpinned)."""

    def __init__(self, message: str, *, key: object = None, operation: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.operation = operation


class ConcurrentUseError(ManagerError):
    """A manager was entered while a call of it was still running: from another thread (two
    threads drive one manager: use one thread, or ``kv_offload.synchronized(manager)``), or
    from a hook plugin on the same thread (``reentrant``). Raised before anything changed.

    ``method`` is the refused method, ``manager`` the manager's class name; ``owner`` the
    class name of the manager it was handed over to, its only caller (a CPU manager inside a
    tiered stack), if any.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str = "",
        manager: str = "",
        reentrant: bool = False,
        owner: str = "",
    ) -> None:
        super().__init__(message)
        self.method = method
        self.manager = manager
        #: Whether the running call is on the same thread (a hook called the manager back).
        self.reentrant = reentrant
        self.owner = owner


class PluginError(KVOffloadError):
    """A policy, tier or hook plugin could not be resolved or loaded."""

    def __init__(self, message: str, *, kind: str = "", plugin: str = "") -> None:
        super().__init__(message)
        #: ``"policy"``, ``"tier"`` or ``"hook"``.
        self.kind = kind
        #: The plugin name as the user wrote it in config.
        self.plugin = plugin


class PluginNotFoundError(PluginError, LookupError):
    """No plugin of that name is registered, installed or importable via ``module_path``."""


class PluginImportError(PluginError, ImportError):
    """A plugin was found but importing it failed; the cause is chained."""


class PluginConflictError(PluginError):
    """Two installed distributions advertise the same plugin name."""


class PluginTypeError(PluginError, TypeError):
    """A plugin resolved to an object that is not a subclass of the expected base class."""


class DuplicateRegistrationError(PluginError):
    """A plugin name was registered twice at runtime."""


class PluginValidationError(PluginError):
    """A hook plugin implements an unknown hook or takes arguments its hook does not have."""


class PluginSettingsError(ConfigError, PluginError):
    """A hook plugin rejected its ``[hooks.<name>]`` settings (or takes none); ``plugin``
    names it. Config validation reports it located at the setting, ``file:line``."""


class HookError(PluginError):
    """A hook plugin raised. For event hooks the manager call had already taken effect (and
    ``result`` holds what it returned, e.g. the ``PrepareStoreOutput`` whose slots the caller
    must still complete); for decision hooks it had not started. ``plugin`` names the
    culprit; the cause is chained."""

    result: object = None
