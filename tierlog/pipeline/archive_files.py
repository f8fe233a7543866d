"""The audit archive read in this process, without Spark: its files, their records, and the compaction and fold
every in-process job starts from. Nothing here imports pyspark, so small jobs run where only the base install is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rlmm import state
from rlmm.archive import ARCHIVE_ROOT, ArchiveFile, from_archived, parse_archive_key, read_archive_file
from rlmm.events import RecordKey
from rsm.backend import StorageBackend, read_all
from tierlog.errors import TierlogError

# Below this many archive bytes (Avro, deflated) a job runs in-process: starting Spark costs more than
# folding some hundred thousand records here.
SMALL_ARCHIVE_BYTES = 32 * 2**20


class ArchiveNotFoundError(TierlogError):
    """There is no archive where a job was told to look."""


def archive_files(store: StorageBackend, metadata_topic: str) -> list[ArchiveFile]:
    """The archive files of `metadata_topic`, by metadata partition and offset; none is an error."""
    prefix = f"{ARCHIVE_ROOT}/{metadata_topic}/"
    found = [f for f in (parse_archive_key(o.key, o.size) for o in store.list(prefix)) if f is not None]
    if not found:
        raise ArchiveNotFoundError(
            f"no audit archive of metadata topic {metadata_topic!r} under {store.describe(prefix)}; "
            "run `tierlog archive` first, or check --archive and metadata.topic.name"
        )
    return sorted(found, key=lambda f: (f.metadata_partition, f.first_offset))


def read_archive_datums(
    store: StorageBackend, files: list[ArchiveFile], progress: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """Every archived record (an archive datum) of `files`, in (metadata partition, offset) order."""
    datums: list[dict[str, Any]] = []
    read = 0
    for f in files:
        datums.extend(read_archive_file(read_all(store.get_range(f.key, 0))))
        read += f.size
        if progress:
            progress(read)
    return datums


def compact_datums(datums: Iterable[dict[str, Any]], up_to: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """As Spark's `replay.compacted`: the newest non-tombstone record of every key (below `up_to` per metadata
    partition), in (metadata partition, offset) order."""
    newest: dict[str, dict[str, Any]] = {}
    for datum in datums:
        if up_to is not None and datum["offset"] >= up_to.get(datum["metadata_partition"], 0):
            continue
        held = newest.get(datum["key"])
        if held is None or datum["offset"] > held["offset"]:
            newest[datum["key"]] = datum
    kept = [d for d in newest.values() if from_archived(d) is not None]
    return sorted(kept, key=lambda d: (d["metadata_partition"], d["offset"]))


def fold_datums(datums: Iterable[dict[str, Any]]) -> state.InMemoryState:
    """Apply archive datums, in order, to one state. One user partition's records all sit in one metadata
    partition, so the (metadata partition, offset) order is each user partition's topic order."""
    folded = state.InMemoryState()
    for datum in datums:
        state.apply_record(folded, RecordKey.decode(datum["key"].encode()), from_archived(datum), datum["offset"])
    return folded
