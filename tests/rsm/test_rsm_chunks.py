"""Segment integrity by chunk: a CRC32C per chunk recorded at upload and checked on every read, cached or not,
on both backends; segments written before chunk indexes keep reading as they did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import SegmentFactory, SegmentFixture

from rsm import RemoteStorageManager
from rsm.chunk_index import ChunkCorruptError, ChunkIndex, build, checksum, decode, encode
from rsm.custom_metadata import SegmentCustomMetadata
from rsm.custom_metadata import encode as encode_custom
from rsm.keys import keys_for
from rsm.packed_index import pack

CHUNK = 16 << 10


def _config(backend_config: dict[str, Any], tmp_path: Path, cached: bool) -> dict[str, Any]:
    config = {**backend_config, "chunk.size": CHUNK}
    if cached:
        config |= {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(tmp_path / "cache")}
    return config


def _flip_byte(rsm: RemoteStorageManager, segment: SegmentFixture, position: int) -> None:
    key = keys_for(segment.metadata, hashed=False).log
    damaged = bytearray(segment.log_bytes)
    damaged[position] ^= 0x01
    rsm.backend.put(key, bytes(damaged))


# -- the format -------------------------------------------------------------------------------------


def test_the_chunk_index_of_a_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(bytes(range(256)) * 300)
    index = build(path, 4096)
    assert index.count == 19 and index.original_length(18) == 256 * 300 - 18 * 4096
    assert index.checksums[0] == checksum(path.read_bytes()[:4096])
    assert decode(encode(index), "s") == index


def test_a_chunk_index_with_stored_lengths_places_each_chunk_after_the_previous_one() -> None:
    # The layout a per-chunk transform (compression, encryption) will write.
    index = ChunkIndex(100, 250, (1, 2, 3), stored_lengths=(40, 70, 10))
    assert [index.stored_start(n) for n in range(3)] == [0, 40, 110]
    assert decode(encode(index), "s") == index


def test_a_chunk_index_whose_count_does_not_match_the_size_is_refused() -> None:
    with pytest.raises(Exception, match="lists 2 chunks"):
        ChunkIndex(100, 250, (1, 2))


# -- reads ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "disk-cache"])
def test_a_flipped_byte_in_the_stored_log_object_is_an_error_naming_segment_and_chunk(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory, cached: bool
) -> None:
    with RemoteStorageManager(_config(backend_config, tmp_path, cached)) as rsm:
        segment = make_segment()
        metadata = segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))
        _flip_byte(rsm, segment, 5 * CHUNK + 7)
        served = bytearray()
        with pytest.raises(ChunkCorruptError) as caught, rsm.fetch_log_segment(metadata, 0) as stream:
            while piece := stream.read(4096):
                served += piece
        # Everything before the damaged chunk, and nothing of it.
        assert bytes(served) == segment.log_bytes[: 5 * CHUNK]
        assert f"segment {metadata.remote_log_segment_id} chunk 5 " in str(caught.value)
        assert rsm.metrics()["counters"]["chunk.checksum_failures"] == 1


def test_a_damaged_chunk_fetched_into_the_cache_for_files_fails_naming_it_and_leaves_no_file(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    config = _config(backend_config, tmp_path, cached=True) | {"fetch.files.direct": False}
    with RemoteStorageManager(config) as rsm:
        segment = make_segment()
        metadata = segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))
        _flip_byte(rsm, segment, 5 * CHUNK + 7)
        with pytest.raises(ChunkCorruptError, match=f"segment {metadata.remote_log_segment_id} chunk 5 "):
            rsm.fetch_log_segment_files(metadata, 4 * CHUNK, 7 * CHUNK - 1)
        assert rsm.prefetch_idle(30)
        cached = tmp_path / "cache" / str(metadata.remote_log_segment_id.id)
        # The chunk before it is cached whole; nothing of the damaged one, not even a temporary file.
        assert (cached / "4").read_bytes() == segment.log_bytes[4 * CHUNK : 5 * CHUNK]
        assert not (cached / "5").exists() and not any((tmp_path / "cache" / ".tmp").iterdir())


def test_a_damaged_chunk_outside_the_requested_range_does_not_fail_the_read(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    with RemoteStorageManager(_config(backend_config, tmp_path, cached=False)) as rsm:
        segment = make_segment()
        metadata = segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))
        _flip_byte(rsm, segment, 9 * CHUNK)
        with rsm.fetch_log_segment(metadata, CHUNK, 3 * CHUNK) as stream:
            assert stream.read() == segment.log_bytes[CHUNK : 3 * CHUNK + 1]


@pytest.mark.parametrize("with_custom_metadata", [True, False], ids=["v1-custom-metadata", "no-custom-metadata"])
def test_a_segment_written_before_chunk_indexes_reads_as_before(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory, with_custom_metadata: bool
) -> None:
    segment = make_segment()
    keys = keys_for(segment.metadata, hashed=False)
    with RemoteStorageManager(_config(backend_config, tmp_path, cached=True)) as rsm:
        # As the previous release wrote it: packed index version 1, custom metadata version 1.
        packed, layout = pack(segment.index_bytes())
        rsm.backend.put(keys.log, segment.data.log_segment)
        rsm.backend.put(keys.indexes, packed)
        custom = encode_custom(SegmentCustomMetadata(layout, hashed_keys=False)) if with_custom_metadata else None
        with rsm.fetch_log_segment(segment.with_custom_metadata(custom), 1000, 150_000) as stream:
            assert stream.read() == segment.log_bytes[1000:150_001]
        assert rsm.fetch_log_segment_files(segment.with_custom_metadata(custom), 0) is None
