"""Header blocks: what our ends write, and read back exactly as `hpack` reads them."""

from __future__ import annotations

import hpack
import pytest
from hpack.exceptions import HPACKError, OversizedHeaderListError
from hypothesis import given, settings
from hypothesis import strategies as st

from timeslice.api.header_blocks import BlockReader, header_block, read_plain

LIMIT = 16 * 1024
TABLE = 4096

names = st.text(st.characters(codec="ascii", exclude_characters=":"), max_size=40).map(str.lower)
values = st.text(max_size=300)  # past 127 bytes: lengths of several bytes
header_lists = st.lists(st.tuples(names, values), max_size=12)


def reference(block: bytes, limit: int = LIMIT) -> list[tuple[str, str]]:
    """What `hpack` alone makes of `block` on a new connection."""
    return list(hpack.Decoder(max_header_list_size=limit).decode(block, raw=False))


@settings(max_examples=300, deadline=None)
@given(header_lists)
def test_our_blocks_are_read_in_one_pass_as_hpack_reads_them(headers: list) -> None:
    block = header_block(headers)
    assert read_plain(block, LIMIT) == reference(block) == headers
    assert BlockReader(LIMIT, TABLE).read(block) == headers


def test_static_names_and_never_indexed_fields_are_plain_too() -> None:
    # :path by its static index (4), "user-agent" by its (58: an index past the
    # 4-bit prefix), never indexed (0x10), and an indexed ":method: POST" (3).
    block = b"\x83" + b"\x04\x0b/pkg.S/Call" + b"\x1f\x2b\x05agent" + b"\x10\x02te\x08trailers"
    expected = [
        (":method", "POST"),
        (":path", "/pkg.S/Call"),
        ("user-agent", "agent"),
        ("te", "trailers"),
    ]
    assert read_plain(block, LIMIT) == reference(block) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(header_lists, min_size=1, max_size=6), st.booleans())
def test_blocks_that_use_the_dynamic_table_are_read_by_hpack(lists: list, huffman: bool) -> None:
    """Blocks of an encoder that indexes (as h2's and grpclib's do), between plain
    ones: left to `hpack`, whose table follows every block of the connection."""
    encoder = hpack.Encoder()
    reader = BlockReader(LIMIT, TABLE)
    for headers in lists:
        block = encoder.encode(headers, huffman=huffman)
        assert reader.read(block) == headers
        plain = header_block(headers)
        assert reader.read(plain) == headers


def test_what_the_plain_pass_leaves_to_hpack() -> None:
    encoder = hpack.Encoder()
    indexing = encoder.encode([("x-name", "value")], huffman=False)  # 0x40: to be indexed
    assert read_plain(indexing, LIMIT) is None
    assert read_plain(encoder.encode([("x-name", "value")]), LIMIT) is None  # by the table
    assert read_plain(hpack.Encoder().encode([("x-name", "value")], huffman=True), LIMIT) is None
    assert read_plain(b"\x3f\xe1\x1f", LIMIT) is None  # a table size update
    assert read_plain(b"\x80", LIMIT) is None  # index 0
    assert read_plain(b"\xbe", LIMIT) is None  # 62: the dynamic table's first entry


@pytest.mark.parametrize(
    "block",
    [
        b"\x00\x05abc",  # a name cut short
        b"\x00\x01a\x05ab",  # a value cut short
        b"\x00\x01a",  # no value
        b"\x00\x01a\x7f",  # a length whose continuation is missing
        b"\x00\x01a\x01\xff",  # not UTF-8
        b"\x80",  # index 0
        b"\xbe",  # an index past an empty table
        b"\x00\x7f\xff\xff\xff\xff\xff\x7f",  # a length too long to be read
    ],
)
def test_malformed_blocks_get_hpacks_refusal(block: bytes) -> None:
    with pytest.raises(HPACKError):
        reference(block)
    with pytest.raises(HPACKError):
        BlockReader(LIMIT, TABLE).read(block)


def test_a_list_over_the_limit_is_refused_as_hpack_refuses_it() -> None:
    headers = [("x-a", "v" * 100), ("x-b", "v" * 100)]
    block = header_block(headers)
    size = sum(32 + len(n) + len(v) for n, v in headers)
    assert BlockReader(size, TABLE).read(block) == headers  # at the limit: taken
    with pytest.raises(OversizedHeaderListError):
        BlockReader(size - 1, TABLE).read(block)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_read_as_hpack_reads_them(block: bytes) -> None:
    """Whatever a peer sends, the reader answers what `hpack` answers: the same
    fields, or an `HPACKError`."""
    try:
        expected = reference(block, 256)
    except HPACKError:
        with pytest.raises(HPACKError):
            BlockReader(256, TABLE).read(block)
    else:
        assert BlockReader(256, TABLE).read(block) == expected
