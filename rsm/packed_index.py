"""The packed `.indexes` object: one versioned header, then the five index sections of one segment.

Layout (big-endian): magic `TLIX`, u16 version, u16 section count, per section (u8 type code, u64
position, u64 length, u32 CRC-32 of the section), then a u32 CRC-32 of everything before it. The
sections follow in SECTION_ORDER, so the three the broker reads together are one contiguous range.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlmm.errors import RemoteStorageError
from rsm.types import IndexType

MAGIC = b"TLIX"
FORMAT_VERSION = 1

# OFFSET, TIMESTAMP and TRANSACTION first and adjacent: Kafka's RemoteIndexCache asks for exactly these
# three in a row, so one range covers them; a follower's LEADER_EPOCH and PRODUCER_SNAPSHOT come after,
# adjacent too.
SECTION_ORDER: tuple[IndexType, ...] = (
    IndexType.OFFSET,
    IndexType.TIMESTAMP,
    IndexType.TRANSACTION,
    IndexType.LEADER_EPOCH,
    IndexType.PRODUCER_SNAPSHOT,
)
BROKER_READ_GROUP: frozenset[IndexType] = frozenset(SECTION_ORDER[:3])
# A follower building its auxiliary state from tiered storage reads these two, also in a row.
FOLLOWER_READ_GROUP: frozenset[IndexType] = frozenset(SECTION_ORDER[3:])
READ_GROUPS: tuple[frozenset[IndexType], ...] = (BROKER_READ_GROUP, FOLLOWER_READ_GROUP)

# Codes stored on disk; independent of IndexType's values so Kafka renumbering cannot break old objects.
TYPE_CODES: Mapping[IndexType, int] = {
    IndexType.OFFSET: 1,
    IndexType.TIMESTAMP: 2,
    IndexType.TRANSACTION: 3,
    IndexType.LEADER_EPOCH: 4,
    IndexType.PRODUCER_SNAPSHOT: 5,
}
TYPES_BY_CODE: Mapping[int, IndexType] = {code: t for t, code in TYPE_CODES.items()}

_PRELUDE = struct.Struct(">4sHH")
_ENTRY = struct.Struct(">BQQI")
_HEADER_CRC = struct.Struct(">I")
# A reader that lacks the section table reads this many leading bytes: enough for any v1 header.
MAX_HEADER_SIZE = _PRELUDE.size + len(SECTION_ORDER) * _ENTRY.size + _HEADER_CRC.size


class PackedIndexCorruptError(RemoteStorageError):
    """A packed index object (or the section table describing it) fails its checksum or structure."""


def checksum(data: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Section:
    index_type: IndexType
    position: int
    length: int
    crc32: int

    @property
    def end(self) -> int:
        """Exclusive end position."""
        return self.position + self.length


@dataclass(frozen=True, slots=True)
class PackedIndexLayout:
    """Where each present index lives inside the packed object; an absent index has no section."""

    sections: tuple[Section, ...]

    def __post_init__(self) -> None:
        seen: set[IndexType] = set()
        previous_end = 0
        for section in self.sections:
            if section.index_type in seen:
                raise PackedIndexCorruptError(f"section {section.index_type.name} appears twice")
            if section.position < previous_end or section.length < 0:
                raise PackedIndexCorruptError(
                    f"section {section.index_type.name} at {section.position}+{section.length} overlaps "
                    f"the previous section or is out of order"
                )
            seen.add(section.index_type)
            previous_end = section.end

    def get(self, index_type: IndexType) -> Section | None:
        for section in self.sections:
            if section.index_type is index_type:
                return section
        return None

    def present(self, types: Iterable[IndexType]) -> tuple[Section, ...]:
        wanted = set(types)
        return tuple(s for s in self.sections if s.index_type in wanted)

    def span(self, sections: Iterable[Section]) -> tuple[int, int]:
        """The smallest [start, end) byte range covering `sections` (which must not be empty)."""
        chosen = list(sections)
        return min(s.position for s in chosen), max(s.end for s in chosen)


def pack(indexes: Mapping[IndexType, bytes]) -> tuple[bytes, PackedIndexLayout]:
    """Build the packed object from the indexes present (a missing TRANSACTION index is left out)."""
    present = [t for t in SECTION_ORDER if t in indexes]
    header_size = _PRELUDE.size + len(present) * _ENTRY.size + _HEADER_CRC.size
    sections: list[Section] = []
    position = header_size
    for index_type in present:
        body = indexes[index_type]
        sections.append(Section(index_type, position, len(body), checksum(body)))
        position += len(body)
    header = bytearray(_PRELUDE.pack(MAGIC, FORMAT_VERSION, len(sections)))
    for s in sections:
        header += _ENTRY.pack(TYPE_CODES[s.index_type], s.position, s.length, s.crc32)
    header += _HEADER_CRC.pack(checksum(header))
    packed = b"".join([bytes(header), *(indexes[t] for t in present)])
    return packed, PackedIndexLayout(tuple(sections))


def parse_header(data: bytes, where: str) -> PackedIndexLayout:
    """Read the section table from the first bytes of a packed object (at least the whole header)."""
    if len(data) < _PRELUDE.size:
        raise PackedIndexCorruptError(f"packed index {where} is too short for a header ({len(data)} bytes)")
    magic, version, count = _PRELUDE.unpack_from(data, 0)
    if magic != MAGIC:
        raise PackedIndexCorruptError(f"packed index {where} does not start with {MAGIC!r}: {magic!r}")
    if version != FORMAT_VERSION:
        raise PackedIndexCorruptError(
            f"packed index {where} has format version {version}; this reader understands {FORMAT_VERSION}"
        )
    crc_at = _PRELUDE.size + count * _ENTRY.size
    if count > len(SECTION_ORDER) or len(data) < crc_at + _HEADER_CRC.size:
        raise PackedIndexCorruptError(f"packed index {where} has a truncated header ({count} sections)")
    (stored_crc,) = _HEADER_CRC.unpack_from(data, crc_at)
    if checksum(data[:crc_at]) != stored_crc:
        raise PackedIndexCorruptError(f"packed index {where} header fails its checksum")
    sections = []
    for i in range(count):
        code, position, length, crc = _ENTRY.unpack_from(data, _PRELUDE.size + i * _ENTRY.size)
        if code not in TYPES_BY_CODE:
            raise PackedIndexCorruptError(f"packed index {where} has unknown section type code {code}")
        sections.append(Section(TYPES_BY_CODE[code], position, length, crc))
    return PackedIndexLayout(tuple(sections))


def extract(
    data: bytes, data_start: int, sections: Iterable[Section], where: str
) -> dict[IndexType, bytes]:
    """Cut `sections` out of `data` (object bytes starting at `data_start`), verifying each checksum."""
    view = memoryview(data)
    found: dict[IndexType, bytes] = {}
    for section in sections:
        lo = section.position - data_start
        body = view[lo : lo + section.length]
        if lo < 0 or len(body) != section.length:
            raise PackedIndexCorruptError(
                f"packed index {where} is shorter than its section table says "
                f"({section.index_type.name} at {section.position}+{section.length})"
            )
        if checksum(body) != section.crc32:
            raise PackedIndexCorruptError(
                f"packed index {where} section {section.index_type.name} fails its checksum; "
                f"the object is corrupt: copy the segment again or delete it"
            )
        found[section.index_type] = bytes(body)
    return found


__all__ = [
    "BROKER_READ_GROUP",
    "FOLLOWER_READ_GROUP",
    "FORMAT_VERSION",
    "MAX_HEADER_SIZE",
    "READ_GROUPS",
    "SECTION_ORDER",
    "PackedIndexCorruptError",
    "PackedIndexLayout",
    "Section",
    "extract",
    "pack",
    "parse_header",
]
