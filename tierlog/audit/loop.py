"""The audit loop: archives the metadata partitions it is told to and writes bootstrap snapshots, in one supervised
thread, and keeps the progress its metrics export.

Two hosts run it: the agent, for the metadata partitions its broker leads (tierlog.agent.archiving), and
`tierlog archive`, for every partition. A failure is logged once and counted, retried with backoff, and never ends
the loop; the archiver after a failure resumes from the archive itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rsm.backend import StorageBackend
from rsm.failure_log import RETRY_MAX_S, RepeatedFailureLog
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.audit.snapshots import SnapshotSettings, write_snapshot_now, write_snapshot_of_view

log = logging.getLogger(__name__)

# The one metadata partition whose archiver also writes the snapshots (they cover the whole topic).
SNAPSHOT_PARTITION = 0
STAGES = ("leadership", "archive", "snapshot")


@dataclass(frozen=True, slots=True)
class Assignment:
    """What the loop archives now: the metadata partitions it owns, of all the topic's, and the topic's id."""

    owned: frozenset[int]
    partitions: tuple[int, ...]
    topic_id: str

    @property
    def writes_snapshots(self) -> bool:
        return SNAPSHOT_PARTITION in self.owned


@dataclass(frozen=True, slots=True)
class AuditSettings:
    archiver: ArchiverSettings  # its `partitions` are set from each Assignment
    snapshots: SnapshotSettings | None  # None: no snapshots
    assignment_interval_s: float = 30.0  # how often the assignment is asked again (leadership moves)
    poll_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if self.assignment_interval_s <= 0:
            raise ValueError(f"assignment_interval_s must be > 0, got {self.assignment_interval_s}")


@dataclass
class AuditProgress:
    """What the loop has done, for its metrics; read under the loop's lock."""

    running: bool = False
    assignment: Assignment | None = None
    archived_end: dict[int, int] = field(default_factory=dict)  # offset after the last archived record
    lag: dict[int, int] = field(default_factory=dict)  # records on the topic not archived yet
    last_archived_s: dict[int, float] = field(default_factory=dict)  # unix time the partition was last caught up
    last_snapshot_s: float | None = None  # unix time of the last snapshot written (or found current)
    snapshots_written: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    gaps: int = 0


