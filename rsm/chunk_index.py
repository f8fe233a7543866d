"""The chunk index of a segment's `.log` object: its fixed-size chunks and a CRC32C checksum per chunk.

Recorded at upload as a section of the packed `.indexes` object (rsm/packed_index.py) and checked on every
read. Format v1 (big-endian): u8 version, u8 checksum algorithm (1 = CRC32C), u8 flags, u32 chunk size, u64
original (segment) size, u32 chunk count, then per chunk u32 checksum, or, with flag STORED_LENGTHS, u32
stored length and u32 checksum. Chunk i holds original bytes [i * chunk size, (i + 1) * chunk size); its
stored bytes follow the previous chunk's in the object. Today every chunk is stored as it is (stored ==
original); a per-chunk transform (compression, encryption) stores other lengths and sets the flag. The
checksum covers a chunk's stored bytes, so damage is found before any transform is undone.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c

from rlmm.errors import RemoteStorageError

CHUNK_INDEX_VERSION = 1
CRC32C = 1
FLAG_STORED_LENGTHS = 0x01
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


@dataclass(frozen=True, slots=True)
class ChunkIndex:
    """Chunks of one segment: original layout (fixed size) and stored layout (positions in the object)."""

    chunk_size: int
    original_size: int
    checksums: tuple[int, ...]
    # Per chunk, when a transform changed them; None: each chunk is stored as its original bytes.
    stored_lengths: tuple[int, ...] | None = None
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
        if len(lengths) != expected:
            raise ChunkIndexError(f"chunk index lists {len(lengths)} stored lengths for {expected} chunks")
        object.__setattr__(self, "_stored_starts", tuple(itertools.accumulate(lengths, initial=0)))

    @property
    def count(self) -> int:
        return len(self.checksums)

    def original_start(self, chunk: int) -> int:
        return chunk * self.chunk_size

    def original_length(self, chunk: int) -> int:
        return min(self.chunk_size, self.original_size - chunk * self.chunk_size)

    def stored_start(self, chunk: int) -> int:
        return self._stored_starts[chunk]

    def stored_length(self, chunk: int) -> int:
        return self._stored_starts[chunk + 1] - self._stored_starts[chunk]

    def chunk_of(self, position: int) -> int:
        """The chunk holding original byte `position` (which must lie inside the segment)."""
        return min(position // self.chunk_size, self.count - 1)


def build(path: Path, chunk_size: int) -> ChunkIndex:
    """The chunk index of the file at `path`, read once in chunk-size pieces."""
    checksums = []
    size = 0
    try:
        with open(path, "rb", buffering=0) as source:
            while piece := source.read(chunk_size):
                # A short read before the end (not expected from a regular file) would shift every later chunk.
                while len(piece) < chunk_size and (more := source.read(chunk_size - len(piece))):
                    piece += more
                checksums.append(checksum(piece))
                size += len(piece)
    except OSError as exc:
        raise RemoteStorageError(f"cannot read the segment {path} to checksum its chunks: {exc}") from exc
    return ChunkIndex(chunk_size, size, tuple(checksums))


def encode(index: ChunkIndex) -> bytes:
    flags = FLAG_STORED_LENGTHS if index.stored_lengths is not None else 0
    out = bytearray(
        _HEADER.pack(CHUNK_INDEX_VERSION, CRC32C, flags, index.chunk_size, index.original_size, index.count)
    )
    if index.stored_lengths is None:
        out += struct.pack(f">{index.count}I", *index.checksums)
    else:
        for length, crc in zip(index.stored_lengths, index.checksums, strict=True):
            out += struct.pack(">II", length, crc)
    return bytes(out)


def decode(data: bytes, where: str) -> ChunkIndex:
    if len(data) < _HEADER.size:
        raise ChunkIndexError(f"chunk index of {where} is {len(data)} bytes, too short for its header")
    version, algorithm, flags, chunk_size, size, count = _HEADER.unpack_from(data, 0)
    if version != CHUNK_INDEX_VERSION or algorithm != CRC32C or flags & ~FLAG_STORED_LENGTHS:
        raise ChunkIndexError(
            f"chunk index of {where} has version {version}, checksum algorithm {algorithm}, flags {flags:#x}; "
            f"this reader understands version {CHUNK_INDEX_VERSION} with CRC32C"
        )
    per_chunk = 2 if flags & FLAG_STORED_LENGTHS else 1
    if len(data) != _HEADER.size + count * per_chunk * _U32.size:
        raise ChunkIndexError(f"chunk index of {where} is {len(data)} bytes, wrong for {count} chunks")
    values = struct.unpack_from(f">{count * per_chunk}I", data, _HEADER.size)
    if per_chunk == 1:
        return ChunkIndex(chunk_size, size, tuple(values))
    return ChunkIndex(chunk_size, size, tuple(values[1::2]), stored_lengths=tuple(values[0::2]))


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "ChunkCorruptError",
    "ChunkIndex",
    "ChunkIndexError",
    "build",
    "checksum",
    "decode",
    "encode",
]
