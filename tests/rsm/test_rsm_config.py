"""RSM configuration: Kafka-style dotted keys, string or native values, failures that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsm import ConfigError, RemoteStorageManager
from rsm.manager import parse_rsm_config

S3_BASE = {"storage.backend": "s3", "s3.bucket": "b", "s3.endpoint.url": "http://127.0.0.1:1"}


def test_an_unknown_key_fails_construction_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) s3\.bukket"):
        RemoteStorageManager({"filesystem.root": str(tmp_path), "s3.bukket": "b"})


def test_an_invalid_number_fails_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"s3\.multipart\.concurrency has invalid value 'many'"):
        RemoteStorageManager({**S3_BASE, "s3.multipart.concurrency": "many"})


def test_a_part_size_below_s3s_minimum_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"s3\.multipart\.part\.size\.bytes must be >= 5242880"):
        RemoteStorageManager({**S3_BASE, "s3.multipart.part.size.bytes": "1048576"})


def test_the_s3_backend_requires_a_bucket() -> None:
    with pytest.raises(ConfigError, match=r"s3\.bucket is required"):
        RemoteStorageManager({"storage.backend": "s3"})


def test_the_filesystem_backend_requires_a_root() -> None:
    with pytest.raises(ConfigError, match=r"filesystem\.root is required"):
        RemoteStorageManager({})


def test_an_unknown_backend_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"storage\.backend must be one of azure, filesystem, gcs, s3, got 'hdfs'"):
        RemoteStorageManager({"storage.backend": "hdfs"})


def test_an_access_key_without_a_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"s3\.access\.key\.id and s3\.secret\.access\.key"):
        RemoteStorageManager({**S3_BASE, "s3.access.key.id": "AKIA"})


def test_keys_of_a_backend_not_selected_are_accepted(tmp_path: Path) -> None:
    _core, name, backend = parse_rsm_config({"filesystem.root": str(tmp_path), "s3.bucket": "b"})
    assert name == "filesystem" and backend == {"filesystem.root": str(tmp_path)}


def test_string_values_as_a_broker_passes_them_equal_native_values() -> None:
    as_strings = parse_rsm_config({
        **S3_BASE, "storage.hash.prefix": "true", "index.cache.max.bytes": "1024",
        "s3.path.style.access": "false", "s3.retries.max": "0",
    })
    native = parse_rsm_config({
        **S3_BASE, "storage.hash.prefix": True, "index.cache.max.bytes": 1024,
        "s3.path.style.access": False, "s3.retries.max": 0,
    })
    assert as_strings == native
