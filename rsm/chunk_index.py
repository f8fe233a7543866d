"""The chunk index of a segment's `.log` object: its fixed-size chunks and a CRC32C checksum per chunk.

Recorded at upload as a section of the packed `.indexes` object (rsm/packed_index.py) and checked on every
read. Format v1 (big-endian): u8 version, u8 checksum algorithm (1 = CRC32C), u8 flags, u32 chunk size, u64
original (segment) size, u32 chunk count, then per chunk u32 checksum, or, with flag STORED_LENGTHS, u32
stored length and u32 checksum. Chunk i holds original bytes [i * chunk size, (i + 1) * chunk size); its
stored bytes follow the previous chunk's in the object. The checksum covers a chunk's stored bytes, so damage
is found before any transform is undone. Segments written by a per-chunk transform (rsm/transforms.py) set
STORED_LENGTHS and add, in this order: with COMPRESSED, a bitmap of the chunks stored as zstd frames (bit i of
byte i // 8, least significant first); with PLAIN_CHECKSUMS, a u32 CRC32C of each chunk's original bytes (what
the chunk cache holds and checks); with ENCRYPTED (chunks are AES-256-GCM ciphertexts), instead of the clear
plain checksums, u32 length and the sealed plain checksums: an AES-GCM ciphertext whose associated data is
every byte before it, so the whole index is authenticated by the segment's data key.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c

from rlmm.errors import RemoteStorageError

CHUNK_INDEX_VERSION = 1
CRC32C = 1
FLAG_STORED_LENGTHS = 0x01
FLAG_COMPRESSED = 0x02
FLAG_PLAIN_CHECKSUMS = 0x04
FLAG_ENCRYPTED = 0x08
_KNOWN_FLAGS = FLAG_STORED_LENGTHS | FLAG_COMPRESSED | FLAG_PLAIN_CHECKSUMS | FLAG_ENCRYPTED
DEFAULT_CHUNK_SIZE = 4 << 20
# A chunk is read, checked and held whole: bounded so one chunk never costs much memory.
MAX_CHUNK_SIZE = 64 << 20
MIN_CHUNK_SIZE = 4 << 10

_HEADER = struct.Struct(">BBBIQI")
_U32 = struct.Struct(">I")


class ChunkIndexError(RemoteStorageError):
    """A chunk index that cannot be decoded (damaged, or written by a newer version)."""


class ChunkCorruptError(RemoteStorageError):
    """A chunk's bytes fail its checksum: the stored object (or a cached copy that could not be dropped) is
    damaged. Never served."""


def checksum(data: bytes) -> int:
    """CRC32C (Castagnoli), hardware-accelerated by google-crc32c."""
    return int(google_crc32c.value(data))


# Pieces of a file checksummed in turn: small enough to come from the allocator's free lists. A whole chunk read at
# once (megabytes) is a fresh mapping each time, whose page faults cost several times the checksum itself.
_FILE_PIECE = 64 << 10


def file_checksum(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(CRC32C of a file's bytes as checksum() of its contents, its size); raises OSError (FileNotFoundError if
    absent)."""
    crc = size = 0
    with open(path, "rb", buffering=0) as source:
        read = source.read
        while piece := read(_FILE_PIECE):
            crc = google_crc32c.extend(crc, piece)
            size += len(piece)
    return int(crc), size


# Seals (plaintext, associated data) into a ciphertext, or opens one back (rsm/transforms.py's SegmentCipher).
Seal = Callable[[bytes, bytes], bytes]


