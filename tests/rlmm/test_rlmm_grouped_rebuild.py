"""A new node reads a large backlog a group of metadata partitions at a time, each group a window that loads fresh
(rlmm.applier GROUP_FILL): the view is the writer's, no window goes through the commits, a load cut short is
removed before its group is loaded again, and a user partition with records on two groups' metadata partitions is
applied in commits onto what the first group loaded; a node stopped mid-ingest starts the partitions it was loading
from nothing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from rlmm_testkit import counting_commits, drive, make_tp, produce_to, register, segment, workload
from rocksdict import WriteBatch
from support import wait_until

from rlmm import RemoteLogMetadataManager, applier, codec, fresh_load
from rlmm import view as view_module
from rlmm import view_format as vf
from rlmm.events import key_of, metadata_partition_for
from rlmm.types import TopicIdPartition
from rlmm.view import MetadataView

PARTITIONS = 4
WINDOW = {"apply.batch.max.records": 2}  # every consume of two records or more is a backlog


@pytest.fixture(autouse=True)
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every backlog is large, and a window keeps few records: each group holds one or two metadata partitions."""
    monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 1)
    monkeypatch.setattr(applier, "WINDOW_MAX_KEPT", 40)


def one_per_metadata_partition() -> list[TopicIdPartition]:
    found: dict[int, TopicIdPartition] = {}
    while len(found) < PARTITIONS:
        tp = make_tp("grouped", 0)
        found.setdefault(metadata_partition_for(tp.topic_id, tp.partition, PARTITIONS), tp)
    return [found[partition] for partition in range(PARTITIONS)]


@pytest.fixture
def writer(make_manager: Callable[..., RemoteLogMetadataManager]) -> Iterator[RemoteLogMetadataManager]:
    """A writer's history on a user partition of each metadata partition."""
    writer = make_manager(broker_id=0, partitions=PARTITIONS)
    tps = one_per_metadata_partition()
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(300 + i), tp, uploads=8) for i, tp in enumerate(tps)})
    writer.wait_caught_up(60)
    yield writer


def assert_same_view(rebuilt: RemoteLogMetadataManager, writer: RemoteLogMetadataManager) -> None:
    rebuilt.wait_caught_up(60)
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    for tp in writer.view.user_partitions():
        register(rebuilt, tp)
        assert rebuilt.list_remote_log_segments(tp) == writer.list_remote_log_segments(tp)


def grouped_windows(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "of metadata partitions" in r.getMessage()]


def test_a_new_node_loads_each_group_of_metadata_partitions_fresh_into_the_writers_view(
    make_manager: Callable[..., RemoteLogMetadataManager], writer: RemoteLogMetadataManager,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=PARTITIONS, **WINDOW)
        assert_same_view(rebuilt, writer)
    windows = grouped_windows(caplog)
    assert len(windows) >= 2 and all("loaded fresh" in window for window in windows), windows
    assert commits == []


