"""The view's segment totals: rescanned only when the view changed, and spaced by the scan's own duration, on a
real RocksDB view."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from rlmm import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rlmm.view import MetadataView
from tierlog.agent.rlmm_metrics import SCAN_SPACING, ViewScan

TP = TopicIdPartition(uuid.uuid4(), "orders", 0)


@dataclass(frozen=True)
class Holder:
    """What ViewScan reads of a manager: its view."""

    view: MetadataView


class TickingClock:
    """Advances one second per reading: every scan appears to take a second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def add_segments(view: MetadataView, count: int, first: int, applied: int) -> None:
    batch = view.batch()
    for i in range(first, first + count):
        batch.put_segment(RemoteLogSegmentMetadata(
            RemoteLogSegmentId(TP, uuid.uuid4()), i * 100, i * 100 + 99, 1, 1, 1, 1000, {0: i * 100},
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        ))
    batch.commit("m", {0: applied})


def test_totals_count_every_state_and_follow_a_changed_view(tmp_path: Path) -> None:
    view = MetadataView.open(tmp_path / "view")
    try:
        holder, scan = Holder(view), ViewScan(TickingClock())
        add_segments(view, 3, 0, applied=1)
        first = scan.get(holder, {0: 1})
        assert first is not None
        assert first.segments["COPY_SEGMENT_FINISHED"] == 3 and first.segment_bytes["COPY_SEGMENT_FINISHED"] == 3000
        assert first.segments["DELETE_SEGMENT_STARTED"] == 0  # every state is exported, zero or not

        add_segments(view, 2, 3, applied=2)
        assert scan.get(holder, {0: 1}) is first  # same applied offsets: the view did not change, no rescan
    finally:
        view.close()


def test_a_rescan_waits_spacing_times_the_last_scans_duration(tmp_path: Path) -> None:
    view = MetadataView.open(tmp_path / "view")
    try:
        clock = TickingClock()
        holder, scan = Holder(view), ViewScan(clock)
        add_segments(view, 3, 0, applied=1)
        assert scan.get(holder, {0: 1}).segments["COPY_SEGMENT_FINISHED"] == 3  # type: ignore[union-attr]
        add_segments(view, 2, 3, applied=2)

        # The scan took one (ticking) second: the changed view is not rescanned for SCAN_SPACING seconds.
        assert scan.get(holder, {0: 2}).segments["COPY_SEGMENT_FINISHED"] == 3  # type: ignore[union-attr]
        clock.now += SCAN_SPACING
        assert scan.get(holder, {0: 2}).segments["COPY_SEGMENT_FINISHED"] == 5  # type: ignore[union-attr]
    finally:
        view.close()
