"""A full state.dir: writes fail by their deadline with a clear error, the view is never corrupted, the same
manager recovers once space returns, and close() never raises RocksDB's errors. Runs on a small tmpfs."""

from __future__ import annotations

import contextlib
import errno
import itertools
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rlmm_testkit import WINDOWED, drive, make_tp, on_distinct_metadata_partitions, register, segment, workload
from support import wait_until

from rlmm import RemoteLogMetadataManager, RemoteStorageError, TopicIdPartition, applier, fresh_load
from rlmm.applier import MetadataApplier, WindowRecord
from rlmm.errors import MetadataTimeoutError

MakeManager = Callable[..., RemoteLogMetadataManager]
WRITE_TIMEOUT_S = 3.0
RECOVERY_LIMIT_S = 40.0
MAX_WRITES_TO_FILL_A_PAGE = 100


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs, unmounted afterwards; skipped where this process may not mount."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


@contextlib.contextmanager
def disk_filled(mount: Path) -> Iterator[None]:
    """Fill the file system down to its last byte, so not even a small append fits; free it on exit."""
    filler = mount / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    try:
        yield
    finally:
        filler.unlink()


def _write_succeeds(manager: RemoteLogMetadataManager, tp: TopicIdPartition, starts: Iterator[int]) -> bool:
    start = next(starts)
    future = manager.add_remote_log_segment_metadata(segment(tp, start, start + 9, {0: start}))
    try:
        future.result(timeout=WRITE_TIMEOUT_S + 5)
    except RemoteStorageError:
        return False
    return True


def test_writes_on_a_full_disk_fail_by_their_deadline_and_the_same_manager_recovers_when_space_returns(
    make_manager: MakeManager, small_disk: Path
) -> None:
    manager = make_manager(state_dir=small_disk / "state", **{"write.timeout.ms": int(WRITE_TIMEOUT_S * 1000)})
    tp = make_tp("disk")
    register(manager, tp)
    manager.add_remote_log_segment_metadata(segment(tp, 0, 9, {0: 0})).result(timeout=WRITE_TIMEOUT_S)

    starts = itertools.count(10, 10)
    with disk_filled(small_disk):
        # The WAL's last page still has a little room: write until the first write finds none.
        for _ in range(MAX_WRITES_TO_FILL_A_PAGE):
            start = next(starts)
            started = time.monotonic()
            future = manager.add_remote_log_segment_metadata(segment(tp, start, start + 9, {0: start}))
            error = future.exception(timeout=WRITE_TIMEOUT_S + 5)
            if error is not None:
                break
        assert isinstance(error, MetadataTimeoutError) and "No space left on device" in str(error), error
        assert time.monotonic() - started <= WRITE_TIMEOUT_S + 1.0
    unapplied = start

    freed = time.monotonic()
    wait_until(lambda: _write_succeeds(manager, tp, starts), timeout=RECOVERY_LIMIT_S,
               description="a write after space returns")
    print(f"\ndisk full: recovered {time.monotonic() - freed:.2f}s after space returned")
    manager.wait_caught_up(30)
    # The record Kafka acknowledged while the disk was full is applied now, and the view equals a fresh rebuild.
    assert unapplied in [md.start_offset for md in manager.list_remote_log_segments(tp)]
    fresh = make_manager(broker_id=9)
    fresh.wait_caught_up(30)
    assert manager.view_digest() == fresh.view_digest()


def test_close_on_a_full_disk_raises_nothing(make_manager: MakeManager, small_disk: Path) -> None:
    manager = make_manager(state_dir=small_disk / "state", **{"write.timeout.ms": int(WRITE_TIMEOUT_S * 1000)})
    tp = make_tp("disk-close")
    register(manager, tp)
    with disk_filled(small_disk):
        starts = itertools.count(0, 10)
        wait_until(lambda: not _write_succeeds(manager, tp, starts), timeout=MAX_WRITES_TO_FILL_A_PAGE,
                   description="a write failing on the full disk")
        manager.close()


@pytest.mark.parametrize("with_worker", [False, True], ids=["one process", "with a fold worker"])
def test_a_new_nodes_first_window_loaded_onto_a_full_disk_is_loaded_again_once_space_returns(
    make_manager: MakeManager, small_disk: Path, monkeypatch: pytest.MonkeyPatch, with_worker: bool
) -> None:
    # With a worker (rlmm.fresh_load), the full disk fails its share's file or tables, or the node's own.
    partitions = 2 if with_worker else 1
    monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 1 if with_worker else fresh_load.WORKER_MIN_KEPT)
    # The windows the applier reads itself (a full disk under group workers: test_rlmm_group_workers).
    monkeypatch.setattr(applier, "GROUP_WORKERS", 0)
    writer = make_manager(broker_id=0, partitions=partitions)
    tps = on_distinct_metadata_partitions() if with_worker else (make_tp("disk-rebuild"),)
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(5 + i), tp, uploads=30) for i, tp in enumerate(tps)})
    writer.wait_caught_up(60)
    load = MetadataApplier._load_fresh
    failures: list[BaseException] = []
    applied_before_retry: list[dict[int, int]] = []

    # The fault: the disk is full while the first window's tables are written, and has room again right after.
    def load_once_on_a_full_disk(self: MetadataApplier, replay: list[WindowRecord], ends: dict[int, int]) -> bool:
        if failures:
            applied_before_retry.append(dict(self.applied))
            return load(self, replay, ends)
        with disk_filled(small_disk):
            try:
                return load(self, replay, ends)
            except BaseException as exc:
                failures.append(exc)
                raise

    monkeypatch.setattr(MetadataApplier, "_load_fresh", load_once_on_a_full_disk)
    rebuilt = make_manager(broker_id=1, state_dir=small_disk / "state", partitions=partitions, **WINDOWED)
    wait_until(lambda: applied_before_retry, timeout=RECOVERY_LIMIT_S, description="the load tried again")
    rebuilt.wait_caught_up(60)
    assert "No space left on device" in str(failures[0])
    assert applied_before_retry[0] == {}  # nothing of the failed load counted as applied
    assert rebuilt.view_digest() == writer.view_digest()
    register(rebuilt, *tps)
    for tp in tps:
        assert rebuilt.list_remote_log_segments(tp) == writer.list_remote_log_segments(tp)
    assert list(rebuilt.view.path.parent.glob("*.fold")) == []  # the worker's files went into the view or away
