"""Admission policies: which of the blocks offered to a tier that tier writes.

Every block the CPU tier stores is, by default, also written to every secondary tier
(write-through). Most of those blocks are never read back: on a disk that is endurance and
bandwidth spent for nothing, on a shared Redis memory and network. An admission policy is
asked, for each batch of blocks offered to one tier, which of them to write; the others are
not written there (they stay wherever they already are). It is a plugin kind like policies
and tiers:

* entry-point group ``kv_offload.admission``; a config names one per tier with
  ``admission = "NAME"`` (and ``admission_options = {...}``), and for the CPU tier at the top
  level. ``module_path`` is the out-of-tree fallback, as for every kind.
* ``store-threshold`` is the core's own: vLLM's ``store_threshold`` (a block is stored from
  its n-th offer on). ``store_threshold = n`` in a config is that admission for the CPU tier.
* ``kv-offload-admission`` ships ``always``, ``seen-before``, ``tinylfu`` and more.

The contract, checked on every call because an admission is a plugin:

* :meth:`AdmissionPolicy.admit` returns one ``bool`` per offered key, in order. An answer
  that raises, is not a list/tuple of that length, or holds something that is not a ``bool``
  is a :class:`~kv_offload.errors.PluginError` naming the plugin; none of that call's blocks
  is admitted, and nothing already stored is touched (a refused block is a block not written
  to that tier, never a block lost).
* Every other method is an optional observation; the manager calls only the ones a plugin
  overrides, so an admission that only needs ``admit`` costs one call per offered batch.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .errors import ConfigError, PluginError, PluginNotFoundError
from .keys import OffloadKey
from .plugins.construct import construct, named_instance
from .plugins.registry import PluginRegistry
from .types import ReqContext

#: The admission author's API (docs/plugin-guide.md, "Plugin-author API"); the rest of this
#: module (the registry, the config-key handling) serves the core.
__all__ = [
    "ADMISSION_ENTRY_POINT_GROUP",
    "AdmissionPolicy",
    "StoreThreshold",
    "build_admission",
    "checked_admit",
]

ADMISSION_ENTRY_POINT_GROUP = "kv_offload.admission"


class AdmissionPolicy:
    """Decides which offered blocks one tier writes.

    One instance serves one tier of one stack (never shared between tiers), so it may keep
    state about that tier: a shadow of what the tier holds, access counts, a request history.
    Settings arrive as keyword arguments to ``__init__`` (from ``admission_options``); reject
    unknown ones with :class:`~kv_offload.errors.ConfigError`. ``capacity_blocks`` is the
    tier's capacity in blocks when the stack knows it (the CPU tier's ``num_blocks``, a
    secondary tier's declared capacity), else ``None``.
    """

    #: The name it was configured by (set by :func:`build_admission`), for errors and stats.
    plugin_name: str = ""

    def __init__(self, *, capacity_blocks: int | None = None) -> None:
        self.capacity_blocks = capacity_blocks

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        """One ``bool`` per key of ``keys`` (the blocks offered to this tier by one call, in
        order): ``True`` writes the block to the tier.

        For the CPU tier, ``keys`` are a ``prepare_store``'s keys, including keys the tier
        holds already (their answers are ignored: an offer of a held key still counts for
        policies that count offers, as vLLM's ``store_threshold`` does). For a secondary
        tier, they are the blocks being cascaded: under write-through those of a
        ``complete_store``, under write-back those the CPU tier is evicting, and
        ``req_context`` is then the request whose store evicted them.
        """
        raise NotImplementedError

    def record_lookup(self, key: OffloadKey, req_context: ReqContext) -> None:
        """A request looked ``key`` up at the stack (any answer). Called once per lookup, in
        the request's prefix order; a request's lookups stop at its first miss."""

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request ended: drop per-request state."""

    def describe(self) -> str:
        """One line for reports and ``kv-offload validate``."""
        return type(self).__name__


def overrides(admission: AdmissionPolicy, method: str) -> Callable[..., Any] | None:
    """``admission``'s bound ``method`` if its class overrides the base class's no-op, else
    ``None`` (the manager then never calls it)."""
    if getattr(type(admission), method) is getattr(AdmissionPolicy, method):
        return None
    bound: Callable[..., Any] = getattr(admission, method)
    return bound


def checked_admit(
    admission: AdmissionPolicy,
    name: str,
    keys: Sequence[OffloadKey],
    req_context: ReqContext,
) -> list[OffloadKey]:
    """The keys of ``keys`` that ``admission`` admits, in order; a broken answer (it raised,
    or is not one ``bool`` per key) is a :class:`~kv_offload.errors.PluginError` naming the
    plugin, raised before anything is admitted."""
    try:
        answer: Any = admission.admit(keys, req_context)
    except Exception as exc:
        raise PluginError(
            f"admission {name!r} raised {type(exc).__name__}: {exc}; none of the "
            f"{len(keys)} offered block(s) was admitted. Fix the plugin's admit()",
            kind="admission",
            plugin=name,
        ) from exc
    if type(answer) not in (list, tuple) or len(answer) != len(keys):
        got = (
            f"{type(answer).__name__} of {len(answer)}"
            if isinstance(answer, (list, tuple))
            else f"{type(answer).__name__} {answer!r:.80}"
        )
        raise PluginError(
            f"admission {name!r} broke the admit() contract: expected a list of "
            f"{len(keys)} bools (one per offered key), got {got}; none of the offered "
            f"blocks was admitted. Fix the plugin's admit()",
            kind="admission",
            plugin=name,
        )
    admitted = []
    for key, verdict in zip(keys, answer):
        if verdict is True:
            admitted.append(key)
        elif verdict is not False:
            raise PluginError(
                f"admission {name!r} broke the admit() contract: it answered "
                f"{type(verdict).__name__} {verdict!r:.80} for a key; the answer must be "
                f"True or False per key. None of the offered blocks was admitted. Fix the "
                f"plugin's admit()",
                kind="admission",
                plugin=name,
            )
    return admitted


#: vLLM's default size of the offer table (keys).
DEFAULT_MAX_TRACKER_SIZE = 64_000


def _int_option(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


class StoreThreshold(AdmissionPolicy):
    """vLLM 0.33's ``store_threshold``: a block is admitted from its ``threshold``-th offer on.

    An offer is the block's key in one offered batch, admitted or held already. Offers are
    counted per key in an LRU-ordered table of at most ``max_tracker_size`` keys: the least
    recently offered key is forgotten first, but never a key of the batch being counted (a
    batch larger than the table tracks what fits and leaves the rest uncounted, so they are
    not admitted by that batch). The counts describe how often the engine offered a prefix,
    not what the cache holds, so resetting the cache keeps them (vLLM too).
    """

    def __init__(
        self,
        *,
        threshold: int = 2,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(capacity_blocks=capacity_blocks)
        self.threshold = _int_option("store-threshold option threshold", threshold, 1)
        self.max_size = _int_option("store-threshold option max_tracker_size", max_tracker_size, 1)
        #: key -> offers counted, least recently offered first.
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    def admit(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[bool]:
        counts = self.counts
        current = 0  # keys of this batch already tracked: moved to the end, so never dropped
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts[key] = count + 1
                counts.move_to_end(key)
                current += 1
        droppable = len(counts) - current
        room = self.max_size - len(counts)
        for key in keys:
            if key in counts:
                continue
            if room <= 0:
                if not droppable:
                    continue  # the table holds only this batch's keys: leave this one out
                counts.popitem(last=False)
                droppable -= 1
            else:
                room -= 1
            counts[key] = 1
        threshold = self.threshold
        return [counts.get(key, 0) >= threshold for key in keys]

    def count(self, key: OffloadKey) -> int:
        """How many offers of ``key`` are counted (0 if it is not tracked)."""
        return self.counts.get(key, 0)

    def __len__(self) -> int:
        return len(self.counts)

    def describe(self) -> str:
        return f"store-threshold (from the {self.threshold}th offer on)"


admission_registry: PluginRegistry[AdmissionPolicy] = PluginRegistry(
    "admission",
    ADMISSION_ENTRY_POINT_GROUP,
    AdmissionPolicy,
    '"admission_module_path"',
)


def _check_options(who: str, cls: type, options: dict[str, Any]) -> None:
    """Options the admission's constructor does not take are a config error, found before it
    is called (a ``TypeError`` from inside it is the plugin's own bug)."""
    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        takes = sorted(set(parameters) - {"capacity_blocks"})
        raise ConfigError(
            f"{who} does not take the options {unknown}; it takes: "
            f"{', '.join(takes) or 'no options'} (see the plugin's documentation)",
            key="admission_options",
        )


def build_admission(
    name: str,
    options: dict[str, Any] | None = None,
    module_path: str | None = None,
    *,
    capacity_blocks: int | None = None,
    where: str = "",
) -> AdmissionPolicy:
    """The admission called ``name`` (installed, or from ``module_path``) built with
    ``options``; a bad option is a :class:`~kv_offload.errors.ConfigError` naming the
    admission and ``where`` it is configured (``"tier 'fs'"``, ``"the CPU tier"``)."""
    cls = admission_registry.resolve(name, module_path)
    place = f"for {where}" if where else ""
    who = f"admission {name!r} {place}".rstrip()
    _check_options(who, cls, options or {})
    try:
        admission = construct(
            "admission", name, cls, where=place, **(options or {}), capacity_blocks=capacity_blocks
        )
    except ConfigError as exc:  # the plugin's own check of an option: say whose it is
        raise ConfigError(f"{who}: {exc}", key=exc.key) from exc
    return named_instance(
        "admission", name, admission, AdmissionPolicy, "kv_offload.admission.AdmissionPolicy", who
    )


def check_admission_keys(where: str, name: Any, options: Any) -> None:
    """The ``admission`` and ``admission_options`` keys' own rules (``where`` begins the
    message: ``"tier 'fs'"``, ``"the CPU tier"``)."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigError(
            f"{where}: admission must be an admission plugin name, got {name!r}", key="admission"
        )
    if options is not None and not isinstance(options, dict):
        raise ConfigError(
            f"{where}: admission_options must be a table of the admission's settings, "
            f"got {options!r}",
            key="admission_options",
        )
    if options and name is None:
        raise ConfigError(
            f"{where}: admission_options without admission; name the admission plugin "
            f'(admission = "NAME")',
            key="admission_options",
        )


def configured_admission(
    name: Any,
    options: Any,
    module_path: Any,
    *,
    capacity_blocks: int | None,
    where: str,
) -> AdmissionPolicy:
    """The admission a config's ``admission``, ``admission_options`` and
    ``admission_module_path`` keys name, for ``where`` (``"tier 'fs'"``, ``"the CPU tier"``).

    One place turns those keys into a plugin for every tier, so the CPU tier and the
    secondary tiers reject the same mistakes with the same words: every error is a
    :class:`~kv_offload.errors.ConfigError` whose ``key`` is the key to fix (an unknown name
    comes with the closest installed names).
    """
    from .config.locate import did_you_mean  # the config package imports this module

    check_admission_keys(where, name, options)
    if name is None:
        raise ConfigError(f"{where}: no admission named", key="admission")
    try:
        return build_admission(
            name, options, module_path, capacity_blocks=capacity_blocks, where=where
        )
    except ConfigError as exc:
        if exc.key is None:
            exc.key = "admission_options" if options else "admission"
        raise
    except PluginError as exc:
        message = str(exc)
        if isinstance(exc, PluginNotFoundError):
            known = {info.name for info in admission_registry.available()}
            message += did_you_mean(name, known)
        key = "admission_module_path" if module_path is not None else "admission"
        raise ConfigError(message, key=key) from exc
