"""Kafka's record batches (magic 2), read from the bytes a Fetch response holds for one partition: a worker's raw read
of the metadata topic (rlmm.raw_fetch). rlmm/_record_batches.c reads them in C when it is built; this module is its
reference, and what reads them without it.

A batch is a 61-byte header (base offset, length, leader epoch, magic, CRC, attributes, last offset delta, timestamps,
producer id, epoch and sequence, record count) and its records, compressed as a whole when the attributes name a
codec. A record is its length, attributes, timestamp delta, offset delta, key, value and headers, the numbers as
zigzag varints, a key or value of length -1 null. A response may end inside a batch (a fetch is cut at its byte
limit): that batch is left for the next fetch. Anything else that does not frame exactly is a ValueError.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import cramjam

HEADER_BYTES = 61
MAGIC = 2
# A batch's attributes: its codec (the low three bits), and whether it belongs to a transaction or is a control
# batch (a transaction's commit or abort marker).
CODEC_MASK = 0x07
TRANSACTIONAL = 0x10
CONTROL = 0x20
GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODEC_NAMES = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

# Past it, a record's offset (the base plus a delta of up to 35 bits) could leave int64.
MAX_BASE_OFFSET = (1 << 63) - 1 - (1 << 36)
_HEAD = struct.Struct(">qiibIhiqqqhii")  # the header's fields, base offset to record count
_XERIAL = b"\x82SNAPPY\x00"  # the framing Kafka's Java clients wrap snappy in

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value
Decompress = Callable[[int, bytes], bytes]


def decompress(codec: int, payload: bytes) -> bytes:
    """A compressed batch's records, as Kafka's clients write each codec; ValueError for one that does not
    decompress, or an unknown codec."""
    try:
        if codec == GZIP:
            return zlib.decompress(payload, 16 + zlib.MAX_WBITS)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(payload))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(payload))
        if codec == SNAPPY:
            return _snappy(payload)
    except (zlib.error, cramjam.DecompressionError) as exc:
        raise ValueError(f"a {CODEC_NAMES[codec]} batch does not decompress: {exc}") from exc
    raise ValueError(f"a batch of unknown codec {codec}")


def _snappy(payload: bytes) -> bytes:
    if not payload.startswith(_XERIAL):
        return bytes(cramjam.snappy.decompress_raw(payload))  # librdkafka's plain snappy
    parts, at = [], 16  # the magic, then a version and a compatible version of 4 bytes each
    while at < len(payload):
        if at + 4 > len(payload):
            raise ValueError("a snappy block's length is cut short")
        (length,) = struct.unpack_from(">i", payload, at)
        if length < 0 or at + 4 + length > len(payload):
            raise ValueError(f"a snappy block of {length} bytes is cut short")
        parts.append(bytes(cramjam.snappy.decompress_raw(payload[at + 4:at + 4 + length])))
        at += 4 + length
    return b"".join(parts)


def read(data: bytes, start: int, end: int, unpack: Decompress = decompress) -> tuple[list[Record], int, bool]:
    """The records of the whole batches in `data` with offsets in [start, end), in order; the offset after the last
    whole batch (-1 when none is whole); and whether it stopped at a transactional or control batch (left unread,
    with what follows it: a reader that must skip aborted transactions reads those)."""
    records: list[Record] = []
    next_offset = -1
    at, size = 0, len(data)
    while size - at >= 12:
        base, length = struct.unpack_from(">qi", data, at)
        if length < HEADER_BYTES - 12:
            raise ValueError(f"a batch at offset {base} says it holds {length} bytes, fewer than its header")
        if size - at - 12 < length:
            break  # cut at the fetch's byte limit: the next fetch reads it whole
        (_, _, _, magic, _, attributes, last_delta, _, _, _, _, _, count) = _HEAD.unpack_from(data, at)
        if not 0 <= base <= MAX_BASE_OFFSET:
            raise ValueError(f"a batch at offset {base}: not an offset this reader takes (0..{MAX_BASE_OFFSET})")
        if magic != MAGIC:
            raise ValueError(f"a batch at offset {base} of magic {magic}; this reader reads magic {MAGIC}")
        if attributes & (TRANSACTIONAL | CONTROL):
            return records, next_offset, True
        if count < 0 or last_delta < 0:
            raise ValueError(f"a batch at offset {base} of {count} records, last offset delta {last_delta}")
        body = data[at + HEADER_BYTES:at + 12 + length]
        codec = attributes & CODEC_MASK
        if codec:
            body = unpack(codec, bytes(body))
            if type(body) is not bytes:
                raise ValueError(f"a batch at offset {base}: decompressed to {type(body).__name__}, not bytes")
        _records_of(body, base, count, start, end, records)
        next_offset = base + last_delta + 1
        at += 12 + length
    return records, next_offset, False


def _records_of(body: bytes, base: int, count: int, start: int, end: int, records: list[Record]) -> None:
    at = 0
    for _ in range(count):
        length, at = _varint(body, at, 5)
        record_end = at + length
        if length < 0 or record_end > len(body):
            raise ValueError(f"a record of batch {base} says it holds {length} bytes, past its batch")
        at += 1  # attributes
        _timestamp, at = _varint(body, at, 10)
        delta, at = _varint(body, at, 5)
        key, at = _bytes(body, at, record_end)
        value, at = _bytes(body, at, record_end)
        headers, at = _varint(body, at, 5)
        if headers < 0:
            raise ValueError(f"a record of batch {base} says it holds {headers} headers")
        for _ in range(headers):
            name, at = _bytes(body, at, record_end)
            if name is None:
                raise ValueError(f"a record of batch {base} holds a header without a name")
            _value, at = _bytes(body, at, record_end)
        if at != record_end:
            raise ValueError(f"a record of batch {base} holds {record_end - at} bytes more than it frames")
        offset = base + delta
        if start <= offset < end:
            records.append((offset, key, value))
    if at != len(body):
        raise ValueError(f"batch {base} holds {len(body) - at} bytes after its {count} records")


def _varint(data: bytes, at: int, most: int) -> tuple[int, int]:
    """A zigzag varint of at most `most` bytes at `at`, and where it ends."""
    raw = shift = 0
    for i in range(most):
        if at + i >= len(data):
            raise ValueError("a number is cut short")
        byte = data[at + i]
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), at + i + 1
        shift += 7
    raise ValueError(f"a number runs past {most} bytes")


def _bytes(data: bytes, at: int, limit: int) -> tuple[bytes | None, int]:
    length, at = _varint(data, at, 5)
    if length == -1:
        return None, at
    if length < 0 or at + length > limit:
        raise ValueError(f"a key, value or header of {length} bytes runs past its record")
    return bytes(data[at:at + length]), at + length


# keep's `only`: (the user partitions' view keys, each partition text's view key or None as named so far, what names
# one, whether the records of those partitions are kept or the others).
Only = tuple[frozenset[bytes] | set[bytes], dict[bytes, bytes | None], Callable[[bytes], bytes | None], bool]


def keep(newest: dict[bytes, tuple[Any, ...]], superseded_tombstones: list[tuple[Any, ...]], partition: int,
         records: list[Record], expected: int, cleaned: bool, tombstone_prefix: bytes, only: Only | None = None
         ) -> tuple[int, bool]:
    """Keep the newest record of each key of `records` (consecutive records of metadata partition `partition`) in
    `newest`, as a rebuild's compacted window keeps them (rlmm.backlog_window.CompactedWindow): a tombstone of a key
    with `tombstone_prefix` (a segment's) drops its key; a tombstone another record supersedes goes to
    `superseded_tombstones`. Each kept record is (partition, offset, key, value, None, whether the log cleaner may
    have removed records before it). `expected` is the offset the records should start at, `cleaned` whether a gap
    showed the cleaner at work before them: both as they stand after the records are returned. With `only`, the
    records of the partitions it names (or of none: `in_first`) are kept, or the others (its last item False).
    rlmm/_record_batches.c keeps them in C when it is built."""
    for offset, key, value in records:
        if offset != expected:
            cleaned = True
        expected = offset + 1
        if key is None:
            key = b""
        if only is not None and in_first(key, *only[:3]) != only[3]:
            continue
        if value is None and key.startswith(tombstone_prefix):
            newest.pop(key, None)
            continue
        before = newest.get(key)
        if before is not None and before[3] is None:
            superseded_tombstones.append(before)
        newest[key] = (partition, offset, key, value, None, cleaned if before is None else before[3] is not None)
    return expected, cleaned


def read_keep(data: bytes, start: int, end: int, unpack: Decompress, newest: dict[bytes, tuple[Any, ...]],
              superseded_tombstones: list[tuple[Any, ...]], partition: int, expected: int, cleaned: bool,
              tombstone_prefix: bytes, only: Only | None) -> tuple[int, int, bool, int, bool]:
    """`read`, then `keep` of what it read: how many records were read, the offset after the last whole batch, whether
    it stopped at a transactional or control batch, then the offset expected next and whether a gap showed the cleaner.
    rlmm/_record_batches.c does both in one pass when it is built, making no object of a record `only` passes by."""
    records, next_offset, transactional = read(data, start, end, unpack)
    expected, cleaned = keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix,
                             only)
    return len(records), next_offset, transactional, expected, cleaned


def in_first(key: bytes, first: frozenset[bytes] | set[bytes], named: dict[bytes, bytes | None],
             name: Callable[[bytes], bytes | None]) -> bool:
    """Whether the user partition a record key names is in `first`, or it names none: its text (`partition_text`)
    looked up in `named`, and where not there named by `name` (None: no user partition) and remembered."""
    text = partition_text(key)
    tp_key = named.get(text, _UNNAMED)
    if tp_key is _UNNAMED:
        tp_key = named[text] = name(text)
    return tp_key is None or tp_key in first


_UNNAMED: Any = object()


def partition_text(key: bytes) -> bytes:
    """The `<topic id>:<partition>` of a record key (rlmm.events.RecordKey): what comes before a segment key's id,
    else the key's second and third fields."""
    if key.startswith(b"segment:") and len(key) > 45 and key[-37] == 58:  # ":" and an id's 36 characters
        return key[8:-37]
    return b":".join(key.split(b":", 3)[1:3])
