"""Segment values shared by the RSM tests (a module with a unique name, so that tests can import it).

conftest.py builds them; tests annotate with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata
from rsm import IndexType, LogSegmentData


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def rsm_config(self, prefix: str, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "storage.backend": "s3",
            "s3.endpoint.url": endpoint or self.endpoint,
            "s3.access.key.id": self.access_key,
            "s3.secret.access.key": self.secret_key,
            "s3.bucket": self.bucket,
            "s3.prefix": prefix,
            **extra,
        }


@dataclass(frozen=True)
class SegmentFixture:
    metadata: RemoteLogSegmentMetadata
    data: LogSegmentData

    @property
    def log_bytes(self) -> bytes:
        return self.data.log_segment.read_bytes()

    def index_bytes(self) -> dict[IndexType, bytes]:
        files = {
            IndexType.OFFSET: self.data.offset_index,
            IndexType.TIMESTAMP: self.data.time_index,
            IndexType.PRODUCER_SNAPSHOT: self.data.producer_snapshot_index,
            IndexType.TRANSACTION: self.data.transaction_index,
        }
        found = {t: p.read_bytes() for t, p in files.items() if p is not None}
        found[IndexType.LEADER_EPOCH] = self.data.leader_epoch_index
        return found

    def with_custom_metadata(self, custom: bytes | None) -> RemoteLogSegmentMetadata:
        return dataclasses.replace(self.metadata, custom_metadata=custom)


def metadata_for(
    segment_id: RemoteLogSegmentId, size: int, custom: bytes | None = None, start_offset: int = 100
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=segment_id,
        start_offset=start_offset,
        end_offset=start_offset + 999,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_000,
        segment_size_in_bytes=size,
        segment_leader_epochs={0: start_offset},
        custom_metadata=custom,
    )


SegmentFactory = Callable[..., SegmentFixture]


def config_of_backend(request: Any, tmp_path: Path, key_prefix: str) -> dict[str, Any]:
    """The rsm config of the backend `request.param` names, its server or emulator started if need be."""
    if request.param == "filesystem":
        return {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote")}
    if request.param in ("gcs", "azure"):
        emulator = request.getfixturevalue(
            "gcs_emulator" if request.param == "gcs" else "azurite"
        )
        return emulator.rsm_config(key_prefix)
    server: S3Server = request.getfixturevalue("s3_server")
    return server.rsm_config(key_prefix)
