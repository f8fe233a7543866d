"""The packed `.indexes` object: one versioned header, then the index sections of one segment.

Layout (big-endian): magic `TLIX`, u16 version, u16 section count, per section (u8 type code, u64
position, u64 length, u32 CRC-32 of the section), then a u32 CRC-32 of everything before it. The
sections follow in SECTION_ORDER, so the three the broker reads together are one contiguous range.
Version 1 holds Kafka's five indexes; version 2 may add the segment's chunk index (type code 6, see
rsm/chunk_index.py) right after them, so a broker's index read fetches it in the same range. A version 2
object without a chunk index is never written: pack() writes version 1 then, byte for byte as before. Version 3
(an encrypted segment) adds the segment's wrapped data key (type code 7, rsm/keyring.py) right after the chunk
index: a fixed-size slot that `tierlog rewrap` rewrites in place under another key-encryption key, so its
checksum is recorded as 0 in the table (it carries its own, and unwrapping authenticates it) and positions,
lengths and every other checksum stay what the segment's custom metadata says.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlmm.errors import RemoteStorageError
from rsm.types import IndexType

MAGIC = b"TLIX"
FORMAT_VERSION = 1
# With a CHUNK_INDEX section.
CHUNKED_FORMAT_VERSION = 2
# With a CHUNK_INDEX and a WRAPPED_KEY section.
ENCRYPTED_FORMAT_VERSION = 3
READABLE_VERSIONS = (FORMAT_VERSION, CHUNKED_FORMAT_VERSION, ENCRYPTED_FORMAT_VERSION)


class SegmentSection(enum.Enum):
    """A section of the packed object that is not one of Kafka's indexes."""

    CHUNK_INDEX = "CHUNK_INDEX"
    WRAPPED_KEY = "WRAPPED_KEY"


# Rewritten in place (same position and length) after the segment is written; no checksum in the table.
REWRITABLE_SECTIONS: frozenset[SegmentSection] = frozenset({SegmentSection.WRAPPED_KEY})

# What a section holds: one of Kafka's indexes, or tierlog's own chunk index.
SectionType = IndexType | SegmentSection

# OFFSET, TIMESTAMP and TRANSACTION first and adjacent: Kafka's RemoteIndexCache asks for exactly these
# three in a row, so one range covers them; a follower's LEADER_EPOCH and PRODUCER_SNAPSHOT come after,
# adjacent too.
# The chunk index (and an encrypted segment's wrapped data key) follow them: a broker's index read (before it
# reads the segment) brings them in the same range.
SECTION_ORDER: tuple[SectionType, ...] = (
    IndexType.OFFSET,
    IndexType.TIMESTAMP,
    IndexType.TRANSACTION,
    SegmentSection.CHUNK_INDEX,
    SegmentSection.WRAPPED_KEY,
    IndexType.LEADER_EPOCH,
    IndexType.PRODUCER_SNAPSHOT,
)
BROKER_READ_GROUP: frozenset[IndexType] = frozenset(
    {IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION}
)
# A follower building its auxiliary state from tiered storage reads these two, also in a row.
FOLLOWER_READ_GROUP: frozenset[IndexType] = frozenset({IndexType.LEADER_EPOCH, IndexType.PRODUCER_SNAPSHOT})
READ_GROUPS: tuple[frozenset[IndexType], ...] = (BROKER_READ_GROUP, FOLLOWER_READ_GROUP)

# Codes stored on disk; independent of IndexType's values so Kafka renumbering cannot break old objects.
TYPE_CODES: Mapping[SectionType, int] = {
    IndexType.OFFSET: 1,
    IndexType.TIMESTAMP: 2,
    IndexType.TRANSACTION: 3,
    IndexType.LEADER_EPOCH: 4,
    IndexType.PRODUCER_SNAPSHOT: 5,
    SegmentSection.CHUNK_INDEX: 6,
    SegmentSection.WRAPPED_KEY: 7,
}
TYPES_BY_CODE: Mapping[int, SectionType] = {code: t for t, code in TYPE_CODES.items()}

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
    index_type: SectionType
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
        seen: set[SectionType] = set()
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

    def get(self, index_type: SectionType) -> Section | None:
        for section in self.sections:
            if section.index_type is index_type:
                return section
        return None

    @property
    def version(self) -> int:
        """The format version of the object this table describes."""
        if self.get(SegmentSection.WRAPPED_KEY):
            return ENCRYPTED_FORMAT_VERSION
        return CHUNKED_FORMAT_VERSION if self.get(SegmentSection.CHUNK_INDEX) else FORMAT_VERSION

    def present(self, types: Iterable[SectionType]) -> tuple[Section, ...]:
        wanted = set(types)
        return tuple(s for s in self.sections if s.index_type in wanted)

    def span(self, sections: Iterable[Section]) -> tuple[int, int]:
        """The smallest [start, end) byte range covering `sections` (which must not be empty)."""
        chosen = list(sections)
        return min(s.position for s in chosen), max(s.end for s in chosen)


