"""``layout.verify`` checks a block as this tier writes it in one comparison (its header page
rebuilt and compared whole); the field by field checks are the reference it is held to: it
accepts the page :func:`layout.pack_header` writes and refuses every one-byte change of it,
each with the reason the field checks give."""

from __future__ import annotations

import os

import pytest
from kv_offload_fs_tier import layout

BLOCK = 8192
KEY = bytes(range(1, 13))


def written_page(row: bytes) -> bytearray:
    """The header page as the store writes it (``pack_header``'s buffers, joined)."""
    parts = layout.pack_header(KEY, BLOCK, layout.checksum(memoryview(row)))
    return bytearray(b"".join(bytes(p) for p in parts))


def test_the_page_a_store_writes_verifies() -> None:
    row = os.urandom(BLOCK)
    page = written_page(row)
    assert len(page) == layout.HEADER_SPACE
    assert layout.verify(page, KEY, BLOCK, layout.HEADER_SPACE + BLOCK, memoryview(row)) is None


@pytest.mark.parametrize(
    "offset", [*range(layout.HEADER.size + len(KEY) + 8), 100, 2048, layout.HEADER_SPACE - 1]
)
def test_a_changed_header_byte_is_refused(offset: int) -> None:
    row = os.urandom(BLOCK)
    page = written_page(row)
    page[offset] ^= 0x01
    problem = layout.verify(page, KEY, BLOCK, layout.HEADER_SPACE + BLOCK, memoryview(row))
    assert problem is not None
    assert problem[0] in {
        "foreign",
        "version",
        "header",
        "signed",
        "block_size",
        "wrong_key",
        "checksum",
    }


def test_a_changed_payload_byte_is_a_checksum_mismatch() -> None:
    row = bytearray(os.urandom(BLOCK))
    page = written_page(bytes(row))
    row[BLOCK // 2] ^= 0x80
    problem = layout.verify(page, KEY, BLOCK, layout.HEADER_SPACE + BLOCK, memoryview(row))
    assert problem == ("checksum", "checksum mismatch")


def test_a_short_or_long_read_is_named_before_any_comparison() -> None:
    row = os.urandom(BLOCK)
    page = written_page(row)
    short = layout.verify(page, KEY, BLOCK, layout.HEADER_SPACE + BLOCK - 1, memoryview(row))
    long = layout.verify(page, KEY, BLOCK, layout.HEADER_SPACE + BLOCK + 1, memoryview(row))
    assert short is not None and short[0] == "truncated"
    assert long is not None and long[0] == "too_long"
