"""Input checks and error diagnosis of the CPU manager: the slow path.

The manager's fast path only asks yes-or-no questions of a batch (is every block readable?).
When the answer is no, the functions here find the first offending key and build the error
that names it and says what to do, so the diagnosis costs nothing when calls are valid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    InvalidArgumentError,
    InvalidKeyError,
    KeyStateError,
    KVOffloadError,
    ManagerError,
    PluginError,
)
from ..keys import OffloadKey, all_offload_keys, is_offload_key
from .slots import SlotTable, not_pending, not_pinned, not_readable

__all__ = [
    "admitted",
    "as_list",
    "as_pairs",
    "bad_batch",
    "check_context",
    "describe_victims",
    "key_state_error",
    "malformed_keys",
    "not_pinned_error",
    "not_readable_error",
    "short",
    "storable_error",
]


def short(key: object) -> str:
    """``repr(key)``, cut to fit in an error message."""
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def check_context(req_context: Any, operation: str) -> None:
    """Raise unless ``req_context`` is a context with a ``req_id``."""
    if getattr(req_context, "req_id", None) is None:
        raise InvalidArgumentError(
            f"{operation}: req_context must be a ReqContext with a req_id, got "
            f"{short(req_context)}; pass ReqContext(req_id=...)"
        )


def as_list(keys: Any, operation: str) -> list[Any]:
    """A batch of keys as a list; a single key or a non-iterable is a caller's mistake."""
    if type(keys) is list:
        return keys
    if isinstance(keys, (bytes, bytearray, str)):
        raise InvalidArgumentError(
            f"{operation}: keys must be a collection of offload keys, got a single "
            f"{type(keys).__name__} {short(keys)}; pass [key]"
        )
    try:
        return list(keys)
    except TypeError:
        raise InvalidArgumentError(
            f"{operation}: keys must be a collection of offload keys, got "
            f"{type(keys).__name__} {short(keys)}"
        ) from None


def key_error(key: object, operation: str) -> InvalidKeyError | None:
    """The error for ``key`` if it is not an offload key (:func:`kv_offload.keys.
    is_offload_key`), else ``None``. The fast paths ask ``type(key) is bytes`` or
    :func:`all_keys` and come here when that fails (a ``bytes`` subclass passes here)."""
    if is_offload_key(key):
        return None
    return InvalidKeyError(
        f"{operation}: key {short(key)} is a {type(key).__name__}; offload keys are bytes "
        f"(see kv_offload.make_offload_key); nothing was changed"
    )


def check_key(key: object, operation: str) -> None:
    """Raise :func:`key_error`'s error for a value that is not an offload key."""
    error = key_error(key, operation)
    if error is not None:
        raise error


all_keys = all_offload_keys


def check_keys(key_list: list[Any], operation: str) -> None:
    """Raise for the first item of ``key_list`` that is not an offload key."""
    if not all_keys(key_list):
        for key in key_list:
            check_key(key, operation)


def malformed_keys(key_list: Sequence[Any], operation: str) -> InvalidArgumentError | None:
    """The error for a batch holding a value that is not a key, or a repeated key, else
    ``None``."""
    seen: set[Any] = set()
    for key in key_list:
        error = key_error(key, operation)
        if error is not None:
            return error
        if key in seen:
            return InvalidArgumentError(
                f"{operation}: key {short(key)} appears more than once in one call; "
                f"pass each key once"
            )
        seen.add(key)
    return None


def handed_over_twice(manager: object, owner: object, second: object) -> InvalidArgumentError:
    """``hand_over`` of a manager that already has an ``owner``: one owner per manager."""
    cls, first, second = type(manager).__name__, type(owner).__name__, type(second).__name__
    return InvalidArgumentError(
        f"this {cls} was already handed over to a {first}; it cannot also serve a {second}: "
        f"build one {cls} per stack"
    )


def key_state_error(
    operation: str,
    key_list: Sequence[OffloadKey],
    counts: Sequence[int | None],
    wrong: Callable[[int | None], bool],
    advice: str,
) -> KeyStateError:
    """Name the first key whose ref count (``None``: not resident) ``wrong`` rejects."""
    for key, count in zip(key_list, counts):
        if wrong(count):
            state = {
                None: "not in the CPU cache",
                -1: "pending (its store is in flight)",
                0: "idle (not pinned)",
            }.get(count, f"pinned {count} time(s)")
            return KeyStateError(
                f"{operation}: key {short(key)} is {state}; {advice}", key=key, operation=operation
            )
    raise RuntimeError(f"{operation}: no key is in a wrong state")  # pragma: no cover


def not_readable_error(
    operation: str, key_list: Sequence[OffloadKey], counts: Sequence[int | None]
) -> InvalidArgumentError | KeyStateError:
    """Why ``pin`` (or ``prepare_load``) refused a batch: a value that is not a key, or a key
    not readable now."""
    advice = "load only keys that lookup() answered HIT"
    return malformed_keys(key_list, operation) or key_state_error(
        operation, key_list, counts, not_readable, advice
    )


def not_pinned_error(
    operation: str, key_list: Sequence[OffloadKey], counts: Sequence[int | None]
) -> InvalidArgumentError | KeyStateError:
    """Why ``unpin`` (or ``complete_load``) refused a batch: a value that is not a key, or a
    key nobody pinned."""
    pinner = "prepare_load" if operation == "complete_load" else "pin"
    advice = f"call {operation} only for keys pinned by {pinner}"
    return malformed_keys(key_list, operation) or key_state_error(
        operation, key_list, counts, not_pinned, advice
    )


