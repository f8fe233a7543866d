"""The chunk cache: bounded with LRU eviction, every cached chunk checked before it is served (a damaged or
partial file is dropped and fetched again), a full disk degrades to uncached reads, and a restart keeps it warm.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from rsm_testkit import SegmentFactory, SegmentFixture

from rlmm.types import RemoteLogSegmentMetadata
from rsm import ConfigError, RemoteStorageManager
from rsm.chunk_cache import DiskChunkCache

CHUNK = 16 << 10
SEGMENT = 200_000  # 13 chunks, the last one short
CHUNKS = -(-SEGMENT // CHUNK)


def _config(base: dict[str, Any], cache_dir: Path, **extra: Any) -> dict[str, Any]:
    # Files for the adapter come from the cache here, not from the filesystem backend's own files.
    return {
        **base, "chunk.size": CHUNK, "fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(cache_dir),
        "fetch.chunk.cache.prefetch.max.size": 0, "fetch.files.direct": False, **extra,
    }


@pytest.fixture
def fs_config(tmp_path: Path) -> dict[str, Any]:
    return {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote")}


def _copy(rsm: RemoteStorageManager, segment: SegmentFixture) -> RemoteLogSegmentMetadata:
    return segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))


def _read(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, start: int = 0) -> bytes:
    with rsm.fetch_log_segment(metadata, start) as stream:
        return stream.read()


def _counters(rsm: RemoteStorageManager) -> dict[str, int]:
    return rsm.metrics()["counters"]


def _cache_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in cache_dir.glob("*/*") if p.parent.name != ".tmp")


# -- bound and eviction -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_the_cache_stays_within_its_bound_evicting_the_least_recently_used_chunks(
    fs_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory, kind: str
) -> None:
    config = _config(fs_config, tmp_path / "cache", **{
        "fetch.chunk.cache.class": kind, "fetch.chunk.cache.size": 3 * CHUNK})
    with RemoteStorageManager(config) as rsm:
        segment = make_segment(log_size=SEGMENT)
        metadata = _copy(rsm, segment)
        assert _read(rsm, metadata) == segment.log_bytes
        assert rsm.metrics()["chunk_cache"]["bytes"] <= 3 * CHUNK
        assert _counters(rsm)["chunk_cache.evictions"] == CHUNKS - 3
        if kind == "disk":
            assert len(_cache_files(tmp_path / "cache")) == 3
        # The three last chunks are the ones kept: reading them again is all hits.
        before = _counters(rsm).get("chunk_cache.hits", 0)
        assert _read(rsm, metadata, (CHUNKS - 3) * CHUNK) == segment.log_bytes[(CHUNKS - 3) * CHUNK :]
        assert _counters(rsm)["chunk_cache.hits"] - before == 3


def test_a_warm_read_is_served_from_the_cache_without_reading_the_log_object(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    with RemoteStorageManager(_config(backend_config, tmp_path / "cache")) as rsm:
        segment = make_segment(log_size=SEGMENT)
        metadata = _copy(rsm, segment)
        assert _read(rsm, metadata) == segment.log_bytes
        gets = rsm.metrics()["operations"]["backend.get"]["requests"]
        assert _read(rsm, metadata) == segment.log_bytes
        assert rsm.metrics()["operations"]["backend.get"]["requests"] == gets
        counters = _counters(rsm)
        assert (counters["chunk_cache.hits"], counters["chunk_cache.misses"]) == (CHUNKS, 1)
        assert counters["chunk_cache.bytes_written"] == counters["chunk_cache.bytes_served"] == SEGMENT


def test_delete_and_a_new_copy_drop_the_segments_cached_chunks(
    fs_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    with RemoteStorageManager(_config(fs_config, tmp_path / "cache")) as rsm:
        segment = make_segment(log_size=SEGMENT)
        metadata = _copy(rsm, segment)
        _read(rsm, metadata)
        rsm.delete_log_segment_data(metadata)
        assert _cache_files(tmp_path / "cache") == [] and rsm.metrics()["chunk_cache"]["bytes"] == 0


# -- damaged cache files ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flipped-byte", "truncated"])
def test_a_damaged_cache_file_is_dropped_and_the_chunk_fetched_again(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory, damage: str
) -> None:
    cache_dir = tmp_path / "cache"
    with RemoteStorageManager(_config(backend_config, cache_dir)) as rsm:
        segment = make_segment(log_size=SEGMENT)
        metadata = _copy(rsm, segment)
        _read(rsm, metadata)
        victim = cache_dir / str(metadata.remote_log_segment_id.id) / "4"
        content = bytearray(victim.read_bytes())
        if damage == "flipped-byte":
            content[100] ^= 0x20
        else:
            del content[CHUNK // 2 :]
        victim.write_bytes(bytes(content))
        assert _read(rsm, metadata) == segment.log_bytes
        assert _counters(rsm)["chunk_cache.corrupt_dropped"] == 1
        assert victim.read_bytes() == segment.log_bytes[4 * CHUNK : 5 * CHUNK]  # fetched and cached again
        assert _read(rsm, metadata) == segment.log_bytes
        assert _counters(rsm)["chunk_cache.corrupt_dropped"] == 1


def test_a_cache_file_deleted_behind_the_caches_back_is_a_miss(
    fs_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    cache_dir = tmp_path / "cache"
    with RemoteStorageManager(_config(fs_config, cache_dir)) as rsm:
        segment = make_segment(log_size=SEGMENT)
        metadata = _copy(rsm, segment)
        _read(rsm, metadata)
        (cache_dir / str(metadata.remote_log_segment_id.id) / "0").unlink()
        assert _read(rsm, metadata) == segment.log_bytes


# -- a full cache disk ------------------------------------------------------------------------------


@contextlib.contextmanager
def _tiny_filesystem(path: Path, size: str) -> Iterator[bool]:
    """A tmpfs of `size` at `path` when this process may mount one (root); yields whether it did."""
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False
    ).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=False)


def test_a_full_cache_disk_degrades_to_uncached_reads_with_one_log_line_and_a_metric(
    fs_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir = tmp_path / "cache"
    with _tiny_filesystem(cache_dir, "48k") as mounted, contextlib.ExitStack() as faults:
        if not mounted:  # not root: the one fault a mock stands in for
            faults.enter_context(mock.patch.object(
                DiskChunkCache, "_write_file", side_effect=OSError(errno.ENOSPC, "No space left on device")))
        # The bound is far above what the filesystem holds: the disk fills, not the cache.
        with RemoteStorageManager(_config(fs_config, cache_dir, **{"fetch.chunk.cache.size": 64 << 20})) as rsm:
            segment = make_segment(log_size=SEGMENT)
            metadata = _copy(rsm, segment)
            with caplog.at_level(logging.WARNING, logger="rsm.chunk_cache"):
                for _ in range(3):
                    assert _read(rsm, metadata) == segment.log_bytes
            assert _counters(rsm)["chunk_cache.disk_full"] >= 3
            assert len([r for r in caplog.records if "writing to the chunk cache" in r.getMessage()]) == 1
            assert rsm.fetch_log_segment_files(metadata, 0) is None  # the adapter streams instead


# -- restart --------------------------------------------------------------------------------------


def test_a_restarted_manager_finds_its_cache_warm(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    config = _config(backend_config, tmp_path / "cache")
    segment = make_segment(log_size=SEGMENT)
    with RemoteStorageManager(config) as before:
        metadata = _copy(before, segment)
        _read(before, metadata)
    (tmp_path / "cache" / ".tmp" / "half-written").write_bytes(b"x" * 100)
    with RemoteStorageManager(config) as after:
        assert after.metrics()["chunk_cache"] == {"bytes": SEGMENT, "chunks": CHUNKS}
        assert not (tmp_path / "cache" / ".tmp" / "half-written").exists()
        assert _read(after, metadata) == segment.log_bytes
        counters = _counters(after)
        assert counters["chunk_cache.hits"] == CHUNKS and "chunk_cache.misses" not in counters


def test_a_restart_with_a_smaller_bound_evicts_down_to_it(
    fs_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=SEGMENT)
    with RemoteStorageManager(_config(fs_config, tmp_path / "cache")) as before:
        _read(before, _copy(before, segment))
    with RemoteStorageManager(_config(fs_config, tmp_path / "cache", **{"fetch.chunk.cache.size": 2 * CHUNK})) as rsm:
        assert rsm.metrics()["chunk_cache"]["bytes"] <= 2 * CHUNK
        assert len(_cache_files(tmp_path / "cache")) == rsm.metrics()["chunk_cache"]["chunks"] <= 2


# -- config ---------------------------------------------------------------------------------------


def test_a_disk_cache_without_a_path_is_refused_naming_the_key(fs_config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"fetch\.chunk\.cache\.path is required"):
        RemoteStorageManager({**fs_config, "fetch.chunk.cache.class": "disk"})


def test_aivens_cache_class_names_are_understood(fs_config: dict[str, Any], tmp_path: Path) -> None:
    config = {**fs_config, "fetch.chunk.cache.class": "io.aiven.kafka.tieredstorage.fetch.cache.MemoryChunkCache"}
    with RemoteStorageManager(config) as rsm:
        assert rsm.metrics()["chunk_cache"] == {"bytes": 0, "chunks": 0}
