"""The packed `.indexes` format: round trips, section order, and detection of every kind of damage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsm.packed_index import (
    BROKER_READ_GROUP,
    CHUNKED_FORMAT_VERSION,
    FORMAT_VERSION,
    MAX_HEADER_SIZE,
    READ_GROUPS,
    SECTION_ORDER,
    PackedIndexCorruptError,
    SectionType,
    SegmentSection,
    extract,
    pack,
    parse_header,
)
from rsm.types import IndexType

FIVE = {
    IndexType.OFFSET: b"offsets" * 10,
    IndexType.TIMESTAMP: b"times" * 12,
    IndexType.TRANSACTION: b"aborted",
    IndexType.LEADER_EPOCH: b"0\n1\n0 0\n",
    IndexType.PRODUCER_SNAPSHOT: b"snapshot" * 3,
}


def test_header_read_back_gives_the_layout_pack_returned() -> None:
    packed, layout = pack(FIVE)
    assert parse_header(packed[:MAX_HEADER_SIZE], "t") == layout


def test_every_section_round_trips() -> None:
    packed, layout = pack(FIVE)
    assert extract(packed, 0, layout.sections, "t") == FIVE


@given(st.dictionaries(st.sampled_from(list(IndexType)), st.binary(max_size=300)))
def test_any_subset_of_indexes_round_trips(indexes: dict[IndexType, bytes]) -> None:
    packed, layout = pack(indexes)
    assert parse_header(packed, "t") == layout
    assert extract(packed, 0, layout.sections, "t") == indexes


def test_offset_timestamp_transaction_sections_are_contiguous_and_first() -> None:
    _, layout = pack(FIVE)
    group = layout.present(BROKER_READ_GROUP)
    start, end = layout.span(group)
    assert end - start == sum(s.length for s in group)
    assert [s.index_type for s in layout.sections] == [t for t in SECTION_ORDER if t in FIVE]
    assert start == layout.sections[0].position


def test_a_missing_transaction_index_has_no_section() -> None:
    without: dict[IndexType, bytes] = {t: b for t, b in FIVE.items() if t is not IndexType.TRANSACTION}
    _, layout = pack(without)
    assert layout.get(IndexType.TRANSACTION) is None


def test_a_section_can_be_extracted_from_a_ranged_read() -> None:
    packed, layout = pack(FIVE)
    section = layout.get(IndexType.TIMESTAMP)
    assert section is not None
    ranged = packed[section.position : section.end]
    assert extract(ranged, section.position, [section], "t") == {IndexType.TIMESTAMP: FIVE[IndexType.TIMESTAMP]}


def test_a_flipped_byte_in_a_section_fails_its_checksum() -> None:
    packed, layout = pack(FIVE)
    damaged = bytearray(packed)
    damaged[layout.sections[1].position] ^= 0xFF
    with pytest.raises(PackedIndexCorruptError, match="TIMESTAMP fails its checksum"):
        extract(bytes(damaged), 0, layout.sections, "t")


def test_a_flipped_byte_in_the_header_fails_the_header_checksum() -> None:
    packed, _ = pack(FIVE)
    damaged = bytearray(packed)
    damaged[10] ^= 0x01
    with pytest.raises(PackedIndexCorruptError, match="header fails its checksum"):
        parse_header(bytes(damaged), "t")


def test_a_truncated_object_is_reported_as_shorter_than_its_table() -> None:
    packed, layout = pack(FIVE)
    with pytest.raises(PackedIndexCorruptError, match="shorter than its section table"):
        extract(packed[:-1], 0, layout.sections, "t")


def test_an_unknown_format_version_is_refused_with_the_version_named() -> None:
    packed, _ = pack(FIVE)
    newer = packed[:4] + (9).to_bytes(2, "big") + packed[6:]
    with pytest.raises(PackedIndexCorruptError, match="format version 9"):
        parse_header(newer, "t")


def test_an_object_without_the_magic_is_refused() -> None:
    with pytest.raises(PackedIndexCorruptError, match="does not start with"):
        parse_header(b"PK\x03\x04" + bytes(200), "t")


def test_the_biggest_header_fits_the_header_read() -> None:
    _packed, layout = pack(FIVE, chunk_index=b"c", wrapped_key=b"k")
    assert layout.sections[0].position == MAX_HEADER_SIZE


def test_every_read_group_is_one_contiguous_range_and_the_groups_cover_every_type() -> None:
    _, layout = pack(FIVE)
    for group in READ_GROUPS:
        sections = layout.present(group)
        start, end = layout.span(sections)
        assert end - start == sum(s.length for s in sections)
    assert set().union(*READ_GROUPS) == set(IndexType)


# -- format version 2: the segment's chunk index as a sixth section ------------------------------------------


def test_without_a_chunk_index_pack_writes_version_1_as_before() -> None:
    packed, layout = pack(FIVE)
    assert int.from_bytes(packed[4:6], "big") == FORMAT_VERSION
    assert layout.version == FORMAT_VERSION


def test_with_a_chunk_index_pack_writes_version_2_and_every_section_round_trips() -> None:
    packed, layout = pack(FIVE, chunk_index=b"chunk index bytes")
    assert int.from_bytes(packed[4:6], "big") == CHUNKED_FORMAT_VERSION
    assert parse_header(packed[:MAX_HEADER_SIZE], "t") == layout
    expected: dict[SectionType, bytes] = {t: body for t, body in FIVE.items()}
    expected[SegmentSection.CHUNK_INDEX] = b"chunk index bytes"
    assert extract(packed, 0, layout.sections, "t") == expected


def test_the_chunk_index_directly_follows_the_brokers_read_group_so_one_range_covers_both() -> None:
    _, layout = pack(FIVE, chunk_index=b"c" * 40)
    sections = layout.present({*BROKER_READ_GROUP, SegmentSection.CHUNK_INDEX})
    start, end = layout.span(sections)
    assert end - start == sum(s.length for s in sections)
    for group in READ_GROUPS:
        grouped = layout.present(group)
        low, high = layout.span(grouped)
        assert high - low == sum(s.length for s in grouped)


def test_a_version_1_header_listing_a_chunk_index_is_refused() -> None:
    packed, _ = pack(FIVE, chunk_index=b"c")
    relabelled = bytearray(packed)
    relabelled[4:6] = FORMAT_VERSION.to_bytes(2, "big")
    with pytest.raises(PackedIndexCorruptError):
        parse_header(bytes(relabelled), "t")
