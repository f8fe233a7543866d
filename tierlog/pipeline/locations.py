"""Where the archive and the segments live: a directory, or `s3://bucket[/prefix]`, opened as an rsm backend.

The same location string serves Spark (through s3a) and Python (through rsm's storage backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlmm.config import parse_config
from rsm.backend import StorageBackend
from rsm.backends import filesystem, s3
from rsm.metrics import Metrics
from tierlog.pipeline.session import S3Settings


def is_s3(location: str) -> bool:
    return location.startswith(("s3://", "s3a://"))


def s3_backend_config(location: str, settings: S3Settings) -> dict[str, Any]:
    """rsm's S3 config for `s3://bucket[/prefix]`."""
    bucket, _, prefix = location.split("://", 1)[1].partition("/")
    if not bucket:
        raise ValueError(f"location {location!r} names no bucket; write s3://<bucket>[/<prefix>]")
    config: dict[str, Any] = {"s3.bucket": bucket, "s3.prefix": prefix.strip("/")}
    config["s3.region"] = settings.region
    if settings.endpoint:
        config["s3.endpoint.url"] = settings.endpoint
    if settings.access_key and settings.secret_key:
        config["s3.access.key.id"] = settings.access_key
        config["s3.secret.access.key"] = settings.secret_key
    return config


def open_store(location: str, settings: S3Settings | None = None) -> StorageBackend:
    """The storage backend rooted at `location`."""
    if is_s3(location):
        config = s3_backend_config(location, settings or S3Settings.from_env())
        return s3.create(parse_config(config, s3.CONFIG_KEYS, "location"), Metrics())
    if "://" in location and not location.startswith("file://"):
        raise ValueError(f"location {location!r} is neither a directory nor s3://<bucket>[/<prefix>]")
    root = Path(location.removeprefix("file://"))
    return filesystem.create(
        parse_config({"filesystem.root": str(root)}, filesystem.CONFIG_KEYS, "location"), Metrics()
    )