def test_a_group_whose_load_was_cut_short_is_removed_and_loaded_again(
    make_manager: Callable[..., RemoteLogMetadataManager], writer: RemoteLogMetadataManager,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # The second group's load stops after its first table went in (the disk filled, the node stopped): the view
    # holds part of that group's user partitions, with no offsets for them.
    ingest = MetadataView._ingest
    loads: list[int] = []

    def cut_short(self: MetadataView, topic: str, files: Iterable[tuple[str, Path]], next_offsets: Mapping[int, int],
                  loading: Sequence[bytes] = (), completes: Collection[bytes] = ()) -> None:
        loads.append(len(loads))
        if len(loads) == 2:
            def first_then_fail() -> Iterator[tuple[str, Path]]:
                yield next(iter(files))
                raise OSError("No space left on device")

            files = first_then_fail()
        ingest(self, topic, files, next_offsets, loading, completes)

    monkeypatch.setattr(MetadataView, "_ingest", cut_short)
    with caplog.at_level(logging.INFO, logger="rlmm"):
        rebuilt = make_manager(broker_id=1, partitions=PARTITIONS, **WINDOW)
        wait_until(lambda: len(loads) >= 3, timeout=60, description="the cut-short group loaded again")
        assert_same_view(rebuilt, writer)
    assert any("removing what a fresh load cut short left" in r.getMessage() for r in caplog.records)


def test_a_user_partition_on_two_groups_metadata_partitions_is_applied_in_commits_onto_the_first_load(
    make_manager: Callable[..., RemoteLogMetadataManager], writer: RemoteLogMetadataManager,
    kafka_bootstrap: str, metadata_topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # A foreign writer that hashes differently put a record of the first user partition on the last metadata
    # partition: loaded fresh there, it would overwrite what the first group loaded.
    moved = next(tp for tp in writer.view.user_partitions()
                 if metadata_partition_for(tp.topic_id, tp.partition, PARTITIONS) == 0)
    stray = segment(moved, 90_000, 90_001, {0: 90_000})
    produce_to(kafka_bootstrap, metadata_topic, PARTITIONS - 1, [(key_of(stray).encode(), codec.encode(stray))])
    wait_until(lambda: writer.view.holds_segment(moved.topic_id, moved.partition, stray.remote_log_segment_id.id),
               timeout=60, description="the writer applying the stray record")
    with caplog.at_level(logging.WARNING, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=PARTITIONS, **WINDOW)
        assert_same_view(rebuilt, writer)
    assert any("read before; replaying the window in commits" in r.getMessage() for r in caplog.records)


def test_a_group_grows_by_the_records_kept_per_offset_of_its_logs_not_per_record_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A compacted log: 1,000 offsets per metadata partition, of which 300 records are left, all kept. Sized by
    # records read (all kept), each next partition would look like 1,000 kept records and never join the group.
    monkeypatch.setattr(applier, "WINDOW_MAX_KEPT", 1000)  # room for 800 kept records (GROUP_FILL)
    reader = object.__new__(applier.MetadataApplier)
    reader._backlog = dict.fromkeys(range(4), 1000)
    reader._group, reader._ungrouped = {0}, [1, 2, 3]
    reader._at_end, reader.halted = {0}, {}
    window = applier.CompactedWindow(lambda request: False, lambda key: False)
    for offset in range(0, 1000, 10):
        for n in range(3):
            window.add(0, offset + n, f"key-{offset}-{n}".encode(), b"value", None)
    assert window.records == window.kept() == 300
    share = reader._kept_share(window)
    assert share == pytest.approx(0.3)
    assert reader._grow_group(window.kept(), share) == [1]  # 300 + 300 fits in 800, a third would not
    assert reader._group == {0, 1} and reader._ungrouped == [2, 3]
    assert reader._kept_share(window) is None  # the new partition is not read to its end yet


@pytest.mark.parametrize("rest", ["a grouped read", "windows in commits"])
def test_a_node_stopped_mid_ingest_starts_the_partitions_it_was_loading_from_nothing(
    make_manager: Callable[..., RemoteLogMetadataManager], writer: RemoteLogMetadataManager, tmp_path: Path,
    metadata_topic: str, monkeypatch: pytest.MonkeyPatch, rest: str,
) -> None:
    # What a node that stopped while it ingested the group of metadata partition 1 left: that group's tables only
    # in part (its epoch index missing), its user partitions noted as loading, and no offset for it.
    state_dir = tmp_path / "stopped"
    built = make_manager(broker_id=1, partitions=PARTITIONS, state_dir=state_dir, **WINDOW)
    built.wait_caught_up(60)
    built.close()
    view = MetadataView.open(state_dir)
    loading = [vf.tp_key_of(tp) for tp in view.user_partitions()
               if metadata_partition_for(tp.topic_id, tp.partition, PARTITIONS) == 1]
    assert loading
    cut = WriteBatch(raw_mode=True)
    for tp_key in loading:
        cut.delete_range(tp_key, tp_key + b"\xff" * 44, view._handles[vf.EPOCH_INDEX])
    cut.delete(vf.applied_key(metadata_topic, 1), view._handles[vf.APPLIED])
    cut.put(view_module._LOADING_KEY, b"".join(loading), view._handles[vf.APPLIED])
    view._write(cut)
    view.close()
    if rest == "windows in commits":  # what is left to read is too small a backlog to read in groups
        monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 10**6)

    resumed = make_manager(broker_id=1, partitions=PARTITIONS, state_dir=state_dir, **WINDOW)
    assert_same_view(resumed, writer)
