"""Bootstrap snapshots read from the bucket: rlmm's `SnapshotSource` over a storage backend, so the metadata
manager finds snapshots in S3 (or a directory) without importing a storage client itself."""

from __future__ import annotations

from collections.abc import Iterable

from rsm.backend import RangeStream, StorageBackend, read_all


class BucketSnapshotSource:
    """rlmm's `SnapshotSource` over a storage backend (the agent's bucket)."""

    def __init__(self, store: StorageBackend) -> None:
        self._store = store

    def list_keys(self, prefix: str) -> Iterable[str]:
        return [info.key for info in self._store.list(prefix)]

    def open(self, key: str) -> RangeStream:
        return self._store.get_range(key, 0)

    def read(self, key: str) -> bytes:
        return read_all(self.open(key))
