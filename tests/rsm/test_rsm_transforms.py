"""Per-chunk compression and encryption: every combination round-trips, segments of any earlier writer keep
reading, tampering with a chunk, the chunk index or the wrapped data key is an error naming the segment, the key
ring rotates, and nothing secret reaches logs, metrics or messages.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import random
import struct
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import SegmentFactory, SegmentFixture

from rlmm.types import RemoteLogSegmentMetadata
from rsm import ConfigError, PackedIndexCorruptError, RemoteStorageError, RemoteStorageManager
from rsm import custom_metadata as custom
from rsm.chunk_index import ChunkCorruptError, ChunkIndex, ChunkIndexError, decode, encode
from rsm.keyring import DataKeyError, FileKey, WrappedKey
from rsm.keys import keys_for
from rsm.packed_index import SegmentSection, extract, pack, parse_header
from rsm.transforms import ChunkCodec, SegmentCipher, TransformError, batches_compressed
from rsm.types import IndexType

CHUNK = 16 << 10
SEGMENT = 200_000  # 13 chunks, the last one short


# -- segments and configs -----------------------------------------------------------------------------


def json_records(size: int, seed: int = 3) -> bytes:
    """Uncompressed record values as a producer of JSON events writes them: compressible, as real ones are."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += json.dumps({"order": rng.randrange(10**9), "user": f"user-{rng.randrange(5000)}",
                           "items": rng.randrange(1, 9), "total": round(rng.random() * 500, 2),
                           "status": rng.choice(["NEW", "PAID", "SHIPPED"])}).encode()
    return bytes(out[:size])


def record_batch(codec: int, payload: bytes) -> bytes:
    """A Kafka record batch header (magic 2) whose attributes name compression `codec`, then `payload`."""
    return struct.pack(">qiibih", 0, 49 + len(payload), 0, 2, 0, codec) + bytes(40) + payload


def with_log(segment: SegmentFixture, content: bytes) -> SegmentFixture:
    segment.data.log_segment.write_bytes(content)
    metadata = dataclasses.replace(segment.metadata, segment_size_in_bytes=len(content))
    return SegmentFixture(metadata, segment.data)


@pytest.fixture
def ring(tmp_path: Path) -> dict[str, Any]:
    """A key ring of two file keys (one raw, one base64), k1 active."""
    (tmp_path / "k1.key").write_bytes(os.urandom(32))
    (tmp_path / "k2.key").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    return {
        "encryption.key.pairs": "k1,k2", "encryption.key.pair.id": "k1",
        "encryption.key.pairs.k1.key.file": str(tmp_path / "k1.key"),
        "encryption.key.pairs.k2.key.file": str(tmp_path / "k2.key"),
    }


@pytest.fixture
def fs(tmp_path: Path) -> dict[str, Any]:
    return {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote"), "chunk.size": CHUNK}


COMBINATIONS = {
    "plain": {},
    "compressed": {"compression.enabled": "true"},
    "encrypted": {"encryption.enabled": "true"},
    "compressed+encrypted": {"compression.enabled": "true", "encryption.enabled": "true"},
}


def _copy(rsm: RemoteStorageManager, segment: SegmentFixture) -> RemoteLogSegmentMetadata:
    return segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))


def _read(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, start: int = 0,
          end: int | None = None) -> bytes:
    with rsm.fetch_log_segment(metadata, start, end) as stream:
        return stream.read()


