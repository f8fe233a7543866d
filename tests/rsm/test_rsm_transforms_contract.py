"""The rsm contract suite (test_rsm_contract.py) again, with compression, encryption and both on (the plain contract
is test_rsm_contract.py itself): on the filesystem and S3 (the transforms sit above the backend; GCS and Azure run
the plain contract, which keeps the suite's time), with the disk chunk cache (its reads fetch, decrypt and decompress
chunks, and serve them again from the cache; the uncached path is covered by test_rsm_transforms.py), over segments
whose first half compresses (JSON records) and second half does not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import test_rsm_contract
from rsm_testkit import SegmentFactory, SegmentFixture, config_of_backend
from test_rsm_contract import ALL_TYPES, CHUNK_SIZE
from test_rsm_transforms import json_records

from rsm import RemoteStorageManager

# Where a transformed segment behaves differently from a plain one: redefined below.
_REDEFINED = frozenset({
    "rsm_config", "test_copy_is_idempotent_a_retry_overwrites",
    "test_metrics_count_requests_bytes_and_errors_per_operation",
})
# Every contract test (and the module's manager fixture), collected again here with this module's fixtures.
globals().update({
    name: value for name, value in vars(test_rsm_contract).items()
    if (name.startswith("test_") or name == "manager") and name not in _REDEFINED
})

# Generated once and repeated: large segments (the memory test's 24 MiB) cost no time to build.
_RECORDS = json_records(256 << 10)


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.services)])
def backend_config(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> dict[str, Any]:
    return config_of_backend(request, tmp_path, key_prefix)


@pytest.fixture(params=["compressed", "encrypted", "compressed+encrypted"])
def transforms(request: pytest.FixtureRequest) -> frozenset[str]:
    return frozenset(request.param.split("+"))


@pytest.fixture
def rsm_config(backend_config: dict[str, Any], transforms: frozenset[str], tmp_path: Path) -> dict[str, Any]:
    config = {
        **backend_config, "chunk.size": CHUNK_SIZE,
        "fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(tmp_path / "chunk-cache"),
    }
    if "compressed" in transforms:
        config["compression.enabled"] = "true"
    if "encrypted" in transforms:
        (tmp_path / "kek").write_bytes(os.urandom(32))
        config.update({
            "encryption.enabled": "true", "encryption.key.pairs": "kek", "encryption.key.pair.id": "kek",
            "encryption.key.pairs.kek.key.file": str(tmp_path / "kek"),
        })
    return config


@pytest.fixture
def make_segment(make_segment: SegmentFactory) -> SegmentFactory:
    def make(**options: Any) -> SegmentFixture:
        segment = make_segment(**options)
        log = segment.data.log_segment
        size = log.stat().st_size
        half = size // 2
        compressible = (_RECORDS * (half // len(_RECORDS) + 1))[:half]
        with open(log, "r+b") as out:
            out.write(compressible)
        return segment

    return make


# -- where a transformed segment differs from a plain one -------------------------------------------------------


def test_copy_is_idempotent_a_retry_overwrites(manager: RemoteStorageManager, make_segment: SegmentFactory) -> None:
    # An encrypted retry is under a fresh data key, so it returns other custom metadata; the retry's is the one that
    # reads.
    segment = make_segment()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    second = manager.copy_log_segment_data(segment.metadata, segment.data)
    assert len(list(manager.backend.list(""))) == 2
    fetched = manager.fetch_indexes(segment.with_custom_metadata(second), ALL_TYPES)
    assert {t: s.read() for t, s in fetched.items()} == segment.index_bytes()
    with manager.fetch_log_segment(segment.with_custom_metadata(second), 0) as stream:
        assert stream.read() == segment.log_bytes


def test_metrics_count_requests_bytes_and_errors_per_operation(
    manager: RemoteStorageManager, copied: SegmentFixture, transforms: frozenset[str]
) -> None:
    with manager.fetch_log_segment(copied.metadata, 0) as stream:
        stream.read()
    ops = manager.metrics()["operations"]
    assert ops["rsm.fetch_log_segment"]["bytes"] == len(copied.log_bytes)
    counters = manager.metrics()["counters"]
    assert counters["transform.original_bytes"] == len(copied.log_bytes)
    stored = counters["transform.stored_bytes"]
    if "compressed" in transforms:
        # The compressible half of the segment travels compressed.
        assert ops["backend.get"]["bytes"] < 0.75 * len(copied.log_bytes)
        assert stored < len(copied.log_bytes)
    else:
        # Each encrypted chunk carries its nonce and tag: a little more than the plain bytes, never less.
        assert len(copied.log_bytes) < stored < 1.01 * len(copied.log_bytes)
        assert ops["backend.get"]["bytes"] >= len(copied.log_bytes)
