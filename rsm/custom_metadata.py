"""The custom metadata that copy_log_segment_data returns: the packed index's section table, compactly.

Kafka stores it with the segment and hands it back on every call, so fetches know the byte ranges
without reading the header. v1: u8 version, u8 flags, u8 count, then per section u8 type code, varint
position, varint length, u32 CRC-32. v2: the same, for a packed object that also holds the segment's chunk
index (section type code 6; written only then, so v1 readers never meet a section they do not know). v3: for
an encrypted segment, whose packed object also holds its wrapped data key (type code 7, checksum 0: rewrap
rewrites it in place). With packed objects far below 4 GiB a section takes at most 1 + 5 + 5 + 4 bytes:
3 + 7 * 15 = 108 bytes, under Kafka's default cap of 128.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rlmm.errors import RemoteStorageError
from rsm.packed_index import (
    CHUNKED_FORMAT_VERSION,
    ENCRYPTED_FORMAT_VERSION,
    FORMAT_VERSION,
    TYPE_CODES,
    TYPES_BY_CODE,
    PackedIndexLayout,
    Section,
    SegmentSection,
)

CUSTOM_METADATA_VERSION = 1
# The section table of a packed object with a chunk index (packed index format version 2).
CHUNKED_CUSTOM_METADATA_VERSION = 2
# The section table of an encrypted segment's packed object (packed index format version 3).
ENCRYPTED_CUSTOM_METADATA_VERSION = 3
_VERSIONS = (CUSTOM_METADATA_VERSION, CHUNKED_CUSTOM_METADATA_VERSION, ENCRYPTED_CUSTOM_METADATA_VERSION)
# Each custom metadata version describes packed objects of one format version.
_PACKED_VERSIONS = dict(zip(_VERSIONS, (FORMAT_VERSION, CHUNKED_FORMAT_VERSION, ENCRYPTED_FORMAT_VERSION),
                            strict=True))
MAX_CUSTOM_METADATA_BYTES = 128  # remote.log.metadata.custom.metadata.max.bytes default
_FLAG_HASHED_KEYS = 0x01
_CRC = struct.Struct(">I")


class CustomMetadataError(RemoteStorageError):
    """A segment's custom metadata is not a section table this reader can decode."""


@dataclass(frozen=True, slots=True)
class SegmentCustomMetadata:
    layout: PackedIndexLayout
    # Whether the segment's keys carry the hash prefix: recorded so that changing the config later
    # does not orphan segments written before the change.
    hashed_keys: bool


def _put_varint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"varint must be >= 0, got {value}")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise CustomMetadataError("custom metadata ends inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise CustomMetadataError("custom metadata has a varint longer than 10 bytes")


def encode(metadata: SegmentCustomMetadata) -> bytes:
    sections = metadata.layout.sections
    version = next(v for v, packed in _PACKED_VERSIONS.items() if packed == metadata.layout.version)
    out = bytearray([version, _FLAG_HASHED_KEYS if metadata.hashed_keys else 0])
    out.append(len(sections))
    for s in sections:
        out.append(TYPE_CODES[s.index_type])
        _put_varint(out, s.position)
        _put_varint(out, s.length)
        out += _CRC.pack(s.crc32)
    if len(out) > MAX_CUSTOM_METADATA_BYTES:
        raise CustomMetadataError(
            f"custom metadata would be {len(out)} bytes, over {MAX_CUSTOM_METADATA_BYTES}"
        )
    return bytes(out)


def decode(data: bytes, segment: str) -> SegmentCustomMetadata | None:
    """Decode; None if it was written in a version this reader does not know (read the header instead)."""
    if len(data) < 3:
        raise CustomMetadataError(f"custom metadata of segment {segment} is {len(data)} bytes, too short")
    if data[0] not in _VERSIONS:
        return None
    version, flags, count = data[0], data[1], data[2]
    pos = 3
    sections = []
    try:
        for _ in range(count):
            if pos >= len(data):
                raise CustomMetadataError("custom metadata ends before its last section")
            code = data[pos]
            if code not in TYPES_BY_CODE or (
                isinstance(TYPES_BY_CODE[code], SegmentSection) and version == CUSTOM_METADATA_VERSION
            ):
                raise CustomMetadataError(f"unknown section type code {code} in version {version}")
            position, pos = _get_varint(data, pos + 1)
            length, pos = _get_varint(data, pos)
            if pos + _CRC.size > len(data):
                raise CustomMetadataError("custom metadata ends inside a checksum")
            (crc,) = _CRC.unpack_from(data, pos)
            pos += _CRC.size
            sections.append(Section(TYPES_BY_CODE[code], position, length, crc))
        if pos != len(data):
            raise CustomMetadataError(f"{len(data) - pos} unexpected trailing bytes")
        layout = PackedIndexLayout(tuple(sections))
        if layout.version != _PACKED_VERSIONS[version]:
            raise CustomMetadataError(f"version {version} with the sections of packed format {layout.version}")
    except RemoteStorageError as exc:
        raise CustomMetadataError(f"custom metadata of segment {segment} is malformed: {exc}") from None
    return SegmentCustomMetadata(layout=layout, hashed_keys=bool(flags & _FLAG_HASHED_KEYS))


__all__ = [
    "CHUNKED_CUSTOM_METADATA_VERSION",
    "CUSTOM_METADATA_VERSION",
    "ENCRYPTED_CUSTOM_METADATA_VERSION",
    "MAX_CUSTOM_METADATA_BYTES",
    "CustomMetadataError",
    "SegmentCustomMetadata",
    "decode",
    "encode",
]
