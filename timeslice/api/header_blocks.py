"""HPACK header blocks (RFC 7541) as both ends of our HTTP/2 connections write and
read them.

What either end sends is encoded without the dynamic table: each field a literal
"without indexing" with a literal name (":status: 200" indexed), so that every
constant block is the same bytes on every connection and costs nothing to build.

What either end receives is read by `BlockReader`. A block of that plain kind,
which is what our own clients and servers send, touches no decoder state: it is
read here in one pass, at a fraction of `hpack`'s cost (a call's request headers
were about 20 us of a server's CPU through `hpack`, some 5% of an acquire/yield
cycle, and the answer's two blocks a few more in the client). Every other block
(one that uses or changes the dynamic table, Huffman-coded strings, integers past
four bytes, anything malformed or over the size limit) goes to `hpack`'s decoder
whole, which keeps the dynamic table, and whose errors are the connection's; read
here, a plain block comes back exactly as `hpack` would return it.
"""

from __future__ import annotations

from typing import cast

import hpack
from hpack.table import HeaderTable

Headers = list[tuple[str, str]]

# RFC 7541 appendix A, by index - 1.
_STATIC: tuple[tuple[str, str], ...] = tuple(
    (name.decode(), value.decode()) for name, value in HeaderTable.STATIC_TABLE
)
# What each field costs against the header list's limit besides its name and
# value (RFC 7541 4.1, as `hpack` counts it).
_ENTRY_OVERHEAD = 32
# Continuation bytes read in one integer; more and the block goes to `hpack`.
_MAX_CONTINUATIONS = 4


# --- writing -----------------------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte starts with `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value


def header_block(headers: Headers) -> bytes:
    """`headers` as an HPACK block that uses no dynamic table: each field a literal
    "without indexing" with a literal name, except ":status: 200", indexed (the
    static table's 8th entry)."""
    out = bytearray()
    for name, value in headers:
        if name == ":status" and value == "200":
            out.append(0x88)
            continue
        out.append(0x00)
        out += _string(name.encode("ascii"))
        out += _string(value.encode("utf-8"))
    return bytes(out)


# --- reading -----------------------------------------------------------------------------


class BlockReader:
    """Reads the header blocks of one connection (whose dynamic table it keeps)."""

    def __init__(self, max_header_list_size: int, max_table_size: int) -> None:
        self._limit = max_header_list_size
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._decoder.max_allowed_table_size = max_table_size

    def read(self, block: bytes) -> Headers:
        """`block`'s fields, names and values as text; raises `hpack`'s
        `HPACKError` for a block it refuses."""
        plain = read_plain(block, self._limit)
        if plain is not None:
            return plain
        return cast(Headers, self._decoder.decode(block, raw=False))


def read_plain(block: bytes, limit: int) -> Headers | None:
    """`block`'s fields when it is plain: every field indexed in the static table,
    or a literal not indexed (or never indexed) whose name is indexed there or
    literal, every string raw UTF-8, the list within `limit` (counted as `hpack`
    counts it). None for any other block, which `hpack` must read."""
    fields: Headers = []
    size, at, end = 0, 0, len(block)
    while at < end:
        first = block[at]
        if first & 0x80:  # an indexed field
            index, at = _read_integer(block, at, 7)
            if not 0 < index <= len(_STATIC):
                return None
            name, value = _STATIC[index - 1]
            name_len, value_len = len(name), len(value)  # the static table is ASCII
        elif first & 0xE0 == 0:  # a literal, not indexed (0000) or never indexed (0001)
            if first & 0x0F < 0x0F:  # the usual: its name's index (0: none) in the byte
                index, at = first & 0x0F, at + 1
            else:
                index, at = _read_integer(block, at, 4)
                if index < 0 or index > len(_STATIC):
                    return None
            if index:
                name = _STATIC[index - 1][0]
                name_len = len(name)
            else:
                raw, at = _read_raw(block, at, end)
                if raw is None or (text := _text(raw)) is None:
                    return None
                name, name_len = text, len(raw)
            raw, at = _read_raw(block, at, end)
            if raw is None or (text := _text(raw)) is None:
                return None
            value, value_len = text, len(raw)
        else:  # it changes the dynamic table (a field to index, a size update)
            return None
        size += _ENTRY_OVERHEAD + name_len + value_len
        if size > limit:
            return None  # `hpack` refuses it, with its own error
        fields.append((name, value))
    return fields


def _read_integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at `block[at]` with a `prefix_bits` prefix, and where it ends;
    -1 for one that is cut short or longer than `_MAX_CONTINUATIONS` bytes."""
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    for shift in range(0, 7 * _MAX_CONTINUATIONS, 7):
        if at >= len(block):
            return -1, at
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    return -1, at


def _read_raw(block: bytes, at: int, end: int) -> tuple[bytes | None, int]:
    """The string at `block[at]` when it is raw (not Huffman-coded) and whole."""
    if at >= end:
        return None, at
    length = block[at]
    if length < 0x7F:  # the usual: a short raw string, its length in one byte
        at += 1
    elif length & 0x80:  # Huffman-coded
        return None, at
    else:
        length, at = _read_integer(block, at, 7)
        if length < 0:
            return None, at
    if at + length > end:
        return None, at
    return block[at : at + length], at + length


def _text(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