def _packed(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> bytes:
    with rsm.backend.get_range(keys_for(metadata, False).indexes, 0) as stream:
        return stream.read()


def _section(packed: bytes, kind: SegmentSection) -> tuple[int, int]:
    section = parse_header(packed, "t").get(kind)
    assert section is not None
    return section.position, section.end


# -- formats -------------------------------------------------------------------------------------------


def test_a_transformed_chunk_index_round_trips_with_its_compressed_chunks_and_plain_checksums() -> None:
    index = ChunkIndex(100, 250, (1, 2, 3), stored_lengths=(40, 100, 10), compressed=(True, False, True),
                       plain_checksums=(7, 8, 9))
    assert decode(encode(index), "s") == index
    assert [index.plain_checksum(n) for n in range(3)] == [7, 8, 9] and index.is_compressed(2)


def test_an_encrypted_chunk_index_seals_its_plain_checksums_and_opens_only_with_its_segment_key() -> None:
    segment = uuid.uuid4()
    cipher = SegmentCipher(os.urandom(32), segment)
    index = ChunkIndex(100, 250, (1, 2, 3), stored_lengths=(56, 116, 66), compressed=(True, False, False),
                       plain_checksums=(0x7A7A7A7A, 8, 9), encrypted=True)
    encoded = encode(index, cipher.seal_index)
    assert struct.pack(">I", 0x7A7A7A7A) not in encoded
    assert decode(encoded, "s", cipher.open_index) == index
    with pytest.raises(ChunkIndexError, match="no data key was given"):
        decode(encoded, "s")
    with pytest.raises(ChunkIndexError, match="fails AES-GCM authentication"):
        decode(encoded, "s", SegmentCipher(os.urandom(32), segment).open_index)


def test_the_section_table_of_an_encrypted_segment_is_custom_metadata_v3_within_128_bytes() -> None:
    sections = {t: b"x" for t in IndexType}
    _, layout = pack(sections, chunk_index=b"c" * 5000, wrapped_key=bytes(1024))
    encoded = custom.encode(custom.SegmentCustomMetadata(layout, True))
    assert encoded[0] == custom.ENCRYPTED_CUSTOM_METADATA_VERSION and len(encoded) <= 128
    assert custom.decode(encoded, "s") == custom.SegmentCustomMetadata(layout, True)
    wrapped = layout.get(SegmentSection.WRAPPED_KEY)
    assert wrapped is not None and wrapped.crc32 == 0  # rewritten in place by rewrap: no checksum to go stale


# -- round trips ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["uncached", "disk-cache"])
@pytest.mark.parametrize("combination", COMBINATIONS)
@pytest.mark.parametrize("content", ["json", "random"])
def test_every_combination_round_trips_whole_and_ranged_reads(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory, tmp_path: Path,
    combination: str, cache: str, content: str,
) -> None:
    config = {**fs, **ring, **COMBINATIONS[combination]}
    if cache == "disk-cache":
        config |= {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(tmp_path / "cache")}
    raw = json_records(SEGMENT) if content == "json" else random.Random(5).randbytes(SEGMENT)
    segment = with_log(make_segment(), raw)
    with RemoteStorageManager(config) as rsm:
        metadata = _copy(rsm, segment)
        assert metadata.custom_metadata is not None and len(metadata.custom_metadata) <= 128
        assert _read(rsm, metadata) == raw
        rng = random.Random(11)
        for _ in range(12):
            start = rng.randrange(SEGMENT)
            end = rng.choice([None, rng.randrange(start, SEGMENT), start])
            assert _read(rsm, metadata, start, end) == raw[start : None if end is None else end + 1], (start, end)
        if cache == "disk-cache":
            files = rsm.fetch_log_segment_files(metadata, 40_000, 90_000)
            assert files is not None
            served = b"".join(r.path.read_bytes()[r.offset : r.offset + r.length] for r in files.ranges)
            assert served == raw[40_000:90_001]
    with RemoteStorageManager(config) as fresh:  # a new process: keys unwrapped again from the ring
        assert _read(fresh, metadata, 17) == raw[17:]


def test_compressed_chunks_are_smaller_and_an_incompressible_chunk_is_stored_plain(
    fs: dict[str, Any], make_segment: SegmentFactory
) -> None:
    raw = json_records(8 * CHUNK) + random.Random(1).randbytes(2 * CHUNK)
    segment = with_log(make_segment(), raw)
    with RemoteStorageManager({**fs, "compression.enabled": True}) as rsm:
        metadata = _copy(rsm, segment)
        packed = _packed(rsm, metadata)
        index = decode(packed[slice(*_section(packed, SegmentSection.CHUNK_INDEX))], "t")
        assert index.compressed == (True,) * 8 + (False, False)
        assert all(index.stored_length(n) < CHUNK // 2 for n in range(8))
        assert [index.stored_length(n) for n in (8, 9)] == [CHUNK, CHUNK]
        stored = sum(o.size for o in rsm.backend.list("") if o.key.endswith(".log"))
        assert stored == index.stored_size < len(raw) // 2
        counters = rsm.metrics()["counters"]
        assert counters["transform.original_bytes"] == len(raw)
        assert counters["transform.stored_bytes"] == stored
        assert _read(rsm, metadata) == raw


@pytest.mark.parametrize(("heuristic", "compressed_batches", "expect_compressed"), [
    (True, True, False), (True, False, True), (False, True, True),
])
def test_the_heuristic_skips_compressing_segments_whose_batches_are_compressed(
    fs: dict[str, Any], make_segment: SegmentFactory, heuristic: bool, compressed_batches: bool,
    expect_compressed: bool,
) -> None:
    # Batches compressed by the producer would not shrink; here the payload compresses so the test tells apart
    # "skipped" from "tried and found no gain".
    raw = record_batch(4 if compressed_batches else 0, json_records(SEGMENT))[:SEGMENT]
    assert batches_compressed(with_log(make_segment(), raw).data.log_segment) is compressed_batches
    segment = with_log(make_segment(), raw)
    config = {**fs, "compression.enabled": True, "compression.heuristic.enabled": heuristic}
    with RemoteStorageManager(config) as rsm:
        metadata = _copy(rsm, segment)
        stored = sum(o.size for o in rsm.backend.list("") if o.key.endswith(".log"))
        assert (stored < SEGMENT // 2) is expect_compressed
        assert rsm.metrics()["counters"].get("compression.skipped_segments", 0) == int(not expect_compressed)
        assert _read(rsm, metadata) == raw


def test_a_bucket_mixing_plain_and_transformed_segments_reads_whichever_way_the_cluster_is_set_now(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory
) -> None:
    written: list[tuple[RemoteLogSegmentMetadata, bytes]] = []
    for seed, combination in enumerate(COMBINATIONS):
        raw = json_records(SEGMENT, seed)
        with RemoteStorageManager({**fs, **ring, **COMBINATIONS[combination]}) as rsm:
            written.append((_copy(rsm, with_log(make_segment(seed=seed), raw)), raw))
    # Transforms switched off (the ring stays, for reading) and on: every segment reads either way.
    for combination in ("plain", "compressed+encrypted"):
        with RemoteStorageManager({**fs, **ring, **COMBINATIONS[combination]}) as rsm:
            for metadata, raw in written:
                assert _read(rsm, metadata, 1000) == raw[1000:]
                assert _read(rsm, dataclasses.replace(metadata, custom_metadata=None), 5) == raw[5:]


def test_a_chunk_cache_holds_plain_bytes_for_the_adapter(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory, tmp_path: Path
) -> None:
    raw = json_records(SEGMENT)
    config = {**fs, **ring, **COMBINATIONS["compressed+encrypted"], "fetch.chunk.cache.class": "disk",
              "fetch.chunk.cache.path": str(tmp_path / "cache"), "fetch.chunk.cache.prefetch.max.size": 0}
    with RemoteStorageManager(config) as rsm:
        metadata = _copy(rsm, with_log(make_segment(), raw))
        assert _read(rsm, metadata) == raw
    segment_dir = tmp_path / "cache" / str(metadata.remote_log_segment_id.id)
    chunks = {int(p.name): p.read_bytes() for p in segment_dir.iterdir()}
    assert len(chunks) == -(-SEGMENT // CHUNK)
    assert all(data == raw[n * CHUNK : (n + 1) * CHUNK] for n, data in chunks.items())
    with RemoteStorageManager(config) as restarted:  # the warm cache serves, checked against plain checksums
        assert _read(restarted, metadata) == raw
        assert restarted.metrics()["counters"]["chunk_cache.hits"] == len(chunks)


def test_a_ranged_read_of_a_transformed_segment_fetches_only_the_chunks_it_touches(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory
) -> None:
    raw = json_records(SEGMENT)
    with RemoteStorageManager({**fs, **ring, **COMBINATIONS["compressed+encrypted"]}) as rsm:
        metadata = _copy(rsm, with_log(make_segment(), raw))
    with RemoteStorageManager({**fs, **ring}) as reader:
        middle = SEGMENT // 2
        assert _read(reader, metadata, middle, middle + 4095) == raw[middle : middle + 4096]
        get = reader.metrics()["operations"]["backend.get"]
        packed = _packed(reader, metadata)
        index = decode(packed[slice(*_section(packed, SegmentSection.CHUNK_INDEX))], "t",
                       _cipher(ring, packed, metadata).open_index)
        touched = sum(index.stored_length(n) for n in {index.chunk_of(middle), index.chunk_of(middle + 4095)})
        chunk_sections = (
            _section(packed, SegmentSection.WRAPPED_KEY)[1] - _section(packed, SegmentSection.CHUNK_INDEX)[0]
        )
        assert get["requests"] == 2  # the chunk index with the wrapped key, then the chunks
        assert get["bytes"] == touched + chunk_sections


def _cipher(ring: dict[str, Any], packed: bytes, metadata: RemoteLogSegmentMetadata) -> SegmentCipher:
    wrapped = WrappedKey.decode(packed[slice(*_section(packed, SegmentSection.WRAPPED_KEY))], "t")
    key = FileKey(wrapped.key_id, Path(ring[f"encryption.key.pairs.{wrapped.key_id}.key.file"]))
    segment = metadata.remote_log_segment_id.id
    return SegmentCipher(key.unwrap(wrapped.wrapped, segment), segment)


# -- tampering --------------------------------------------------------------------------------------------


Encrypted = Callable[..., tuple[RemoteStorageManager, RemoteLogSegmentMetadata, bytes]]


@pytest.fixture
def encrypted(fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory) -> Iterator[Encrypted]:
    """Copies a compressed and encrypted segment (with a manager of its own); returns manager, metadata, bytes."""
    managers: list[RemoteStorageManager] = []

    def make(seed: int = 0) -> tuple[RemoteStorageManager, RemoteLogSegmentMetadata, bytes]:
        raw = json_records(SEGMENT, seed)
        rsm = RemoteStorageManager({**fs, **ring, **COMBINATIONS["compressed+encrypted"]})
        managers.append(rsm)
        return rsm, _copy(rsm, with_log(make_segment(seed=seed), raw)), raw

    yield make
    for rsm in managers:
        rsm.close()


def _fresh(rsm: RemoteStorageManager, fs: dict[str, Any], ring: dict[str, Any]) -> RemoteStorageManager:
    rsm.close()
    return RemoteStorageManager({**fs, **ring})


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_in_a_stored_chunk_is_an_error_naming_segment_and_chunk(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any], where: str
) -> None:
    rsm, metadata, _ = encrypted()
    key = keys_for(metadata, False).log
    with rsm.backend.get_range(key, 0) as stream:
        stored = bytearray(stream.read())
    position = {"first": 0, "middle": len(stored) // 2, "last": len(stored) - 1}[where]
    stored[position] ^= 0x04
    rsm.backend.put(key, bytes(stored))
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(ChunkCorruptError, match=rf"segment {metadata.remote_log_segment_id} chunk \d+ "):
        _read(reader, metadata)


def test_a_chunk_opens_only_at_its_own_position_of_its_own_segment() -> None:
    key = os.urandom(32)
    segment, other = uuid.uuid4(), uuid.uuid4()
    sealed = SegmentCipher(key, segment).seal_chunk(3, b"record bytes")
    assert SegmentCipher(key, segment).open_chunk(3, sealed) == b"record bytes"
    for cipher, chunk in ((SegmentCipher(key, segment), 4), (SegmentCipher(key, other), 3)):
        with pytest.raises(TransformError, match="fails AES-GCM authentication"):
            cipher.open_chunk(chunk, sealed)
    damaged = bytearray(sealed)
    damaged[0] ^= 1
    with pytest.raises(TransformError):
        SegmentCipher(key, segment).open_chunk(3, bytes(damaged))


def test_a_compressed_chunk_that_does_not_decompress_to_its_checksum_is_refused(
    fs: dict[str, Any], make_segment: SegmentFactory
) -> None:
    codec = ChunkCodec(compress=True)
    stored, compressed = codec.encode(0, json_records(CHUNK))
    assert compressed
    with RemoteStorageManager({**fs, "compression.enabled": True}) as rsm:
        metadata = _copy(rsm, with_log(make_segment(), json_records(CHUNK)))
        packed = _packed(rsm, metadata)
        index = decode(packed[slice(*_section(packed, SegmentSection.CHUNK_INDEX))], "t")
        other = dataclasses.replace(index, plain_checksums=(index.plain_checksums[0] ^ 1,))  # type: ignore[index]
        with pytest.raises(TransformError, match="fail their CRC32C"):
            codec.decode(other, 0, stored)


@pytest.mark.parametrize(("offset", "refusal"), [
    (2, "wrong for 13 chunks"), (9, "fails AES-GCM authentication"), (30, "fails AES-GCM authentication"),
    (19 + 13 * 8, "fails AES-GCM authentication"), (-1, "fails AES-GCM authentication"),
], ids=["flags", "size", "entries", "bitmap", "sealed"])
def test_a_forged_chunk_index_with_valid_checksums_is_refused(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any], offset: int, refusal: str
) -> None:
    # The forger rewrites the packed object and the custom metadata with consistent CRC-32s: only the data key's
    # authentication of the chunk index can tell.
    rsm, metadata, _ = encrypted()
    packed = _packed(rsm, metadata)
    layout = parse_header(packed, "t")
    sections = extract(packed, 0, layout.sections, "t")
    index = bytearray(sections.pop(SegmentSection.CHUNK_INDEX))
    index[offset] ^= 0x01
    slot = sections.pop(SegmentSection.WRAPPED_KEY)
    forged, forged_layout = pack(sections, chunk_index=bytes(index), wrapped_key=slot)  # type: ignore[arg-type]
    rsm.backend.put(keys_for(metadata, False).indexes, forged)
    forged_metadata = dataclasses.replace(
        metadata, custom_metadata=custom.encode(custom.SegmentCustomMetadata(forged_layout, False))
    )
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(ChunkIndexError, match=f"{metadata.remote_log_segment_id.id}.*{refusal}"):
        _read(reader, forged_metadata)


def test_a_flipped_byte_in_the_chunk_index_is_caught_by_the_section_checksum(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any]
) -> None:
    rsm, metadata, _ = encrypted()
    packed = bytearray(_packed(rsm, metadata))
    packed[_section(bytes(packed), SegmentSection.CHUNK_INDEX)[0] + 20] ^= 0x10
    rsm.backend.put(keys_for(metadata, False).indexes, bytes(packed))
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(PackedIndexCorruptError, match="CHUNK_INDEX fails its checksum"):
        _read(reader, metadata)


def _put_slot(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, change: Callable[[bytes], bytes]) -> None:
    packed = bytearray(_packed(rsm, metadata))
    low, high = _section(bytes(packed), SegmentSection.WRAPPED_KEY)
    packed[low:high] = change(bytes(packed[low:high]))
    rsm.backend.put(keys_for(metadata, False).indexes, bytes(packed))


def _with_crc(body: bytes) -> bytes:
    return body[:-4] + struct.pack(">I", zlib.crc32(body[:-4]))


def test_a_flipped_byte_in_the_wrapped_key_slot_is_an_error_naming_the_segment(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any]
) -> None:
    rsm, metadata, _ = encrypted()
    _put_slot(rsm, metadata, lambda slot: slot[:10] + bytes([slot[10] ^ 0x20]) + slot[11:])
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(DataKeyError, match=rf"segment {metadata.remote_log_segment_id}.* is damaged"):
        _read(reader, metadata)


@pytest.mark.parametrize("forgery", ["wrapped-byte", "other-key-id", "other-segment"])
def test_a_forged_wrapped_key_does_not_unwrap(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any], forgery: str
) -> None:
    rsm, metadata, _ = encrypted(seed=1)
    if forgery == "other-segment":
        donor_rsm, donor, _ = encrypted(seed=2)
        donor_slot = _packed(donor_rsm, donor)
        donor_slot = donor_slot[slice(*_section(donor_slot, SegmentSection.WRAPPED_KEY))]
        _put_slot(rsm, metadata, lambda _slot: donor_slot)
    elif forgery == "other-key-id":
        _put_slot(rsm, metadata, lambda slot: _with_crc(WrappedKey("k2", WrappedKey.decode(slot, "t").wrapped)
                                                        .encode()))
    else:
        def flip(slot: bytes) -> bytes:
            wrapped = bytearray(WrappedKey.decode(slot, "t").wrapped)
            wrapped[-1] ^= 1
            return WrappedKey("k1", bytes(wrapped)).encode()

        _put_slot(rsm, metadata, flip)
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(DataKeyError, match=rf"segment {metadata.remote_log_segment_id.id} does not unwrap"):
        _read(reader, metadata)