def pack(
    indexes: Mapping[IndexType, bytes], chunk_index: bytes | None = None, wrapped_key: bytes | None = None
) -> tuple[bytes, PackedIndexLayout]:
    """Build the packed object from the indexes present (a missing TRANSACTION index is left out), and the
    segment's encoded chunk index if given (format version 2) and its wrapped data key slot (version 3)."""
    if wrapped_key is not None and chunk_index is None:
        raise ValueError("a wrapped data key goes with a chunk index")
    sources: dict[SectionType, bytes] = {t: body for t, body in indexes.items()}
    if chunk_index is not None:
        sources[SegmentSection.CHUNK_INDEX] = chunk_index
    if wrapped_key is not None:
        sources[SegmentSection.WRAPPED_KEY] = wrapped_key
    present = [t for t in SECTION_ORDER if t in sources]
    header_size = _PRELUDE.size + len(present) * _ENTRY.size + _HEADER_CRC.size
    sections: list[Section] = []
    position = header_size
    for index_type in present:
        body = sources[index_type]
        crc = 0 if index_type in REWRITABLE_SECTIONS else checksum(body)
        sections.append(Section(index_type, position, len(body), crc))
        position += len(body)
    layout = PackedIndexLayout(tuple(sections))
    header = bytearray(_PRELUDE.pack(MAGIC, layout.version, len(sections)))
    for s in sections:
        header += _ENTRY.pack(TYPE_CODES[s.index_type], s.position, s.length, s.crc32)
    header += _HEADER_CRC.pack(checksum(header))
    packed = b"".join([bytes(header), *(sources[t] for t in present)])
    return packed, layout


def parse_header(data: bytes, where: str) -> PackedIndexLayout:
    """Read the section table from the first bytes of a packed object (at least the whole header)."""
    if len(data) < _PRELUDE.size:
        raise PackedIndexCorruptError(f"packed index {where} is too short for a header ({len(data)} bytes)")
    magic, version, count = _PRELUDE.unpack_from(data, 0)
    if magic != MAGIC:
        raise PackedIndexCorruptError(f"packed index {where} does not start with {MAGIC!r}: {magic!r}")
    if version not in READABLE_VERSIONS:
        raise PackedIndexCorruptError(
            f"packed index {where} has format version {version}; this reader understands "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
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
    layout = PackedIndexLayout(tuple(sections))
    if layout.version != version:
        raise PackedIndexCorruptError(
            f"packed index {where} says format version {version} but its sections are those of version "
            f"{layout.version}"
        )
    return layout


def extract(
    data: bytes, data_start: int, sections: Iterable[Section], where: str
) -> dict[SectionType, bytes]:
    """Cut `sections` out of `data` (object bytes starting at `data_start`), verifying each checksum."""
    view = memoryview(data)
    found: dict[SectionType, bytes] = {}
    for section in sections:
        lo = section.position - data_start
        body = view[lo : lo + section.length]
        if lo < 0 or len(body) != section.length:
            raise PackedIndexCorruptError(
                f"packed index {where} is shorter than its section table says "
                f"({section.index_type.name} at {section.position}+{section.length})"
            )
        if section.index_type not in REWRITABLE_SECTIONS and checksum(body) != section.crc32:
            raise PackedIndexCorruptError(
                f"packed index {where} section {section.index_type.name} fails its checksum; "
                f"the object is corrupt: copy the segment again or delete it"
            )
        found[section.index_type] = bytes(body)
    return found


__all__ = [
    "BROKER_READ_GROUP",
    "CHUNKED_FORMAT_VERSION",
    "ENCRYPTED_FORMAT_VERSION",
    "FOLLOWER_READ_GROUP",
    "FORMAT_VERSION",
    "MAX_HEADER_SIZE",
    "READABLE_VERSIONS",
    "READ_GROUPS",
    "REWRITABLE_SECTIONS",
    "SECTION_ORDER",
    "PackedIndexCorruptError",
    "PackedIndexLayout",
    "Section",
    "SectionType",
    "SegmentSection",
    "extract",
    "pack",
    "parse_header",
]