def storable_error(
    key_list: Sequence[OffloadKey],
    counts: Sequence[int | None],
    slots: SlotTable,
    policy_name: str,
) -> InvalidArgumentError | KeyStateError | PluginError:
    """Why ``complete_store`` refused a batch: a repeated key; a key the policy lost (its slot
    is pending, allocated to that key by ``prepare_store``, but the policy's ``get()`` does
    not find it: its ``insert()`` did not keep the block); or a key not pending."""
    malformed = malformed_keys(key_list, "complete_store")
    if malformed is not None:
        return malformed
    for key, count in zip(key_list, counts):
        if count is None and (slot := slots.pending_slot_of(key)) is not None:
            return PluginError(
                f"complete_store: policy {policy_name!r} broke the insert() contract: "
                f"prepare_store gave key {short(key)} slot {slot} and inserted it, but the "
                f"policy's get() no longer finds it (its insert() did not keep the block); "
                f"fix the policy's insert() (or insert_many()). The slot stays pending: call "
                f"reset_cache() or build a new manager",
                kind="policy",
                plugin=policy_name,
            )
    return key_state_error(
        "complete_store",
        key_list,
        counts,
        not_pending,
        "it was never prepared for storing: pass the keys_to_store of prepare_store",
    )


def as_pairs(answer: Any) -> Any:
    """An ``evict_split`` answer as ``evict()``'s pairs, for messages (as it is if it is not
    two sequences)."""
    try:
        keys, blocks = answer
        return list(zip(keys, blocks))
    except (TypeError, ValueError):
        return answer


def describe_victims(
    victims: Any, ref_count: Callable[[int], int], owners: list[Any] | None = None
) -> str:
    """What a policy's broken ``evict()`` returned, with each block's ref count if possible,
    and (given the slot table's ``owners``) the first victim named twice, or named with a
    slot that is not its own."""
    try:
        pairs = list(victims)
        shown = [(key, ref_count(block)) for key, block in pairs[:5]]
        text = f"(key, ref_cnt) {short(shown)} ({len(pairs)} in all)"
    except Exception:
        return short(victims)
    if owners is None:
        return text
    seen: set[Any] = set()
    for key, block in pairs:
        try:
            if block in seen:
                return f"{text}: slot {int(block)} is named twice"
            seen.add(block)
            owner = owners[block] if 0 <= block < len(owners) else None
        except TypeError:
            return text
        if owner is None:
            return f"{text}: slot {short(block)} holds no block"
        if owner != key:
            return f"{text}: key {short(key)} is not the key of slot {int(block)} (not one it held)"
    return text


def bad_batch(
    key_list: Sequence[Any],
    operation: str,
    error: BaseException | None = None,
    policy_name: str = "",
) -> KVOffloadError:
    """The error for a batch whose lookup raised ``error`` (or that a set refused): a value
    that is not a key, or a repeated key; failing those, the policy's ``get()`` broke.
    """
    malformed = malformed_keys(key_list, operation)
    if malformed is not None:
        return malformed
    if error is None:  # pragma: no cover - a set refused keys malformed_keys accepts
        return InvalidKeyError(f"{operation}: the keys could not be looked up")
    return PluginError(
        f"{operation}: policy {policy_name!r} broke the get() contract: it raised "
        f"{type(error).__name__}: {error} for a valid key; get(key) must return the key's "
        f"BlockStatus or None. Fix the policy's get() (or fast_get())",
        kind="policy",
        plugin=policy_name,
    )


def admitted(answer: Any, to_store: list[OffloadKey]) -> list[OffloadKey]:
    """The keys a store-admission hook's ``answer`` (``None``, or keys: checked by the
    hook's dispatch, :mod:`kv_offload.plugins.dispatch`) lets in, in the caller's order."""
    if answer is None:
        return to_store
    allowed = set(answer)
    return [key for key in to_store if key in allowed]


def closed_error(operation: str) -> ManagerError:
    """A call on a manager after ``shutdown()``: its cache is gone, answers would be lies."""
    return ManagerError(f"{operation}: the manager was shut down; create a new one")


def protected_set(key_set: set[Any], protected: Any) -> set[Any]:
    """``key_set`` plus the ``protected`` keys; a ``protected`` that is not a collection of
    keys (``protected=5``) is an :class:`InvalidArgumentError`, raised before any change."""
    if isinstance(protected, (str, bytes)) or not hasattr(protected, "__iter__"):
        raise InvalidArgumentError(
            f"prepare_store: protected must be a collection of keys, got "
            f"{type(protected).__name__} {protected!r}; pass protected=[key, ...]"
        )
    try:
        return key_set.union(protected)
    except TypeError:
        raise InvalidKeyError(
            f"prepare_store: protected holds an unhashable key ({protected!r}); "
            f"keys are bytes from make_offload_key"
        ) from None


def check_success(success: Any) -> None:
    """``complete_store``'s ``success`` must be a bool: ``"no"`` is truthy, and would make a
    failed transfer's garbage loadable."""
    if type(success) is not bool:
        raise InvalidArgumentError(
            f"complete_store: success must be True or False, got {type(success).__name__} "
            f"{success!r}"
        )