def test_a_segment_whose_wrapped_key_was_removed_is_refused_not_read_as_plain(
    encrypted: Encrypted, fs: dict[str, Any], ring: dict[str, Any]
) -> None:
    # The segment's custom metadata (kept by Kafka, not in the bucket) says it is encrypted.
    rsm, metadata, _ = encrypted()
    packed = _packed(rsm, metadata)
    sections = extract(packed, 0, parse_header(packed, "t").sections, "t")
    del sections[SegmentSection.WRAPPED_KEY]
    plain_index = sections.pop(SegmentSection.CHUNK_INDEX)
    stripped, _ = pack(sections, chunk_index=plain_index)  # type: ignore[arg-type]
    rsm.backend.put(keys_for(metadata, False).indexes, stripped)
    reader = _fresh(rsm, fs, ring)
    with reader, pytest.raises(RemoteStorageError, match=str(metadata.remote_log_segment_id.id)):
        _read(reader, metadata)


# -- keys ------------------------------------------------------------------------------------------------


def test_the_key_ring_rotates_old_segments_read_under_retired_keys_until_removed(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory
) -> None:
    raw_old, raw_new = json_records(SEGMENT, 1), json_records(SEGMENT, 2)
    with RemoteStorageManager({**fs, **ring, "encryption.enabled": True}) as rsm:
        old = _copy(rsm, with_log(make_segment(seed=1), raw_old))
    rotated = {**fs, **ring, "encryption.enabled": True, "encryption.key.pair.id": "k2"}
    with RemoteStorageManager(rotated) as rsm:
        new = _copy(rsm, with_log(make_segment(seed=2), raw_new))
        assert _read(rsm, old) == raw_old and _read(rsm, new) == raw_new
        assert rsm.data_key_id(keys_for(old, False).indexes) == "k1"
        assert rsm.data_key_id(keys_for(new, False).indexes) == "k2"
    without_k1 = {k: v for k, v in rotated.items() if not k.startswith("encryption.key.pairs.k1")}
    with RemoteStorageManager({**without_k1, "encryption.key.pairs": "k2"}) as rsm:
        assert _read(rsm, new) == raw_new
        with pytest.raises(DataKeyError, match=r"wrapped under key id 'k1', which is not in encryption\.key\.pairs"):
            _read(rsm, old)