class AuditLoop:
    """Runs an Archiver over the partitions `assign()` names (asked again every `assignment_interval_s`) and, where
    it owns SNAPSHOT_PARTITION, writes a snapshot every snapshot interval, in one thread until `close()`.

    `assign()` answers the Assignment (it may raise: counted as a `leadership` failure); `topic_ends()` the topic's
    end offsets for a snapshot's creation time."""

    def __init__(self, store: StorageBackend, settings: AuditSettings, assign: Callable[[], Assignment],
                 topic_ends: Callable[[], Mapping[int, int]], manager: Callable[[], Any | None] = lambda: None
                 ) -> None:
        self._store = store
        # The node's own metadata manager, when it runs one: snapshots are then written from its view.
        self._manager = manager
        self._settings = settings
        self._assign = assign
        self._topic_ends = topic_ends
        self._lock = threading.Lock()
        self._progress = AuditProgress()
        self._stop = threading.Event()
        self._archiver: Archiver | None = None
        self._logs = {"leadership": RepeatedFailureLog(log, "finding the metadata partitions to archive"),
                      "archive": RepeatedFailureLog(log, "archiving the metadata topic"),
                      "snapshot": RepeatedFailureLog(log, "writing a bootstrap snapshot")}
        self._earlier_gaps = 0  # gaps found by the archivers before the current one
        self._next_assignment = 0.0
        self._next_snapshot = 0.0
        self._thread = threading.Thread(target=self._run, name="tierlog-audit", daemon=True)

    def start(self) -> AuditLoop:
        with self._lock:
            self._progress.running = True
        self._thread.start()
        return self

    def progress(self) -> AuditProgress:
        """A copy of the loop's progress."""
        with self._lock:
            p = self._progress
            return replace(p, archived_end=dict(p.archived_end), lag=dict(p.lag),
                           last_archived_s=dict(p.last_archived_s), failures=dict(p.failures))

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop, writing what is buffered; False when the loop did not end within `timeout_s` (it is a daemon
        thread: it ends with the process)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the audit loop did not stop within %.0f s; leaving it to end with the process", timeout_s)
            return False
        return True

    # --- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                wait_s = self._cycle()
                if wait_s > 0:
                    self._stop.wait(wait_s)
        finally:
            self._drop_archiver(flush=True)
            with self._lock:
                self._progress.running = False

    def _cycle(self) -> float:
        """One round: the assignment when due, one archiver step, a snapshot when due; how long to wait after."""
        now = time.monotonic()
        if now >= self._next_assignment and not self._attempt("leadership", self._reassign):
            return self._logs["leadership"].retry_s
        assignment = self._progress.assignment
        if assignment is None or not assignment.owned:
            return max(self._next_assignment - time.monotonic(), 0.0)
        if not self._attempt("archive", self._archive_step):
            self._drop_archiver(flush=False)  # the next one resumes from the archive
            return self._logs["archive"].retry_s
        if self._settings.snapshots is not None and assignment.writes_snapshots and \
                time.monotonic() >= self._next_snapshot:
            self._attempt("snapshot", lambda: self._snapshot(assignment))
        return 0.0

    def _attempt(self, stage: str, action: Callable[[], bool]) -> bool:
        """Run one stage; False if it raised. A stage that returns False did not fail but has not shown it works
        again either (an archiver that only buffered records since its last failure)."""
        try:
            healthy = action()
        except Exception as exc:  # Kafka, the bucket, or the scratch view's RocksDB (which raises bare Exception)
            with self._lock:
                self._progress.failures[stage] += 1
            failure = self._logs[stage]
            failure.failed(exc, traceback=True)
            if stage == "snapshot":
                interval = self._settings.snapshots.interval_s if self._settings.snapshots else RETRY_MAX_S
                self._next_snapshot = time.monotonic() + min(failure.retry_s, interval)
            return False
        if healthy:
            self._logs[stage].succeeded()
        return True

    def _reassign(self) -> bool:
        assignment = self._assign()
        self._next_assignment = time.monotonic() + self._settings.assignment_interval_s
        with self._lock:
            previous, self._progress.assignment = self._progress.assignment, assignment
            for gone in set(self._progress.archived_end) - assignment.owned:
                for progress in (self._progress.archived_end, self._progress.lag, self._progress.last_archived_s):
                    progress.pop(gone, None)
        if previous is None or previous.owned != assignment.owned:
            if assignment.owned or previous is not None:
                log.info("archiving metadata partitions %s of %s%s", sorted(assignment.owned) or "none",
                         self._settings.archiver.metadata_topic,
                         " and writing its snapshots" if assignment.writes_snapshots and self._settings.snapshots
                         else "")
            self._drop_archiver(flush=True)
        return True

    def _archive_step(self) -> bool:
        """One archiver step; True once it wrote a file or holds nothing unwritten."""
        assignment = self._progress.assignment
        assert assignment is not None
        if self._archiver is None:
            archiver = Archiver(self._store, replace(self._settings.archiver, partitions=assignment.owned))
            self._archiver = archiver
            archiver.start()
        written = self._archiver.stats.files_written
        self._archiver.step(self._settings.poll_timeout_s)
        self._note_progress(self._archiver, assignment)
        return self._archiver.stats.files_written > written or not self._archiver.holds_unwritten()

    def _note_progress(self, archiver: Archiver, assignment: Assignment) -> None:
        """A partition counts as archived at a time when its archive moved on, or had reached the topic's end."""
        now = time.time()
        with self._lock:
            progress = self._progress
            progress.gaps = self._earlier_gaps + len(archiver.stats.gaps)
            for partition in assignment.owned:
                archived, end = archiver.archived_end(partition), archiver.end_offset(partition)
                before = progress.archived_end.get(partition)
                progress.archived_end[partition] = archived
                if end is not None:
                    progress.lag[partition] = max(end - archived, 0)
                if before is None or archived > before or (end is not None and archived >= end):
                    progress.last_archived_s[partition] = now

    def _drop_archiver(self, flush: bool) -> None:
        archiver, self._archiver = self._archiver, None
        if archiver is None:
            return
        self._earlier_gaps += len(archiver.stats.gaps)
        try:
            archiver.close(flush=flush)
        except Exception as exc:  # closing a consumer that lost Kafka: nothing more to save
            log.warning("closing the archiver of %s: %s", self._settings.archiver.metadata_topic, exc)

    def _snapshot(self, assignment: Assignment) -> bool:
        snapshots = self._settings.snapshots
        assert snapshots is not None
        if self._archiver is not None:
            self._archiver.flush()  # the snapshot holds what this loop has read
        manager = self._manager()
        if manager is not None and manager.metadata_topic == snapshots.metadata_topic:
            # The node's own view: a snapshot costs one read of it, where folding the archive grew with history.
            key: str | None = write_snapshot_of_view(self._store, snapshots, assignment.topic_id, manager.view,
                                                     manager.applied_offsets, self._topic_ends)
        else:
            key = write_snapshot_now(self._store, snapshots, assignment.topic_id, topic_ends=self._topic_ends)
        self._next_snapshot = time.monotonic() + snapshots.interval_s
        with self._lock:
            self._progress.last_snapshot_s = time.time()
            self._progress.snapshots_written += key is not None
        return True
