"""Per-chunk transforms of a segment's `.log` object: zstd compression and AES-256-GCM encryption, each chunk on
its own so that a ranged read fetches and undoes only the chunks it touches.

A chunk is compressed first (kept plain when its zstd frame is not smaller), then encrypted under the segment's
own random data key (rsm/keyring.py wraps it). The GCM nonce is the chunk number (unique: a data key serves one
upload of one segment) and the associated data names the segment and the chunk, so a chunk moved to another
position or segment fails to decrypt. Which transforms a segment used is recorded in its chunk index.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rlmm.config import ConfigKey, parse_bool, parse_int
from rlmm.errors import RemoteStorageError
from rsm.chunk_index import ChunkIndex, ChunkIndexError, checksum, read_chunks

CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("compression.enabled", parse_bool, default=False),
    # Skip compressing a segment whose record batches are compressed already (by the producer or the topic).
    ConfigKey("compression.heuristic.enabled", parse_bool, default=False),
    ConfigKey("compression.zstd.level", parse_int, default=3, check=lambda v: 1 <= v <= 19, requirement="1 to 19"),
)

GCM_TAG_BYTES = 16
_CHUNK_NONCE = struct.Struct(">4xQ")  # 4 zero bytes, the chunk number
_INDEX_NONCE = b"\x00\x00\x00\x01" + bytes(8)  # never a chunk's nonce
_CHUNK_AAD = struct.Struct(">16sQ")
_INDEX_AAD = b"tierlog chunk index\x00"

# Kafka's record batch (magic 2) and legacy message set (magic 0, 1) headers: where magic and attributes lie.
_MAGIC_AT = 16
_BATCH_ATTRIBUTES = struct.Struct(">h")
_BATCH_ATTRIBUTES_AT = 21
_LEGACY_ATTRIBUTES_AT = 17
_COMPRESSION_CODEC_MASK = 0x07


class TransformError(RemoteStorageError):
    """A chunk that passed its checksum does not decrypt or decompress: tampered with, or moved from elsewhere."""


def batches_compressed(path: Path) -> bool:
    """Whether the segment's first record batch is compressed (Aiven's heuristic: a producer's or topic's
    compression applies to a whole segment); an empty or unreadable header counts as not compressed."""
    try:
        with open(path, "rb") as source:
            head = source.read(_BATCH_ATTRIBUTES_AT + _BATCH_ATTRIBUTES.size)
    except OSError as exc:
        raise RemoteStorageError(f"cannot read the segment {path}: {exc}") from exc
    if len(head) <= _LEGACY_ATTRIBUTES_AT:
        return False
    magic = head[_MAGIC_AT]
    if magic >= 2:
        if len(head) < _BATCH_ATTRIBUTES_AT + _BATCH_ATTRIBUTES.size:
            return False
        (attributes,) = _BATCH_ATTRIBUTES.unpack_from(head, _BATCH_ATTRIBUTES_AT)
    else:
        attributes = head[_LEGACY_ATTRIBUTES_AT]
    return attributes & _COMPRESSION_CODEC_MASK != 0


class SegmentCipher:
    """AES-256-GCM under one segment's data key: its chunks and its chunk index's sealed checksums."""

    def __init__(self, data_key: bytes, segment: uuid.UUID) -> None:
        self._aead = AESGCM(data_key)
        self._segment = segment

    def __repr__(self) -> str:
        return f"SegmentCipher(segment={self._segment})"

    def seal_chunk(self, chunk: int, plain: bytes) -> bytes:
        return self._aead.encrypt(_CHUNK_NONCE.pack(chunk), plain, _CHUNK_AAD.pack(self._segment.bytes, chunk))

    def open_chunk(self, chunk: int, sealed: bytes) -> bytes:
        try:
            return self._aead.decrypt(_CHUNK_NONCE.pack(chunk), sealed, _CHUNK_AAD.pack(self._segment.bytes, chunk))
        except InvalidTag:
            raise TransformError("it fails AES-GCM authentication (tampered with, or not this segment's chunk "
                                 "at this position)") from None

    def seal_index(self, plain: bytes, associated: bytes) -> bytes:
        return self._aead.encrypt(_INDEX_NONCE, plain, _INDEX_AAD + self._segment.bytes + associated)

    def open_index(self, sealed: bytes, associated: bytes) -> bytes:
        try:
            return self._aead.decrypt(_INDEX_NONCE, sealed, _INDEX_AAD + self._segment.bytes + associated)
        except InvalidTag:
            raise ChunkIndexError(
                f"the chunk index of segment {self._segment} fails AES-GCM authentication: it was tampered with "
                "or belongs to another segment; the segment's bytes are not served"
            ) from None


@dataclass(frozen=True, slots=True)
class ChunkCodec:
    """How one segment's chunks are stored: zstd-compressed where that helps (`compress`), encrypted when it
    has a cipher. Without either it is the identity (chunks stored as they are)."""

    compress: bool = False
    cipher: SegmentCipher | None = None
    level: int = 3

    @property
    def identity(self) -> bool:
        return not self.compress and self.cipher is None

    def encode(self, chunk: int, plain: bytes) -> tuple[bytes, bool]:
        """The chunk's stored bytes, and whether they are a zstd frame."""
        stored, compressed = plain, False
        if self.compress:
            frame = zstandard.ZstdCompressor(level=self.level, write_checksum=True).compress(plain)
            if len(frame) < len(plain):
                stored, compressed = frame, True
        if self.cipher is not None:
            stored = self.cipher.seal_chunk(chunk, stored)
        return stored, compressed

    def decode(self, index: ChunkIndex, chunk: int, stored: bytes) -> bytes:
        """The chunk's original bytes from its (checksum-verified) stored bytes; raises TransformError saying
        what failed."""
        data = stored if self.cipher is None else self.cipher.open_chunk(chunk, stored)
        length = index.original_length(chunk)
        if index.is_compressed(chunk):
            try:
                data = zstandard.ZstdDecompressor().decompress(data, max_output_size=length)
            except zstandard.ZstdError as exc:
                raise TransformError(f"its zstd frame does not decompress ({exc})") from None
        if len(data) != length:
            raise TransformError(f"it decodes to {len(data)} bytes, its chunk index says {length}")
        if checksum(data) != index.plain_checksum(chunk):
            raise TransformError("its decoded bytes fail their CRC32C checksum")
        return data

    def seal(self) -> Callable[[bytes, bytes], bytes] | None:
        return None if self.cipher is None else self.cipher.seal_index


