"""Lookups read a partition's published snapshot with no lock while the applier folds batches in: every read sees
the partition as of one whole committed batch, never its segments from one batch and its offset index from another.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rlmm_testkit import make_tp, segment, update_of

from rlmm import view_format as vf
from rlmm.events import key_of
from rlmm.read_model import PartitionSnapshot
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
TOPIC = "tierlog-test-metadata"
GENERATIONS = 1000
READER_TIMEOUT_S = 30.0


def _replacing(tp: TopicIdPartition, generation: int, previous: RemoteLogSegmentMetadata | None
               ) -> tuple[RemoteLogSegmentMetadata, list[RemoteLogSegmentMetadata]]:
    """One batch's events: a new upload of offsets 0..99+generation in epoch 0 that replaces the previous one,
    which is then deleted. At every batch boundary exactly one finished segment holds offset 50."""
    new = segment(tp, 0, 99 + generation, {0: 0}, size=1000 + generation)
    events = [new, new.create_with_update(update_of(new, S.COPY_SEGMENT_FINISHED))]
    if previous is not None:
        started = previous.create_with_update(update_of(previous, S.DELETE_SEGMENT_STARTED))
        events += [started, started.create_with_update(update_of(started, S.DELETE_SEGMENT_FINISHED))]
    return events[1], events


def _whole_batch_problem(snapshot: PartitionSnapshot) -> str | None:
    """What in the snapshot could not be the state after any one batch, if anything."""
    found = snapshot.segment_for_offset(0, 50)
    if found is None:
        return "no segment for offset 50"
    listed = snapshot.list_segments(0)
    if listed != [found]:
        return f"the index answers {found.remote_log_segment_id.id} but the listing holds {len(listed)} segments"
    if snapshot.remote_log_size(0) != found.segment_size_in_bytes:
        return f"size {snapshot.remote_log_size(0)} is not that of segment {found.segment_size_in_bytes}"
    if snapshot.highest_offset_for_epoch(0) != found.end_offset:
        return f"highest offset {snapshot.highest_offset_for_epoch(0)} is not the segment's end {found.end_offset}"
    return None


@contextmanager
def _fine_grained_thread_switches() -> Iterator[None]:
    # A switch every microsecond instead of every 5 ms, so the reader runs in the middle of folds.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def test_lookups_during_folding_see_each_partition_as_of_one_whole_batch(tmp_path: Path) -> None:
    view = MetadataView.open(tmp_path)
    tp = make_tp("replaced", 0)
    key = vf.tp_key_of(tp)

    def watch() -> None:
        view.model.watch(key)

    try:
        fold_while_reading(view, tp, watch, lambda: view.model.snapshots[key])
    finally:
        view.close()


def fold_while_reading(view: MetadataView, tp: TopicIdPartition, watch: Callable[[], None],
                       snapshot: Callable[[], PartitionSnapshot]) -> None:
    """Fold batch after batch that replaces tp's segment while a reader thread checks `snapshot()` (after `watch()`)
    shows tp as of one whole batch, and that it ends on the newest one."""
    offset = 0

    def commit(events: list[RemoteLogSegmentMetadata]) -> None:
        nonlocal offset
        records = [ConsumedRecord(0, offset + i, key_of(event), event) for i, event in enumerate(events)]
        offset += len(records)
        apply_records(view, TOPIC, records, {0: offset})

    current, events = _replacing(tp, 0, None)
    commit(events)
    watch()
    problems: list[str] = []
    reads = 0
    stop = threading.Event()

    def read() -> None:
        nonlocal reads
        deadline = time.monotonic() + READER_TIMEOUT_S
        while not stop.is_set() and time.monotonic() < deadline:
            problem = _whole_batch_problem(snapshot())
            if problem is not None:
                problems.append(problem)
            reads += 1

    reader = threading.Thread(target=read, daemon=True)
    with _fine_grained_thread_switches():
        reader.start()
        try:
            for generation in range(1, GENERATIONS + 1):
                current, events = _replacing(tp, generation, current)
                commit(events)
        finally:
            stop.set()
            reader.join(READER_TIMEOUT_S)
    assert not reader.is_alive()
    assert problems == []
    assert reads > GENERATIONS  # the reader ran throughout, not only before or after the folds
    assert snapshot().segment_for_offset(0, 50) == current