@dataclass(frozen=True, slots=True)
class ChunkIndex:
    """Chunks of one segment: original layout (fixed size) and stored layout (positions in the object)."""

    chunk_size: int
    original_size: int
    checksums: tuple[int, ...]
    # Per chunk, when a transform changed them; None: each chunk is stored as its original bytes.
    stored_lengths: tuple[int, ...] | None = None
    # Per chunk, whether it is stored as a zstd frame; None: no chunk of the segment is compressed.
    compressed: tuple[bool, ...] | None = None
    # Per chunk, the CRC32C of its original bytes when those differ from the stored ones (a transformed segment).
    plain_checksums: tuple[int, ...] | None = None
    # Whether chunks are AES-256-GCM ciphertexts under the segment's data key.
    encrypted: bool = False
    _stored_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.original_size < 0:
            raise ChunkIndexError(f"chunk index has chunk size {self.chunk_size}, size {self.original_size}")
        expected = -(-self.original_size // self.chunk_size)
        if len(self.checksums) != expected:
            raise ChunkIndexError(
                f"chunk index lists {len(self.checksums)} chunks; a {self.original_size}-byte segment in "
                f"{self.chunk_size}-byte chunks has {expected}"
            )
        lengths = self.stored_lengths or tuple(self.original_length(i) for i in range(expected))
        for name, values in (("stored lengths", lengths), ("compression flags", self.compressed),
                             ("plain checksums", self.plain_checksums)):
            if values is not None and len(values) != expected:
                raise ChunkIndexError(f"chunk index lists {len(values)} {name} for {expected} chunks")
        if self.transformed and (self.stored_lengths is None or self.plain_checksums is None):
            raise ChunkIndexError("chunk index of a transformed segment lacks stored lengths or plain checksums")
        object.__setattr__(self, "_stored_starts", tuple(itertools.accumulate(lengths, initial=0)))

    @property
    def count(self) -> int:
        return len(self.checksums)

    @property
    def transformed(self) -> bool:
        """Whether chunks are stored other than as their original bytes (compressed or encrypted)."""
        return self.encrypted or self.compressed is not None

    def original_start(self, chunk: int) -> int:
        return chunk * self.chunk_size

    def original_length(self, chunk: int) -> int:
        return min(self.chunk_size, self.original_size - chunk * self.chunk_size)

    def stored_start(self, chunk: int) -> int:
        return self._stored_starts[chunk]

    def stored_length(self, chunk: int) -> int:
        return self._stored_starts[chunk + 1] - self._stored_starts[chunk]

    @property
    def stored_size(self) -> int:
        return self._stored_starts[-1]

    def plain_checksum(self, chunk: int) -> int:
        """The CRC32C of the chunk's original bytes: what a cached (plain) copy must match."""
        return self.checksums[chunk] if self.plain_checksums is None else self.plain_checksums[chunk]

    def is_compressed(self, chunk: int) -> bool:
        return self.compressed is not None and self.compressed[chunk]

    def chunk_of(self, position: int) -> int:
        """The chunk holding original byte `position` (which must lie inside the segment)."""
        return min(position // self.chunk_size, self.count - 1)


def read_chunks(path: Path, chunk_size: int, pace: Callable[[int], object] | None = None) -> Iterator[bytes]:
    """The file at `path` in chunk-size pieces (the last one shorter), read once; `pace` is told each piece's
    length before it is handed out (an upload's rate limit)."""
    try:
        with open(path, "rb", buffering=0) as source:
            while piece := source.read(chunk_size):
                # A short read before the end (not expected from a regular file) would shift every later chunk.
                while len(piece) < chunk_size and (more := source.read(chunk_size - len(piece))):
                    piece += more
                if pace is not None:
                    pace(len(piece))
                yield piece
    except OSError as exc:
        raise RemoteStorageError(f"cannot read the segment {path} to checksum its chunks: {exc}") from exc


def build(path: Path, chunk_size: int, pace: Callable[[int], object] | None = None) -> ChunkIndex:
    """The chunk index of the file at `path` stored as it is (`pace`: as in read_chunks)."""
    checksums = []
    size = 0
    for piece in read_chunks(path, chunk_size, pace):
        checksums.append(checksum(piece))
        size += len(piece)
    return ChunkIndex(chunk_size, size, tuple(checksums))


def _bitmap(bits: tuple[bool, ...]) -> bytes:
    out = bytearray(-(-len(bits) // 8))
    for i, bit in enumerate(bits):
        if bit:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def encode(index: ChunkIndex, seal: Seal | None = None) -> bytes:
    """The index's bytes; an encrypted index needs `seal` (its segment's cipher) for its plain checksums."""
    flags = FLAG_STORED_LENGTHS if index.stored_lengths is not None else 0
    if index.compressed is not None:
        flags |= FLAG_COMPRESSED
    if index.encrypted:
        flags |= FLAG_ENCRYPTED
    elif index.plain_checksums is not None:
        flags |= FLAG_PLAIN_CHECKSUMS
    out = bytearray(
        _HEADER.pack(CHUNK_INDEX_VERSION, CRC32C, flags, index.chunk_size, index.original_size, index.count)
    )
    if index.stored_lengths is None:
        out += struct.pack(f">{index.count}I", *index.checksums)
    else:
        for length, crc in zip(index.stored_lengths, index.checksums, strict=True):
            out += struct.pack(">II", length, crc)
    if index.compressed is not None:
        out += _bitmap(index.compressed)
    if index.plain_checksums is not None:
        plain = struct.pack(f">{index.count}I", *index.plain_checksums)
        if index.encrypted:
            if seal is None:
                raise ValueError("an encrypted chunk index is sealed with its segment's cipher")
            sealed = seal(plain, bytes(out))
            out += _U32.pack(len(sealed)) + sealed
        else:
            out += plain
    return bytes(out)


def decode(data: bytes, where: str, unseal: Seal | None = None) -> ChunkIndex:
    """Decode an index; an encrypted one needs `unseal` (its segment's cipher), which also authenticates it."""
    if len(data) < _HEADER.size:
        raise ChunkIndexError(f"chunk index of {where} is {len(data)} bytes, too short for its header")
    version, algorithm, flags, chunk_size, size, count = _HEADER.unpack_from(data, 0)
    if version != CHUNK_INDEX_VERSION or algorithm != CRC32C or flags & ~_KNOWN_FLAGS:
        raise ChunkIndexError(
            f"chunk index of {where} has version {version}, checksum algorithm {algorithm}, flags {flags:#x}; "
            f"this reader understands version {CHUNK_INDEX_VERSION} with CRC32C and flags {_KNOWN_FLAGS:#x}"
        )
    encrypted = bool(flags & FLAG_ENCRYPTED)
    if encrypted and unseal is None:
        raise ChunkIndexError(f"chunk index of {where} is of an encrypted segment, but no data key was given")
    per_chunk = 2 if flags & FLAG_STORED_LENGTHS else 1
    pos = _HEADER.size + count * per_chunk * _U32.size
    bitmap_size = -(-count // 8) if flags & FLAG_COMPRESSED else 0
    plain_at = pos + bitmap_size
    plain_size = count * _U32.size if flags & FLAG_PLAIN_CHECKSUMS else 0
    if encrypted:
        if len(data) < plain_at + _U32.size:
            raise ChunkIndexError(f"chunk index of {where} is {len(data)} bytes, too short for {count} chunks")
        plain_size = _U32.size + _U32.unpack_from(data, plain_at)[0]
    if len(data) != plain_at + plain_size:
        raise ChunkIndexError(f"chunk index of {where} is {len(data)} bytes, wrong for {count} chunks")
    plain_checksums: tuple[int, ...] | None = None
    if encrypted:
        assert unseal is not None
        plain = unseal(data[plain_at + _U32.size :], data[:plain_at])
        if len(plain) != count * _U32.size:
            raise ChunkIndexError(f"chunk index of {where} seals {len(plain)} bytes of checksums for {count} chunks")
        plain_checksums = struct.unpack(f">{count}I", plain)
    elif plain_size:
        plain_checksums = struct.unpack_from(f">{count}I", data, plain_at)
    compressed = None
    if bitmap_size:
        compressed = tuple(bool(data[pos + i // 8] >> (i % 8) & 1) for i in range(count))
    values = struct.unpack_from(f">{count * per_chunk}I", data, _HEADER.size)
    checksums, lengths = (values, None) if per_chunk == 1 else (values[1::2], values[0::2])
    return ChunkIndex(
        chunk_size, size, tuple(checksums), stored_lengths=None if lengths is None else tuple(lengths),
        compressed=compressed, plain_checksums=plain_checksums, encrypted=encrypted,
    )


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "ChunkCorruptError",
    "ChunkIndex",
    "ChunkIndexError",
    "Seal",
    "build",
    "checksum",
    "decode",
    "encode",
    "read_chunks",
]
