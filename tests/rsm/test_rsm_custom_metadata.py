"""The custom metadata codec: the section table in at most 128 bytes, round-tripped and validated."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsm.custom_metadata import (
    CHUNKED_CUSTOM_METADATA_VERSION,
    CUSTOM_METADATA_VERSION,
    MAX_CUSTOM_METADATA_BYTES,
    CustomMetadataError,
    SegmentCustomMetadata,
    decode,
    encode,
)
from rsm.packed_index import SECTION_ORDER, PackedIndexLayout, Section, pack
from rsm.types import IndexType


def _layout_with(sizes: list[int]) -> PackedIndexLayout:
    position = 0
    sections = []
    for index_type, size in zip(SECTION_ORDER, sizes, strict=False):
        sections.append(Section(index_type, position, size, 0xFFFFFFFF))
        position += size
    return PackedIndexLayout(tuple(sections))


def test_the_layout_of_a_packed_object_round_trips() -> None:
    _, layout = pack({t: bytes(10 + t.value) for t in IndexType})
    meta = SegmentCustomMetadata(layout, hashed_keys=True)
    assert decode(encode(meta), "s") == meta


@given(st.lists(st.integers(min_value=0, max_value=2**63 // 8), min_size=0, max_size=5), st.booleans())
def test_any_layout_round_trips_within_128_bytes(sizes: list[int], hashed: bool) -> None:
    meta = SegmentCustomMetadata(_layout_with(sizes), hashed)
    encoded = encode(meta)
    assert len(encoded) <= MAX_CUSTOM_METADATA_BYTES
    assert decode(encoded, "s") == meta


def test_a_typical_segment_needs_well_under_the_cap() -> None:
    _, layout = pack({t: bytes(10 << 20) if t is IndexType.OFFSET else bytes(4096) for t in IndexType})
    assert len(encode(SegmentCustomMetadata(layout, False))) < 64


def test_an_unknown_version_decodes_to_none_so_the_reader_falls_back_to_the_header() -> None:
    encoded = encode(SegmentCustomMetadata(_layout_with([1, 2]), False))
    assert decode(bytes([9]) + encoded[1:], "s") is None


def test_truncated_custom_metadata_is_an_error_naming_the_segment() -> None:
    encoded = encode(SegmentCustomMetadata(_layout_with([1, 2, 3]), False))
    with pytest.raises(CustomMetadataError, match="segment seg-1"):
        decode(encoded[:-2], "seg-1")


def test_trailing_bytes_are_an_error() -> None:
    encoded = encode(SegmentCustomMetadata(_layout_with([1]), False))
    with pytest.raises(CustomMetadataError, match="trailing"):
        decode(encoded + b"\x00", "s")


def test_a_layout_with_a_chunk_index_is_written_as_version_2_and_round_trips() -> None:
    _, layout = pack({t: bytes(10 << 20) for t in IndexType}, chunk_index=bytes(1 << 20))
    meta = SegmentCustomMetadata(layout, hashed_keys=False)
    encoded = encode(meta)
    assert encoded[0] == CHUNKED_CUSTOM_METADATA_VERSION
    assert len(encoded) <= MAX_CUSTOM_METADATA_BYTES
    assert decode(encoded, "s") == meta


def test_a_layout_without_a_chunk_index_is_still_written_as_version_1() -> None:
    _, layout = pack({t: bytes(10) for t in IndexType})
    assert encode(SegmentCustomMetadata(layout, False))[0] == CUSTOM_METADATA_VERSION


def test_version_1_naming_a_chunk_index_section_is_an_error() -> None:
    _, layout = pack({IndexType.OFFSET: b"o"}, chunk_index=b"c")
    encoded = encode(SegmentCustomMetadata(layout, False))
    with pytest.raises(CustomMetadataError, match="unknown section type code 6 in version 1"):
        decode(bytes([CUSTOM_METADATA_VERSION]) + encoded[1:], "s")