# Chunks stored as their original bytes.
IDENTITY = ChunkCodec()


def write_transformed(
    source: Path, out: BinaryIO, chunk_size: int, codec: ChunkCodec, pace: Callable[[int], object] | None = None
) -> ChunkIndex:
    """Read the segment at `source` once, writing each chunk's stored form to `out`; its chunk index (`pace`: as in
    chunk_index.read_chunks)."""
    stored_lengths: list[int] = []
    checksums: list[int] = []
    plain_checksums: list[int] = []
    compressed: list[bool] = []
    size = 0
    for chunk, plain in enumerate(read_chunks(source, chunk_size, pace)):
        stored, is_compressed = codec.encode(chunk, plain)
        out.write(stored)
        stored_lengths.append(len(stored))
        checksums.append(checksum(stored))
        plain_checksums.append(checksum(plain))
        compressed.append(is_compressed)
        size += len(plain)
    return ChunkIndex(
        chunk_size, size, tuple(checksums), stored_lengths=tuple(stored_lengths),
        compressed=tuple(compressed) if codec.compress else None, plain_checksums=tuple(plain_checksums),
        encrypted=codec.cipher is not None,
    )


__all__ = [
    "CONFIG_KEYS",
    "IDENTITY",
    "ChunkCodec",
    "SegmentCipher",
    "TransformError",
    "batches_compressed",
    "write_transformed",
]
