"""Bootstrap snapshots: a compacted copy of the metadata log that a new node loads instead of the topic.

The file format is `rlmm.archive`'s; this module materializes a snapshot into an empty view.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlmm.archive import from_archived, read_snapshot
from rlmm.errors import SnapshotError
from rlmm.events import RecordKey
from rlmm.view import ConsumedRecord, MetadataView, apply_records

_BATCH = 5000


def load_snapshot(
    path: str | Path, state_dir: str | Path, progress: Callable[[int], None] | None = None
) -> tuple[str, dict[int, int]]:
    """Materialize a snapshot into an EMPTY state dir; a manager started on it resumes from the end offsets."""
    path = Path(path)
    view_dir = Path(state_dir) / "view"
    if view_dir.exists() and any(view_dir.iterdir()):
        raise SnapshotError(f"state dir {state_dir} already holds a view; load a snapshot only into an empty one")
    topic, ends, datums = read_snapshot(path)
    view = MetadataView.open(state_dir)
    try:
        batch: list[ConsumedRecord] = []
        reached: dict[int, int] = {}
        loaded = 0
        for datum in datums:
            event = from_archived(datum)
            if datum["metadata_topic"] != topic:
                raise SnapshotError(f"{path}: record at offset {datum['offset']} belongs to {datum['metadata_topic']}")
            batch.append(ConsumedRecord(datum["metadata_partition"], datum["offset"],
                                        RecordKey.decode(datum["key"].encode()), event))
            reached[datum["metadata_partition"]] = datum["offset"] + 1
            if len(batch) >= _BATCH:
                apply_records(view, topic, batch, reached)
                loaded += len(batch)
                batch = []
                if progress:
                    progress(loaded)
        apply_records(view, topic, batch, ends)
        loaded += len(batch)
        if progress:
            progress(loaded)
    finally:
        view.close()
    return topic, ends