def test_an_encrypted_segment_without_any_key_ring_configured_says_so(
    encrypted: Encrypted, fs: dict[str, Any]
) -> None:
    rsm, metadata, _ = encrypted()
    rsm.close()
    with RemoteStorageManager(fs) as reader, pytest.raises(DataKeyError, match="no key ring is configured"):
        _read(reader, metadata)


@pytest.mark.parametrize(("change", "message"), [
    ({"encryption.key.pair.id": ""}, "encryption.enabled=true needs config key encryption.key.pair.id"),
    ({"encryption.key.pair.id": "k9"}, "encryption.key.pair.id is 'k9', which encryption.key.pairs does not list"),
    ({"encryption.key.pairs.k3.key.file": "/x"}, "unknown config key encryption.key.pairs.k3.key.file"),
    ({"encryption.key.pairs.k1.public.key.file": "/x"}, "unknown config key encryption.key.pairs.k1.public"),
    ({"encryption.key.pairs": "k1,k1"}, "listed twice"),
    ({"encryption.key.pairs.k2.kms.key.id": "alias/x"}, "exactly one of encryption.key.pairs.k2.key.file"),
])
def test_an_invalid_encryption_config_is_refused_naming_the_key(
    fs: dict[str, Any], ring: dict[str, Any], change: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        RemoteStorageManager({**fs, **ring, "encryption.enabled": "true", **change})


def test_a_key_file_of_the_wrong_size_is_refused_without_showing_its_content(
    fs: dict[str, Any], ring: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "short.key").write_bytes(b"secret-but-short")
    with pytest.raises(ConfigError, match="must hold a 256-bit key") as caught:
        RemoteStorageManager({**fs, **ring, "encryption.key.pairs.k2.key.file": str(tmp_path / "short.key")})
    assert "secret-but-short" not in str(caught.value)


def test_nothing_secret_reaches_logs_metrics_repr_messages_or_the_stored_objects(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory, caplog: pytest.LogCaptureFixture
) -> None:
    raw = json_records(SEGMENT)
    caplog.set_level(logging.DEBUG)
    with RemoteStorageManager({**fs, **ring, **COMBINATIONS["compressed+encrypted"]}) as rsm:
        metadata = _copy(rsm, with_log(make_segment(), raw))
        assert _read(rsm, metadata) == raw
        packed = _packed(rsm, metadata)
        cipher = _cipher(ring, packed, metadata)
        wrapped = WrappedKey.decode(packed[slice(*_section(packed, SegmentSection.WRAPPED_KEY))], "t")
        data_key = FileKey("k1", Path(ring["encryption.key.pairs.k1.key.file"])).unwrap(
            wrapped.wrapped, metadata.remote_log_segment_id.id)
        kek = Path(ring["encryption.key.pairs.k1.key.file"]).read_bytes()
        with rsm.backend.get_range(keys_for(metadata, False).log, 0) as stream:
            stored_log = stream.read()
        said = " ".join([caplog.text, repr(rsm), json.dumps(rsm.metrics(), default=str), repr(cipher)])
    for secret in (data_key, kek):
        for form in (secret.hex(), base64.b64encode(secret).decode(), repr(secret)):
            assert form not in said
        assert secret not in packed and secret not in stored_log
    assert b'"status"' not in stored_log  # the records are not readable from the bucket


def test_the_wrapped_key_slot_round_trips_and_refuses_what_does_not_fit() -> None:
    slot = WrappedKey("k1", b"w" * 60).encode()
    assert len(slot) == 1024 and WrappedKey.decode(slot, "s") == WrappedKey("k1", b"w" * 60)
    with pytest.raises(DataKeyError, match="does not fit"):
        WrappedKey("k1", b"w" * 1024).encode()


# -- the adapter's data path ----------------------------------------------------------------------------


def test_the_adapter_reads_plain_bytes_from_the_cache_files_of_a_compressed_and_encrypted_segment(
    ring: dict[str, Any], tmp_path: Path
) -> None:
    # Through a real agent over its Unix socket, as the JVM adapter reads (test_rsm_segment_files_rpc.py).
    from test_rsm_segment_files_rpc import Agent

    agent = Agent(tmp_path, {**ring, **COMBINATIONS["compressed+encrypted"], "fetch.chunk.cache.class": "disk",
                             "fetch.chunk.cache.path": tmp_path / "cache"})
    try:
        raw = json_records(SEGMENT)
        metadata = agent.copy(raw)
        assert agent.read_like_the_adapter(metadata, 0, 40_000) == raw
        assert agent.read_like_the_adapter(metadata, 12_345, 0) == raw[12_345:]
    finally:
        agent.close()


def test_changing_any_byte_of_the_chunk_index_or_the_wrapped_key_slot_is_refused(
    fs: dict[str, Any], ring: dict[str, Any], make_segment: SegmentFactory
) -> None:
    # Every byte of a two-chunk segment's chunk index, and of its key slot every meaningful byte, a sample of the
    # padding and the checksum; each change is made as a forger would, with every CRC-32 around it made consistent.
    raw = json_records(2 * CHUNK - 100)
    with RemoteStorageManager({**fs, **ring, **COMBINATIONS["compressed+encrypted"]}) as rsm:
        metadata = _copy(rsm, with_log(make_segment(), raw))
        packed = _packed(rsm, metadata)
    sections = extract(packed, 0, parse_header(packed, "t").sections, "t")
    index, slot = sections.pop(SegmentSection.CHUNK_INDEX), sections.pop(SegmentSection.WRAPPED_KEY)
    trials = [(b, slot) for b in _each_byte_flipped(index, range(len(index)))]
    slot_positions = [*range(100), *random.Random(1).sample(range(100, len(slot) - 4), 12), *range(len(slot) - 4,
                                                                                                     len(slot))]
    trials += [(index, _with_crc(s) if i < len(slot) - 4 else s)
               for i, s in zip(slot_positions, _each_byte_flipped(slot, slot_positions), strict=True)]
    key = keys_for(metadata, False).indexes
    for forged_index, forged_slot in trials:
        forged, layout = pack(sections, chunk_index=forged_index, wrapped_key=forged_slot)  # type: ignore[arg-type]
        with RemoteStorageManager({**fs, **ring}) as reader:
            reader.backend.put(key, forged)
            forged_metadata = dataclasses.replace(
                metadata, custom_metadata=custom.encode(custom.SegmentCustomMetadata(layout, False))
            )
            with pytest.raises(RemoteStorageError, match=str(metadata.remote_log_segment_id.id)):
                _read(reader, forged_metadata)


def _each_byte_flipped(data: bytes, positions: Iterable[int]) -> Iterator[bytes]:
    for position in positions:
        yield data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def test_every_compression_and_encryption_config_key_is_in_the_readme_section() -> None:
    from rsm import keyring, transforms

    readme = (Path(__file__).resolve().parents[2] / "rsm" / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Compression and encryption", 1)[1].split("\n## ", 1)[0]
    names = [key.name for key in (*transforms.CONFIG_KEYS, *keyring.CONFIG_KEYS)] + ["transform.temp.dir"]
    names += [f"{keyring.RING_PREFIX}<id>.{prop}" for prop in keyring.ENTRY_PROPERTIES]
    assert [name for name in names if f"`{name}`" not in section] == []
