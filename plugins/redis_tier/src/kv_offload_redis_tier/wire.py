"""Sending block bytes to Redis without copying them.

Speed trick, guarded by ``benchmarks/redis_tier.py`` (cascade GB/s against a raw pipelined
``SET`` loop with the same client). redis-py packs commands either with hiredis (when it is
installed), which turns every argument into ``bytes`` and joins the whole command, i.e. two
copies of each 256 KiB row, or in Python, which passes large buffers through but needs one
contiguous value. :class:`ZeroCopyPacker` is a redis-py ``command_packer`` that also accepts a
:class:`Parts` argument: one RESP bulk string sent as several buffers (the value header and
the CPU buffer row), so the row goes from the CPU buffer to the socket with no copy in Python.
Everything else is packed as RESP2 like redis-py does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import ConnectionPool, Redis
from redis.exceptions import DataError

__all__ = ["Parts", "ZeroCopyPacker", "ZeroCopyPool", "exists_many"]

# Arguments larger than this go out as their own buffer instead of being joined.
_INLINE = 16 * 1024


class Parts:
    """One bulk-string argument made of several buffers, sent in order, never joined."""

    __slots__ = ("buffers", "nbytes")

    def __init__(self, *buffers: Any) -> None:
        self.buffers = [memoryview(b) for b in buffers]
        self.nbytes = sum(b.nbytes for b in self.buffers)


def _encode(arg: Any) -> bytes | memoryview:
    if isinstance(arg, (bytes, memoryview)):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bool):
        raise DataError("cannot send a bool to Redis; convert it to bytes, str or a number")
    if isinstance(arg, int):
        return b"%d" % arg
    if isinstance(arg, float):
        return repr(arg).encode()
    if isinstance(arg, (bytearray,)):
        return memoryview(arg)
    raise DataError(f"cannot send a {type(arg).__name__} to Redis")


class ZeroCopyPacker:
    """A redis-py command packer (``pack(*args) -> list of buffers``) aware of :class:`Parts`."""

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        first = args[0]
        if isinstance(first, str):
            first = first.encode()
        # Multi-word command names ("CLUSTER SLOTS") go out as separate arguments.
        words: tuple[Any, ...] = tuple(first.split()) if b" " in first else (first,)
        args = words + args[1:]
        out: list[bytes | memoryview] = []
        pending = bytearray(b"*%d\r\n" % len(args))
        for arg in args:
            if isinstance(arg, Parts):
                pending += b"$%d\r\n" % arg.nbytes
                out.append(bytes(pending))
                out.extend(arg.buffers)
                pending = bytearray(b"\r\n")
                continue
            data = _encode(arg)
            size = len(data) if isinstance(data, bytes) else data.nbytes
            if size > _INLINE or isinstance(data, memoryview):
                pending += b"$%d\r\n" % size
                out.append(bytes(pending))
                out.append(data)
                pending = bytearray(b"\r\n")
            else:
                pending += b"$%d\r\n" % size
                pending += data
                pending += b"\r\n"
        out.append(bytes(pending))
        return out


_PACKER = ZeroCopyPacker()


class ZeroCopyPool(ConnectionPool):
    """A connection pool whose connections pack commands with :class:`ZeroCopyPacker`
    (also given to ``RedisCluster(connection_pool_class=...)`` for every node)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", _PACKER)
        super().__init__(*args, **kwargs)


def exists_many(client: Redis, keys: Sequence[bytes]) -> list[bool]:
    """Whether each key exists, in one round trip: every ``EXISTS`` packed into one buffer,
    the replies read in order from one pooled connection.

    Speed trick, guarded by ``benchmarks/redis_tier.py`` (lookups/s): a redis-py pipeline
    spends most of its time per command in Python (queueing, packing, response callbacks);
    this measured 3-4x more keys/s on the same connection. An error mid-way drops the
    connection, so no half-read reply stream goes back to the pool.
    """
    payload = b"".join(b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys)
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        connection.send_packed_command([payload])  # type: ignore[no-untyped-call]
        replies = [connection.read_response() for _ in keys]
    except BaseException:
        connection.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(connection)
    return [reply == 1 for reply in replies]
