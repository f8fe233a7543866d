"""The read side of the manager: consume the metadata topic, apply each batch to the view, commit, halt, rewind.

Like Kafka's ConsumerTask. A record that cannot be decoded or applied halts only its metadata partition; a
failed commit (disk full) is retried with backoff and the view reopened; end offsets for readiness are
fetched on a thread of their own, so no admin call ever runs on the apply path. A backlog (a rebuild, a node
that was away) is read in windows, each replayed as Kafka's log cleaner would leave it (`CompactedWindow`).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import select
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError, Message

from rlmm import codec, events, fresh_load, state
from rlmm import view_format as vf
from rlmm.backlog_window import CompactedWindow, WindowRecord, holds_nothing, holds_segment, position
from rlmm.errors import InvalidArgumentError, MetadataLogError, RemoteStorageError
from rlmm.event_log import EventConsumer, OffsetReader
from rlmm.events import SEGMENT_KEY_PREFIX
from rlmm.types import RemotePartitionDeleteMetadata, RemotePartitionDeleteState, TopicIdPartition
from rlmm.view import ConsumedRecord, FreshState, FreshTables, MetadataView
from rlmm.writer import Append, MetadataWriter, request_of

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 10.0
# End offsets are asked for at most this often while partitions wait to become ready.
OFFSETS_INTERVAL_S = 0.2
OFFSETS_TIMEOUT_S = 5.0
# How often a healthy applier restamps the view's "last applied" time: at most this often while batches
# commit (one small put, not one per batch), and this often on a quiet topic.
STAMP_MIN_INTERVAL_S = 1.0
STAMP_INTERVAL_S = 10.0
# A backlog is replayed in windows, each committed with the offsets it reaches. A window holds the newest record of
# each key it read, so what it holds follows the live state, not the history: it ends once it holds WINDOW_MAX_KEPT
# records (the memory a rebuild needs beyond the view's own), or after WINDOW_MAX_RECORDS records or WINDOW_MAX_S
# (the work a crash loses). The longer a window, the fewer records a rebuild decodes: at 1M events of history,
# 50k-record windows replayed 160k records, one window 47k. Its records are applied and committed
# WINDOW_COMMIT_RECORDS at a time, so that few are held decoded at once.
WINDOW_MAX_KEPT = 100_000
# A large backlog of metadata partitions the view never applied (a new node's) is read a group of partitions at a
# time, each group a window of its own: the user partitions of different metadata partitions never share state, so
# each such window loads fresh (folded in memory, on two cores, and written as tables: about 15 us per record kept),
# where windows across every partition would load only the first fresh and apply the others in commits, each
# record's state read from RocksDB (about 40 us). A group takes as many partitions as the window is expected to keep
# up to this share of WINDOW_MAX_KEPT, by the share of records kept so far; the first starts with one partition and
# grows once that one is read.
GROUP_FILL = 0.8
# Worker processes reading a new node's groups (MetadataApplier._load_in_workers): one per core of a 2-core broker.
# A group is one window: a worker gives up on one keeping more than GROUP_WORKER_MAX_KEPT records (a metadata
# partition of that many live segments; about 2.5 KiB each in the worker while it folds: at 10M live segments over
# 50 metadata partitions, up to 520 MiB per worker), which the applier then reads in windows of its own bound.
GROUP_WORKERS = 2
GROUP_WORKER_MAX_KEPT = 3 * WINDOW_MAX_KEPT
WINDOW_MAX_RECORDS = 5_000_000
WINDOW_MAX_S = 20.0
WINDOW_COMMIT_RECORDS = 5_000
# A backlog has ended when every metadata partition was read to its end, or when no record came for
# WINDOW_IDLE_S (a partition without a leader must not hold the others' window open). A consume waits at most
# WINDOW_POLL_S for a full batch: the last one of a backlog always waits it out.
WINDOW_POLL_S = 0.01
WINDOW_IDLE_S = 1.0
# How long a node that applied nothing yet waits for its first full batch.
FIRST_FILL_S = 0.25


@dataclass(frozen=True)
class ApplierSettings:
    metadata_topic: str
    topic_id: str
    broker_id: int
    batch_max_records: int
    fold_worker: bool = True  # a new node's first window, when large, is folded on two cores (rlmm.fresh_load)


class _ApplyFailure(Exception):
    def __init__(self, record: ConsumedRecord, cause: Exception) -> None:
        super().__init__(str(cause))
        self.record = record
        self.cause = cause


class _CommitFailure(Exception):
    """Writing the view failed (disk full, I/O error): transient, retried after reopening the view."""


class MetadataApplier:
    """Applies the metadata topic to the view; `applied` and `halted` are read by the manager under the lock."""

    def __init__(
        self, settings: ApplierSettings, view: MetadataView, consumer: EventConsumer, offsets: OffsetReader,
        writer: MetadataWriter, lock: threading.Condition,
        registered: dict[TopicIdPartition, int | None], metadata_partition: Callable[[TopicIdPartition], int],
        on_targets: Callable[[], None] | None = None, on_unready: Callable[[Collection[bytes]], None] | None = None,
    ) -> None:
        _fix_mmap_threshold()
        self._settings = settings
        self._view = view
        self._consumer = consumer
        self._offsets = offsets
        self._writer = writer
        self._lock = lock
        self._registered = registered
        self._metadata_partition = metadata_partition
        self._on_targets = on_targets  # called under the lock once registered partitions were given their targets
        self._on_unready = on_unready  # called under the lock with partitions loaded ahead, then taken back
        view.discard_unfinished_load()  # whatever reads the partitions it names next, they start from nothing
        view.discard_preloaded()
        # User partitions (view keys) a load of workers put in the view ahead of the other records of their metadata
        # partitions, each complete up to where the backlog ends (_load_in_workers): read under the lock.
        self._ahead: set[bytes] = set()
        self.applied: dict[int, int] = dict(view.applied_offsets(settings.metadata_topic))
        self.halted: dict[int, MetadataLogError] = {}
        # Records applied to the view and records the state machine dropped, since this manager started.
        self.records_applied = 0
        self.records_dropped = 0
        self.storage_problem: str | None = None
        self._stamped_at = 0.0
        self._at_end: set[int] = set()  # metadata partitions read to the end of their log (no record since)
        # Per metadata partition, the offset the next record read should have. A record past it follows records
        # Kafka's log cleaner removed (superseded ones: a node that was away longer than min.compaction.lag.ms), and
        # until its partition is read to the end, a record read may stand for older records of its key the cleaner
        # removed, as a window's record does for those the window skipped (state.apply_record's skipped_before). A
        # partition whose start is not known (not listed in time) counts as cleaned until read to the end: its first
        # record may follow removed ones. So does a partition resumed from the offsets the view stored: the window
        # that committed them may have been cut short (a crash between its commits), having skipped records below
        # them that records above them superseded, and the first of those read stands for them.
        self._log_start = self._log_starts()
        starts = {**self._log_start, **self.applied}
        self._next_offsets: dict[int, int] = dict(starts)
        self._after_cleaning: set[int] = set(self.applied)
        # A grouped read of a large backlog of partitions never applied (GROUP_FILL): the partitions being read (None:
        # every one), those still to read and how many records each holds.
        self._group: set[int] | None = None
        self._ungrouped: list[int] = []
        self._backlog: dict[int, int] = {}
        self._backlog_ends: dict[int, int] = {}  # where the backlog's partitions ended when it began
        # Whether the grouped read's groups go to worker processes that read them themselves (_load_in_workers).
        self._in_workers = False
        # A new node's fold worker for its backlog's windows (rlmm.fresh_load), started before it reads a large one
        # (its interpreter then boots while the backlog is read; started once the first window holds enough records,
        # it was often still booting when the window ended).
        large = self._start_reading(starts)
        self._worker = fresh_load.FoldWorker.start() if large and settings.fold_worker and not self._in_workers \
            else None
        self._catching_up = False  # while a backlog is read (_catch_up): its commits borrow partitions
        self._stop = threading.Event()
        self._registrations = threading.Event()  # set when partitions register: resolve their targets at once
        self._threads = [
            threading.Thread(target=self._run, name=f"tierlog-rlmm-{settings.broker_id}", daemon=True),
            threading.Thread(target=self._resolve_targets, name=f"tierlog-rlmm-offsets-{settings.broker_id}",
                             daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _log_starts(self) -> dict[int, int]:
        """Where the log starts, for each metadata partition this view never applied. Assigned from the beginning
        instead, the client looks the offsets up itself only half a second later (librdkafka queries a logical
        offset on a timer): a quarter of a cold rebuild of a compacted topic. Without an answer, the client does."""
        missing = [p for p in range(self._consumer.partitions) if p not in self.applied]
        if not missing:
            return {}
        try:
            return self._offsets.start_offsets(missing, OFFSETS_TIMEOUT_S)
        except RemoteStorageError as exc:  # not answered in time, or refused
            log.info("metadata topic %s: reading from the beginning (%s)", self._settings.metadata_topic, exc)
            return {}

    def _start_reading(self, starts: dict[int, int]) -> bool:
        """Assign the consumer: to the first group of a grouped read when the partitions never applied hold a large
        backlog past `starts` (then True), else to every partition. Without the topic's ends, every partition (and
        _fill starts a worker if the backlog is large). A grouped read goes to worker processes (`_load_in_workers`;
        the consumer then reads nothing meanwhile) where there are two cores and no write of this node is pending:
        every record below the ends is then another node's, or one written before this manager started."""
        self._group, self._ungrouped, self._backlog, self._in_workers = None, [], {}, False
        fresh = sorted(partition for partition in starts if partition not in self.applied)
        ends: dict[int, int] = {}
        if fresh:
            with suppress(RemoteStorageError):  # then read as one: ends are for sizing groups only
                ends = self._offsets.end_offsets(fresh, OFFSETS_TIMEOUT_S)
        backlog = {partition: end - starts[partition] for partition, end in ends.items() if end > starts[partition]}
        if sum(backlog.values()) < fresh_load.WORKER_MIN_KEPT:
            self._consumer.assign(starts)
            return False
        self._backlog, self._ungrouped, self._backlog_ends = backlog, sorted(backlog), ends
        self._in_workers = self._settings.fold_worker and GROUP_WORKERS > 0 and fresh_load.has_second_core() and \
            not self._writer.has_pending()
        if self._in_workers:
            self._consumer.assign({}, [])
        else:
            self._next_group(None)
        return True

    def _next_group(self, kept_share: float | None) -> None:
        """Read the next group of a grouped read, or every partition once no group is left."""
        if not self._ungrouped:
            self._group = None
            self._at_end.clear()  # the partitions read before were not read since
            self._consumer.assign(self._next_offsets)
            return
        self._group = set()
        self._consumer.assign(self._next_offsets, self._grow_group(0, kept_share))

    def _kept_share(self, window: CompactedWindow) -> float | None:
        """The records a grouped read's window keeps per offset of its partitions' logs, once it read them to their
        ends (a compacted log's offsets outnumber its records); None if not known."""
        if self._group is None or not self._read_to_end():
            return None
        span = sum(self._backlog[partition] for partition in self._group)
        return window.kept() / span if span else None

    def _grow_group(self, kept: int, kept_share: float | None) -> list[int]:
        """Take partitions into the group being read while a window keeping `kept` records is expected to keep
        them within GROUP_FILL (one, into an empty group, whatever its size or when the share is not known). A
        partition's size is its log's span of offsets, times `kept_share`."""
        assert self._group is not None
        return self._take_into(self._group, kept, kept_share)

    def _take_into(self, group: set[int], kept: int, kept_share: float | None) -> list[int]:
        taken: list[int] = []
        room = GROUP_FILL * WINDOW_MAX_KEPT - kept
        while self._ungrouped:
            expected = self._backlog[self._ungrouped[0]] * (kept_share if kept_share is not None else 1.0)
            if group and (kept_share is None or expected > room):
                break
            taken.append(self._ungrouped.pop(0))
            group.add(taken[-1])
            room -= expected
        return taken

    def _loads_fresh(self) -> bool:
        """Whether the window being read may load fresh: nothing applied yet, or a group of partitions never
        applied."""
        return not self.applied or (self._group is not None and self._group.isdisjoint(self.applied))

    # --- the apply loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = RETRY_MIN_S
        max_records = self._settings.batch_max_records
        while not self._stop.is_set():
            reopen: bool | None = None  # set when this round failed: whether the view must be reopened
            try:
                if self._in_workers:
                    self._load_in_workers()
                    continue
                # Wait briefly for one record, then take whatever else has arrived without waiting: a batch
                # consume would sit out its whole timeout on a quiet topic and delay every write.
                messages = self._consumer.consume(1, 0.02)
                if messages:
                    # A new node (nothing applied yet) waits a little for a full batch: its first records are only
                    # the first of the topic to arrive, and a topic of more is a backlog, best read as one.
                    messages += self._consumer.consume(max_records - 1, FIRST_FILL_S if not self.applied else 0)
                    # A backlog (a rebuild, or a node that was away), or a grouped read's window.
                    if len(messages) >= max_records or self._group is not None:
                        self._catch_up(messages)
                    else:
                        with cyclic_gc_paused():
                            self._apply(messages)
                elif time.monotonic() - self._stamped_at > STAMP_INTERVAL_S:
                    self._stamp()
                backoff_s = RETRY_MIN_S
            except _CommitFailure as exc:
                with self._lock:
                    self.storage_problem = str(exc)
                log.warning("metadata topic %s: cannot write the view at %s (%s); retrying in %.1f s",
                            self._settings.metadata_topic, self._view.path, str(exc), backoff_s)
                reopen = True
            except Exception:  # a bug or a client failure: keep the applier alive, but not in a tight loop
                log.exception("tierlog metadata applier on broker %s failed; retrying in %.1f s",
                              self._settings.broker_id, backoff_s)
                reopen = False
            # Outside the except block: its traceback refers to the failed batch, which would keep RocksDB's lock.
            if reopen is not None:
                backoff_s = self._recover(backoff_s, reopen)

    def _recover(self, backoff_s: float, reopen: bool) -> float:
        next_backoff_s = min(backoff_s * 2, RETRY_MAX_S)
        while not self._stop.wait(backoff_s):
            if not reopen:
                break
            try:
                # RocksDB refuses every write after a failed one until reopened; reopening keeps what committed.
                self._view.reopen()
                break
            except Exception as exc:
                log.warning("reopening the view at %s failed (%s); retrying in %.1f s", self._view.path, str(exc),
                            next_backoff_s)
                backoff_s, next_backoff_s = next_backoff_s, min(next_backoff_s * 2, RETRY_MAX_S)
        self.rewind()
        return next_backoff_s

    def rewind(self) -> None:
        """Read again from the view's stored offsets: a batch consumed but not committed is re-applied (and what a
        new node's load put in the view ahead of the rest, loaded again with it)."""
        try:
            self._take_back(frozenset(self._view.preloaded()))
        except Exception as exc:  # the view cannot be written now: a fresh load of those partitions refuses, retried
            log.warning("view at %s: cannot remove the partitions loaded ahead yet (%s)", self._view.path, exc)
        with self._lock:
            applied = dict(self.applied)
            halted = list(self.halted)
        self._at_end.clear()
        starts = {**self._log_start, **applied}  # a partition never applied: read again from its start
        self._next_offsets = dict(starts)
        self._after_cleaning = set(applied)  # as at a start from stored offsets
        self._start_reading(starts)  # _fill starts a fold worker once a window holds enough records
        for partition in halted:
            self._consumer.pause(partition)

    def _apply(self, messages: list[Message]) -> None:
        """The live path: every record decoded and applied in log order."""
        records, requests = self._decode(messages)
        self._commit_records(records, requests, {})

    def _catch_up(self, messages: list[Message]) -> None:
        """Read a backlog window by window, each replayed compacted and committed with the offsets it reaches.

        A crash between windows resumes from the last one committed: every record it skipped is superseded by a
        record the resumed node reads again or has applied."""
        deferred = self._compactions_deferred() if self._group is not None else nullcontext()
        with cyclic_gc_paused(), self._borrowing(), deferred:
            while True:
                # A view without segments (a new node's first window) holds none a tombstone could name.
                holds = partial(holds_segment, self._view) if self._view.holds_segments() else holds_nothing
                window = CompactedWindow(self._writer.is_pending, holds)
                started = time.monotonic()
                caught_up = self._fill(window, messages)
                messages = []
                read_s = time.monotonic() - started
                kept_share = self._kept_share(window)
                group = "" if self._group is None else \
                    f" of metadata partitions {', '.join(map(str, sorted(self._group)))}"
                grouped_on = caught_up and self._group is not None
                last_group = grouped_on and not self._ungrouped
                fresh = self._loads_fresh()
                if grouped_on and not last_group and not self._stop.is_set():
                    self._next_group(kept_share)  # its records arrive while this window loads
                replayed, how = self._apply_window(window, fresh, last=caught_up and not grouped_on)
                if grouped_on:
                    # No later window of this backlog touches the group's user partitions: what its windows in
                    # commits borrowed goes now, not with the whole backlog (and before the node turns ready).
                    self._view.model.return_borrowed()
                    _release_free_memory()
                    if last_group and not self._stop.is_set():
                        self._next_group(kept_share)
                log.info("metadata topic %s: a backlog window of %d records%s read in %.1f s; the newest of each key, "
                         "%d records, %s in %.1f s%s", self._settings.metadata_topic, window.records,
                         group, read_s, replayed, how, time.monotonic() - started - read_s,
                         "" if caught_up else "; reading on")
                if grouped_on and not self._stop.is_set():
                    continue
                if caught_up or self._stop.is_set():
                    return

    def _load_in_workers(self) -> None:
        """A new node's grouped read, each group read from Kafka, folded and written as tables by one of
        GROUP_WORKERS worker processes (rlmm.fresh_load.read_group) and ingested here as it comes: both cores read and
        fold, and this process never holds the backlog's records. A group no worker loaded (one failed, stalled or
        could not start; a record's rule raised; its user partitions have records on groups loaded before) is read
        here afterwards, as any grouped read's; then every partition is read on from where its group ended.

        The partitions the node hosts come first: the metadata partitions their records are on are grouped and handed
        out before the others. A group is handed out with those of its user partitions that are registered by then
        (GroupRequest.first), unless they are half of its partitions or more (as the groups loaded
        so far tell); the worker keeps and loads only their records, which are then ready (`ready_ahead`) though their
        offsets are not written, and once every group was handed out, the group goes out again for the rest
        (GroupRequest.rest_of), whose load writes the offsets. So a node hosting a tenth of the partitions serves them
        once the topic was read and a tenth of it kept and folded. If anything keeps a group's rest from a worker,
        what was loaded ahead is removed again first (not ready until then) and the group read here, as any other."""
        self._in_workers = False
        workers = [worker for worker in (fresh_load.FoldWorker.start() for _ in range(GROUP_WORKERS)) if worker]
        shares = self._view.path.parent / f"{self._view.path.name}.fold"
        # Per worker: its group, when it was handed out, the partitions asked for first and the partitions loaded
        # ahead whose group's rest it loads (None: it loads the group's first).
        busy: dict[fresh_load.FoldWorker, tuple[list[int], float, frozenset[bytes], frozenset[bytes] | None]] = {}
        later: list[tuple[list[int], frozenset[bytes]]] = []  # groups whose hosted partitions were loaded ahead
        left_here: list[int] = []
        kept: float = 0
        span = 0
        least_share = 0.0  # what a group refused as too large for a worker showed its share to be at least
        # The user partitions the groups loaded ahead named, and their metadata partitions: a group whose hosted
        # partitions are about half of its partitions or more is loaded at once, not in two steps.
        named_partitions = named_here = 0
        if workers:
            log.info("metadata topic %s: a large backlog to load: %d worker processes read and load it, a group of "
                     "its partitions each at a time", self._settings.metadata_topic, len(workers))
        # Into a view that held no user partition's entries when the load began: the keys of the user partitions the
        # groups loaded since, so that a group's are checked against them in memory (asking RocksDB took a third of
        # the node's CPU in a rebuild at 1M live segments: a seek per partition and column family, over every table
        # ingested). None: the view is asked (MetadataView.holds_any).
        loaded: set[bytes] | None = None if self._view.holds_user_entries() else set()
        metadata_partitions: dict[TopicIdPartition, int] = {}
        try:
            with cyclic_gc_paused(), self._borrowing(), self._compactions_deferred():
                while workers and (busy or self._ungrouped or later) and not self._stop.is_set():
                    for worker in [w for w in workers if w not in busy]:
                        rest_of: frozenset[bytes] | None = None
                        if not self._ungrouped and not later:
                            break
                        if self._ungrouped:
                            hosting = self._hosted(metadata_partitions)
                            # The metadata partitions of the registered partitions first (in order): those are
                            # ready once their groups were loaded ahead. (A node hosting one partition of its
                            # last metadata partition waited for every other group, 30 s at 10M live segments.)
                            self._ungrouped.sort(key=lambda partition: partition not in hosting)
                            kept_share = max(kept / span, least_share) if span else least_share or None
                            group = self._take_into(set(), 0, kept_share)
                            if kept_share is not None and \
                                    sum(self._backlog[p] for p in group) * kept_share > GROUP_WORKER_MAX_KEPT:
                                left_here += group  # a partition too large for one window: read here, in windows
                                continue
                            first = frozenset().union(*(hosting.get(p, ()) for p in group))
                            if first and named_here and \
                                    len(first) * 2 >= named_partitions * len(group) / named_here:
                                first = frozenset()  # most of the group's partitions: loaded with the rest at once
                        else:
                            group, rest_of = later.pop(0)
                            first = frozenset()
                        request = fresh_load.GroupRequest(
                            self._settings.metadata_topic, self._consumer.client_config,
                            {p: self._next_offsets[p] for p in group}, {p: self._backlog_ends[p] for p in group},
                            GROUP_WORKER_MAX_KEPT, first=first, rest_of=rest_of)
                        if worker.submit_group(request, shares):
                            busy[worker] = (group, time.monotonic(), first, rest_of)
                        else:
                            workers.remove(worker)
                            self._take_back(rest_of, loaded)
                            left_here += group
                    readable, _, _ = select.select(list(busy), [], [], 0.1)
                    for worker in readable:
                        try:
                            done, answer = worker.take()
                        except Exception as exc:  # it exited, or is another tierlog: its group is read here
                            done, answer = True, str(exc)
                        if not done:
                            continue
                        group, began, first, rest_of = busy.pop(worker)
                        if isinstance(answer, fresh_load.GroupShare) and self._load_group(
                                group, answer, began, loaded, first if answer.ahead else None, rest_of):
                            if rest_of is None:  # a group's first load read all of it
                                kept += self._kept_whole(answer)
                                span += sum(self._backlog[partition] for partition in group)
                                if answer.partitions_named:
                                    named_partitions += answer.partitions_named
                                    named_here += len(group)
                            if answer.ahead:
                                later.append((group, first))
                            worker.tidy()
                            continue
                        if not isinstance(answer, fresh_load.GroupShare):
                            too_large = isinstance(answer, fresh_load.GroupTooLarge)
                            if too_large and rest_of is None and len(group) > 1:
                                # Sized on a share of kept records the groups before it understated (one loaded
                                # ahead for a partition or two of its own): it keeps at least this many, so the groups
                                # after it are smaller, and its partitions go out again among them.
                                log.info("metadata topic %s: metadata partitions %s keep more than %d records, too "
                                         "many for one worker's group; handed out again in smaller groups",
                                         self._settings.metadata_topic, group, GROUP_WORKER_MAX_KEPT)
                                # As large a share as that at least: never again a group of these partitions all
                                # (GROUP_WORKER_MAX_KEPT is past a group's room, GROUP_FILL * WINDOW_MAX_KEPT).
                                least_share = max(least_share, GROUP_WORKER_MAX_KEPT / max(1, sum(
                                    self._backlog[partition] for partition in group)))
                                self._ungrouped = sorted(group + self._ungrouped)
                                worker.tidy()
                                continue
                            log.warning("metadata topic %s: a worker could not load metadata partitions %s (%s); "
                                        "reading them in this process", self._settings.metadata_topic, group, answer)
                            if too_large:
                                worker.tidy()  # it answered, and takes the next group
                            else:
                                workers.remove(worker)
                                worker.close()
                        else:
                            worker.tidy()
                        self._take_back(rest_of, loaded)
                        left_here += group
                    for worker, (group, began, _, rest_of) in list(busy.items()):
                        if time.monotonic() - began > fresh_load.GROUP_ANSWER_S:
                            log.warning("metadata topic %s: a worker did not load metadata partitions %s in %.0f s; "
                                        "reading them in this process", self._settings.metadata_topic, group,
                                        fresh_load.GROUP_ANSWER_S)
                            del busy[worker]
                            workers.remove(worker)
                            worker.close()
                            self._take_back(rest_of, loaded)
                            left_here += group
        finally:
            for worker in workers:
                worker.close()
            shutil.rmtree(shares, ignore_errors=True)
        unfinished = [*later, *((group, rest_of) for group, _, _, rest_of in busy.values() if rest_of is not None)]
        if self._stop.is_set():  # what was loaded ahead stays for now: the next start removes it
            return
        for group, ahead in unfinished:
            self._take_back(ahead, loaded)
            left_here += group
        self._ungrouped = sorted(left_here + self._ungrouped + [p for group, _, _, rest_of in busy.values()
                                                                 if rest_of is None for p in group])
        self._next_group(kept / span if span else None)

    @staticmethod
    def _kept_whole(answer: fresh_load.GroupShare) -> float:
        """How many records the whole group keeps (which sizes the groups after it). Loaded ahead, it kept its hosted
        partitions' only: as many per partition for the others, or (none of its partitions hosted held a record) the
        records it read, as many or more."""
        if not answer.ahead:
            return answer.kept
        if not answer.first_named:
            return answer.read
        return min(answer.read, answer.kept * answer.partitions_named / answer.first_named)

    def _hosted(self, metadata_partitions: dict[TopicIdPartition, int]) -> dict[int, set[bytes]]:
        """The view keys of the registered user partitions, by the metadata partition their records are on
        (`metadata_partitions` remembers where each one's are)."""
        with self._lock:
            registered = list(self._registered)
        hosted: dict[int, set[bytes]] = {}
        for tp in registered:
            where = metadata_partitions.get(tp)
            if where is None:
                where = metadata_partitions[tp] = self._metadata_partition(tp)
            hosted.setdefault(where, set()).add(vf.tp_key_of(tp))
        return hosted

    def ready_ahead(self, tp_key: bytes, metadata_partition: int, target: int) -> bool:
        """Whether the partition was loaded ahead of the rest of its metadata partition (`_load_in_workers`) and so
        holds every record up to `target` (call under the lock)."""
        return tp_key in self._ahead and self._backlog_ends.get(metadata_partition, -1) >= target

    def _take_back(self, ahead: frozenset[bytes] | None, loaded: set[bytes] | None = None) -> None:
        """Remove partitions loaded ahead from the view: their metadata partitions are read again, a way that loads
        them too. They are not ready until then."""
        if not ahead:
            return
        self._view.discard_preloaded(ahead)
        if loaded is not None:
            loaded -= ahead
        with self._lock:
            self._ahead -= ahead
            if self._on_unready is not None:
                self._on_unready(ahead)
            self._lock.notify_all()

    def _load_group(self, group: list[int], answer: fresh_load.GroupShare, began: float, loaded: set[bytes] | None,
                    ahead: frozenset[bytes] | None = None, completes: frozenset[bytes] | None = None) -> bool:
        """Ingest a group a worker loaded, with the offsets it reached; False, with nothing written, when its records
        must be applied here instead: a record's rule raised in the worker, or its user partitions have records on
        metadata partitions loaded before (`loaded`: the keys of those the groups before it loaded, added to here;
        None: the view is asked). With `ahead`, the answer holds these partitions of the group only: ingested without
        offsets, and ready from now on. With `completes`, it holds the rest of a group whose partitions `completes`
        were loaded ahead; then a record that halts its metadata partition sends the group here too (the partitions
        loaded ahead hold records past it)."""
        topic = self._settings.metadata_topic
        folded = answer.share.folded
        if folded.failed:
            log.warning("metadata topic %s: a record failed to apply (%s); reading metadata partitions %s in this "
                        "process", topic, folded.failed, group)
            return False
        touched = [vf.tp_key(uuid.UUID(int=topic_id), number) for topic_id, number in folded.touched]
        if self._view.holds_any(touched) if loaded is None else not loaded.isdisjoint(touched):
            log.warning("metadata topic %s: user partitions of metadata partitions %s have records on metadata "
                        "partitions loaded before; reading them in this process", topic, group)
            return False
        if folded.unreadable and (ahead is not None or completes is not None):
            log.warning("metadata topic %s: a record of metadata partitions %s cannot be read (%s); reading them in "
                        "this process", topic, group, "; ".join(why for _, why in folded.unreadable.values()))
            return False
        noted, outcomes, requests = self._noted(answer.noted, folded)
        for partition, (offset, why) in folded.unreadable.items():
            # What came before it in its partition is loaded; the node resumes from it once fixed.
            self._halt(partition, offset, f"cannot read record ({why})")
        next_offsets = {} if ahead is not None else {partition: self._backlog_ends[partition] for partition in group
                                                     if partition not in self.halted}
        next_offsets.update((partition, offset) for partition, (offset, _) in folded.unreadable.items())
        try:
            if ahead is not None:
                self._view.preload(topic, answer.share.tables, answer.share.partitions)
            else:
                self._view.load_fresh(topic, FreshTables({}, {}), next_offsets, answer.share.tables,
                                      answer.share.partitions, completes or (), known_new=loaded is not None)
        except Exception as exc:  # rocksdict raises bare Exception for RocksDB I/O errors
            raise _CommitFailure(str(exc)) from None
        if loaded is not None:
            loaded.update(answer.share.partitions)
        self._next_offsets.update(next_offsets)
        if ahead is not None:
            # Every record of these partitions below the group's ends was in the load (those without any too).
            with self._lock:
                self._ahead |= ahead
                if self._on_targets is not None:
                    self._on_targets()
        self._stamp()
        self._after_commit(noted, requests, outcomes, next_offsets, folded.applied)
        log.info("metadata topic %s: a backlog window of %d records of metadata partitions %s read by a worker (%s); "
                 "the newest of each key, %d records, %s in %.1f s", topic, answer.read, ", ".join(map(str, group)),
                 answer.how, answer.kept, f"those of the {len(ahead)} partitions hosted loaded ahead"
                 if ahead is not None else "the rest loaded" if completes else "loaded fresh",
                 time.monotonic() - began)
        return True

    @contextmanager
    def _compactions_deferred(self) -> Iterator[None]:
        """A grouped read's groups ingested with the view's compactions deferred (MetadataView.defer_compactions)."""
        self._view.defer_compactions()
        try:
            yield
        finally:
            try:
                self._view.resume_compactions()
            except Exception as exc:  # RocksDB could not record them (a full disk): a reopened view has them back
                raise _CommitFailure(f"cannot set the view's compaction triggers back ({exc})") from None

    @contextmanager
    def _borrowing(self) -> Iterator[None]:
        """While a backlog is read, its commits borrow the partitions they touch (ReadModel.borrow); then those are
        given back and the decoders' caches emptied: kept, their objects (spread over the allocator's arenas among the
        backlog's freed ones) would hold on to most of the memory the backlog used."""
        self._catching_up = True
        try:
            yield
        finally:
            self._end_backlog()
            _release_free_memory(collect=True)

    @property
    def catching_up(self) -> bool:
        """Whether a backlog is being read now (a rebuild, or a node that was away)."""
        return self._catching_up

    def _end_backlog(self) -> None:
        self._catching_up = False
        worker, self._worker = self._worker, None
        if worker is not None:  # kept for a window that never came (the node stops), or a grouped read's last
            worker.close()
        self._view.model.return_borrowed()
        _clear_decode_caches()

    def _fill(self, window: CompactedWindow, messages: list[Message]) -> bool:
        """Add records to the window until it is full (False) or the backlog ended (True)."""
        max_records = self._settings.batch_max_records
        started = flowing = time.monotonic()
        # The window's ends are the positions `_add` notes anyway, for the partitions it read: not noted per record.
        before = dict(self._next_offsets)
        # A window that may load fresh, once it keeps enough records, gets a worker to fold half of it (_load_fresh),
        # started now so that its interpreter is up when the window is read (unless one was started already).
        wants_worker = self._settings.fold_worker
        while True:
            self._add(window, messages)
            if wants_worker and window.kept() >= fresh_load.WORKER_MIN_KEPT:
                wants_worker = False
                if self._loads_fresh() and self._worker is None:
                    self._worker = fresh_load.FoldWorker.start()
            now = time.monotonic()
            if messages:
                flowing = now
            batch_short = len(messages) < max_records
            read_to_end = batch_short and self._read_to_end()
            ended = read_to_end or (batch_short and now - flowing >= WINDOW_IDLE_S)
            if read_to_end and self._group is not None and window.records and self._loads_fresh():
                # A grouped read's window read its partitions to the end: it takes more while it has room.
                more = self._grow_group(window.kept(), self._kept_share(window))
                if more:
                    self._consumer.add(self._next_offsets, more)
                    flowing, ended = now, False
            if ended or window.records >= WINDOW_MAX_RECORDS or window.kept() >= WINDOW_MAX_KEPT or \
                    now - started >= WINDOW_MAX_S or self._stop.is_set():
                window.ends.update((p, end) for p, end in self._next_offsets.items() if before.get(p) != end)
                return ended
            messages = self._consumer.consume(max_records, WINDOW_POLL_S)

    def _noteposition(self, partition: int, offset: int) -> bool:
        """Note a record read at `offset`; whether its partition was read past records the log cleaner removed.
        (`_add` does the same inline, for every record of a backlog.)"""
        self._at_end.discard(partition)
        if self._next_offsets.get(partition) != offset:
            self._after_cleaning.add(partition)
        self._next_offsets[partition] = offset + 1
        return partition in self._after_cleaning

    def _read_to_end(self) -> bool:
        """Whether every metadata partition being read (and not halted) was read to the end of its log."""
        if self._group is not None:
            return all(partition in self._at_end or partition in self.halted for partition in self._group)
        return len(self._at_end | self.halted.keys()) >= self._consumer.partitions

    def _add(self, window: CompactedWindow, messages: list[Message]) -> None:
        # Per consumed record, the least work: most are superseded within the window. A record of this node's
        # write was registered before it was produced, so with nothing pending no record in hand can be ours.
        own_writes = self._writer.has_pending()
        keep, halted = window.keep, self.halted
        at_end, next_offsets, after_cleaning = self._at_end, self._next_offsets, self._after_cleaning
        window.records += len(messages)
        # keep's plain path runs inline too unless a write of this node is pending (a call per record was a tenth of
        # reading a backlog); keep itself takes the rest.
        plain = None if own_writes else window.plain_tables()
        newest, superseded_tombstones, holds = plain or ({}, [], holds_nothing)
        for message in messages:
            if message.error() is not None:
                window.records -= 1
                self._consume_error(message)
                continue
            partition, offset = message.partition(), message.offset()
            # _note_position, inline: this runs for every record of a backlog.
            if at_end:
                at_end.discard(partition)
            if next_offsets.get(partition) != offset:  # type: ignore[arg-type]
                after_cleaning.add(partition)  # type: ignore[arg-type]
            next_offsets[partition] = offset + 1  # type: ignore[index,operator]
            if partition in halted:
                continue
            key, value = message.key() or b"", message.value()
            if plain is None:
                keep(partition, offset, key, value, request_of(message) if own_writes else None,  # type: ignore[arg-type]
                     partition in after_cleaning)
            elif value is None and key.startswith(SEGMENT_KEY_PREFIX) and not holds(key):
                newest.pop(key, None)
            else:
                before = newest.get(key)
                if before is not None and before[3] is None:
                    superseded_tombstones.append(before)
                newest[key] = (partition, offset, key, value, None,  # type: ignore[assignment]
                               partition in after_cleaning if before is None else before[3] is not None)

    def _apply_window(self, window: CompactedWindow, fresh: bool, last: bool = False) -> tuple[int, str]:
        """Replay the window: loaded at once (`_load_fresh`) if it may load `fresh` (`_loads_fresh`); else in commits
        of at most WINDOW_COMMIT_RECORDS records, the last one with the window's ends, so that a record and the state
        it builds are held decoded only until its commit. A commit before the last reaches the records it applied;
        every record the window skipped below them is superseded by one applied or read again after a crash.
        Returns how many records it replayed, and how."""
        replay = window.replay_order()
        window.clear()
        replayed = len(replay)
        # Nothing applied (a new node's view, or one whose first load was cut short), or a group never applied.
        if fresh and window.ends.keys().isdisjoint(self.applied) and self._load_fresh(replay, window.ends):
            return replayed, "loaded fresh"
        stopped: dict[int, int] = {}  # partitions a record this window could not read halted, at its offset
        for first in range(0, max(len(replay), 1), WINDOW_COMMIT_RECORDS):
            records: list[ConsumedRecord] = []
            requests: dict[tuple[int, int], str | None] = {}
            for raw in replay[first:first + WINDOW_COMMIT_RECORDS]:
                partition = raw.metadata_partition
                if partition in self.halted:
                    continue
                try:
                    records.append(raw.decoded())
                except (codec.DecodeError, InvalidArgumentError) as exc:
                    self._halt(partition, raw.offset, f"cannot read record ({exc})")
                    # What came before it in the window is applied; the node resumes from it once fixed.
                    stopped[partition] = raw.offset
                    continue
                requests[(partition, raw.offset)] = raw.request
            if first + WINDOW_COMMIT_RECORDS < len(replay):
                self._commit_records(records, requests, {})
            else:
                # A partition halted while the window was read or applied keeps the offset its halt committed.
                ends = {partition: end for partition, end in window.ends.items() if partition not in self.halted}
                # Free memory goes back to the OS after every window (a few ms), before anyone hears of its offsets.
                self._commit_records(records, requests, {**ends, **stopped}, release_memory=True, backlog_done=last)
        return replayed, "applied"

    def _load_fresh(self, replay: list[WindowRecord], ends: dict[int, int]) -> bool:
        """Replay a window into a view that applied nothing yet (a new node's first window), folded in memory and
        written at once (MetadataView.load_fresh); the window's records are let go once folded. A large window's
        metadata partitions are shared with a worker process on the other core (rlmm.fresh_load). False, with
        nothing written or halted, when a record fails to apply: the window is then replayed in commits, which halt
        that record's partition."""
        fresh = FreshState()
        worker, self._worker = self._worker, None
        mine: Sequence[fresh_load.Record] = replay
        theirs: Sequence[fresh_load.Record] = []
        shares = self._view.path.parent / f"{self._view.path.name}.fold"  # a directory per worker, under this
        if worker is not None:
            mine, theirs = fresh_load.split(replay)
            if not theirs:  # one metadata partition: nothing to share; the worker waits for the next window
                self._worker, worker = worker, None
                mine = replay
            elif not worker.submit(theirs, shares):
                worker.close()
                mine, theirs, worker = replay, [], None
        written: FreshTables | None = None
        began = time.monotonic()
        waited = 0.0
        answered = False  # the worker folded its share: it can take the backlog's next window
        try:
            folded = fresh_load.fold(fresh, mine, self.halted)
            share = None
            if worker is not None and not folded.failed:
                written = self._write_fresh(fresh)  # while the worker folds on
                asked = time.monotonic()
                share = worker.answer(self._stop)
                answered = share is not None
                waited = time.monotonic() - asked
            if share is not None and not folded.touched.isdisjoint(share.folded.touched):
                log.warning("metadata topic %s: user partitions have records on more than one metadata partition; "
                            "folding the rebuild's first window in one process", self._settings.metadata_topic)
                share = None
            theirs_folded = share.folded if share is not None else None
            if theirs and theirs_folded is None and not folded.failed:
                theirs_folded = fresh_load.fold(fresh, theirs, self.halted)
                written = None  # its tables lack their share
            failed = folded.failed or (theirs_folded.failed if theirs_folded is not None else None)
            if failed:
                log.warning("metadata topic %s: a record failed to apply (%s); replaying the window in commits",
                            self._settings.metadata_topic, failed)
                return False
            touched = folded.touched | (theirs_folded.touched if theirs_folded is not None else set())
            if self.applied and self._view.holds_any((vf.tp_key(uuid.UUID(int=topic_id), number)
                                                      for topic_id, number in touched)):
                log.warning("metadata topic %s: user partitions of this window have records on metadata partitions "
                            "read before; replaying the window in commits", self._settings.metadata_topic)
                return False
            noted, outcomes, requests = self._noted(mine, folded)
            applied, unreadable = folded.applied, folded.unreadable
            if theirs_folded is not None:
                more = self._noted(theirs, theirs_folded)
                noted += more[0]
                outcomes += more[1]
                requests.update(more[2])
                applied += theirs_folded.applied
                unreadable.update(theirs_folded.unreadable)
            replay.clear()
            del mine, theirs
            for partition, (offset, why) in unreadable.items():
                # What came before it in the window is applied; the node resumes from it once fixed.
                self._halt(partition, offset, f"cannot read record ({why})")
            next_offsets = {partition: end for partition, end in ends.items() if partition not in self.halted}
            next_offsets.update((partition, offset) for partition, (offset, _) in unreadable.items())
            try:
                self._view.load_fresh(self._settings.metadata_topic, written or fresh, next_offsets,
                                      share.tables if share is not None else None,
                                      share.partitions if share is not None else ())
            except Exception as exc:  # rocksdict raises bare Exception for RocksDB I/O errors
                # No offset was written: the window is read again, and what a load cut short left is removed first.
                raise _CommitFailure(str(exc)) from None
            log.info("metadata topic %s: a window loaded fresh in %.2f s (%d records applied%s)",
                     self._settings.metadata_topic, time.monotonic() - began, applied,
                     f"; {len(share.partitions)} user partitions folded by the worker, {waited:.2f} s waited for it"
                     if share is not None else "")
        finally:
            if worker is not None and answered and self._group is not None and self._worker is None:
                self._worker = worker  # the grouped read goes on: the next group's window
            elif worker is not None:
                worker.close()
            shutil.rmtree(shares, ignore_errors=True)  # with what any load cut short left
        del fresh
        _release_free_memory()
        self._stamp()
        self._after_commit(noted, requests, outcomes, next_offsets, applied)
        return True

    def _write_fresh(self, fresh: FreshState) -> FreshTables:
        try:
            return self._view.fresh_tables(fresh)
        except Exception as exc:  # rocksdict raises bare Exception for RocksDB I/O errors
            raise _CommitFailure(str(exc)) from None

    @staticmethod
    def _noted(
        records: Sequence[fresh_load.Record], folded: fresh_load.Folded,
    ) -> tuple[list[ConsumedRecord], list[state.Outcome], dict[tuple[int, int], str | None]]:
        """The records of a fold the applier must hear of one by one (decoded again if the worker folded them)."""
        noted: list[ConsumedRecord] = []
        outcomes: list[state.Outcome] = []
        requests: dict[tuple[int, int], str | None] = {}
        for index, key, event, outcome in folded.noted:
            partition, offset, raw_key, value, request, skipped_before = records[index]
            if key is None:
                key, event = codec.decode_record(raw_key, value)
            noted.append(ConsumedRecord(partition, offset, key, event, value, skipped_before))
            outcomes.append(outcome)
            requests[(partition, offset)] = request
        return noted, outcomes, requests

    def _commit_records(
        self, records: list[ConsumedRecord], requests: dict[tuple[int, int], str | None], ends: dict[int, int],
        release_memory: bool = False, backlog_done: bool = False,
    ) -> None:
        """Apply the records and commit them with the offsets they reach (at least `ends`: a window's end, past
        the records it skipped); a record that cannot be applied halts its partition at its offset."""
        ends = dict(ends)
        while True:
            next_offsets = dict(ends)
            for record in records:
                partition = record.metadata_partition
                next_offsets[partition] = max(next_offsets.get(partition, 0), record.offset + 1)
            if not next_offsets:
                return
            try:
                outcomes = self._commit(records, next_offsets)
            except _ApplyFailure as failure:
                bad = failure.record
                self._halt(bad.metadata_partition, bad.offset, f"cannot apply record ({failure.cause!r})")
                records = [r for r in records
                           if r.metadata_partition != bad.metadata_partition or r.offset < bad.offset]
                ends[bad.metadata_partition] = bad.offset
                continue
            if backlog_done:
                self._end_backlog()  # before anyone hears the view caught up, as the memory released below
            if release_memory:
                # Before anyone hears the view caught up, so a rebuilt node holds what a restarted one holds.
                _release_free_memory()
            self._after_commit(records, requests, outcomes, next_offsets)
            return

    def _consume_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
        if error.code() == KafkaError._PARTITION_EOF:
            self._at_end.add(message.partition() or 0)
            self._after_cleaning.discard(message.partition() or 0)
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:
            partition = message.partition() or 0
            if partition not in self.applied:
                # Only the log's start, read at startup, fell off (records deleted since): nothing stored is lost.
                self._next_offsets.pop(partition, None)
                self._log_start.pop(partition, None)
                self._consumer.rewind_to_start(partition)
                return
            self._halt(partition, self.applied.get(partition, 0),
                       f"the stored offset is no longer on the log ({error.str()}); restart the "
                       f"manager so that it rebuilds its view from the topic")
        else:
            log.warning("metadata topic %s: %s", self._settings.metadata_topic, error.str())

    def _decode(self, messages: list[Message]) -> tuple[list[ConsumedRecord], dict[tuple[int, int], str | None]]:
        # Every record is decoded and applied in log order, even one a later record of the same key supersedes:
        # on the live path a batch is no window of a backlog, and chunks ending anywhere must not change the view.
        records: list[ConsumedRecord] = []
        requests: dict[tuple[int, int], str | None] = {}
        for message in messages:
            if message.error() is not None:
                self._consume_error(message)
                continue
            partition, offset = position(message)
            after_cleaning = self._noteposition(partition, offset)
            if partition in self.halted:
                continue
            try:
                record = self._read(message, after_cleaning)
            except (codec.DecodeError, InvalidArgumentError) as exc:
                self._halt(partition, offset, f"cannot read record ({exc})")
                continue
            records.append(record)
            requests[(partition, offset)] = request_of(message)
        return records, requests

    @staticmethod
    def _read(message: Message, after_cleaning: bool) -> ConsumedRecord:
        partition, offset = position(message)
        value = message.value()
        key, event = codec.decode_record(message.key() or b"", value)
        return ConsumedRecord(partition, offset, key, event, value, after_cleaning)

    def _commit(self, records: list[ConsumedRecord], next_offsets: dict[int, int]) -> list[state.Outcome]:
        """Apply the batch and commit it with the offsets it reaches, as one WriteBatch."""
        batch = self._view.batch(borrow=self._catching_up)
        outcomes = []
        for record in records:
            try:
                outcomes.append(batch.apply(record))
            except Exception as exc:  # the record, not the disk: nothing of this batch was written
                raise _ApplyFailure(record, exc) from exc
        try:
            batch.commit(self._settings.metadata_topic, next_offsets)
        except Exception as exc:  # rocksdict raises bare Exception for RocksDB I/O errors
            # Not chained: the cause's traceback refers to the database and would keep RocksDB's lock.
            raise _CommitFailure(str(exc)) from None
        if time.monotonic() - self._stamped_at > STAMP_MIN_INTERVAL_S:
            self._stamp()
        return outcomes

    def _stamp(self) -> None:
        try:
            self._view.set_source(self._settings.metadata_topic, self._settings.topic_id, int(time.time() * 1000))
        except Exception as exc:
            raise _CommitFailure(str(exc)) from None
        self._stamped_at = time.monotonic()

    def _after_commit(
        self, records: list[ConsumedRecord], requests: dict[tuple[int, int], str | None],
        outcomes: list[state.Outcome], next_offsets: dict[int, int], applied_besides: int = 0,
    ) -> None:
        """Publish a commit's offsets and outcomes; `applied_besides` counts records applied beyond `records`, which
        need nothing else heard of them."""
        follow_ups: list[Append] = []
        with self._lock:
            self.storage_problem = None
            self.applied.update(next_offsets)
            self.records_applied += applied_besides
            for record, outcome in zip(records, outcomes, strict=True):
                if outcome.applied:
                    self.records_applied += 1
                else:
                    self.records_dropped += 1
                    log.warning("metadata topic %s partition %d offset %d: record dropped: %s",
                                self._settings.metadata_topic, record.metadata_partition, record.offset,
                                outcome.reason)
                if isinstance(record.event, RemotePartitionDeleteMetadata) and outcome.applied and \
                        record.event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                    self._registered.pop(record.event.topic_id_partition, None)
                request = requests.get((record.metadata_partition, record.offset))
                follow_ups += self._writer.on_applied_locked(self._view, request, record, outcome)
            self._lock.notify_all()
        self._writer.produce(follow_ups)

    def _halt(self, partition: int, offset: int, what: str) -> None:
        topic = self._settings.metadata_topic
        error = MetadataLogError(
            f"metadata topic {topic} partition {partition} offset {offset}: {what}; this node applies nothing "
            f"after it for that partition. Inspect the record (kafka-console-consumer --partition {partition} "
            f"--offset {offset}) and upgrade tierlog or remove the producer that wrote it"
        )
        log.error("%s", error)
        self._consumer.pause(partition)
        with self._lock:
            self.halted[partition] = error
            self._writer.fail_partition_locked(partition, error)
            self._lock.notify_all()
        self._writer.settle()

    # --- end offsets for readiness, off the apply path -----------------------------------------------------

    def registered(self) -> None:
        """Partitions were registered: fetch the end offsets they must reach now, not at the next interval (a node
        that bootstrapped from a snapshot is otherwise ready in less time than the interval)."""
        self._registrations.set()

    def _resolve_targets(self) -> None:
        backoff_s = OFFSETS_INTERVAL_S
        while True:
            self._registrations.wait(backoff_s)
            self._registrations.clear()
            if self._stop.is_set():
                return
            with self._lock:
                waiting = sorted({self._metadata_partition(tp) for tp, t in self._registered.items() if t is None})
            if not waiting:
                backoff_s = OFFSETS_INTERVAL_S
                continue
            try:
                ends = self._offsets.end_offsets(waiting, OFFSETS_TIMEOUT_S)
            except RemoteStorageError as exc:
                backoff_s = min(backoff_s * 2, RETRY_MAX_S)
                log.warning("%s; partitions registered meanwhile stay not ready, retrying in %.1f s", exc, backoff_s)
                continue
            backoff_s = OFFSETS_INTERVAL_S
            with self._lock:
                for tp, target in self._registered.items():
                    if target is None and self._metadata_partition(tp) in ends:
                        self._registered[tp] = ends[self._metadata_partition(tp)]
                if self._on_targets is not None:
                    self._on_targets()
                self._lock.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Stop applying; whether every thread stopped within `timeout_s` each (then nothing changes the view after)."""
        self._stop.set()
        self._registrations.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        worker, self._worker = self._worker, None
        if worker is not None:  # the window it was started for was never loaded
            worker.close()
        return not any(thread.is_alive() for thread in self._threads)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Decoding and applying a batch allocate many short-lived, acyclic containers (records, overlays); each burst
    made the cyclic collector rescan the read model, about a quarter of a rebuild's time. Reference counting still
    frees them; cycles made meanwhile wait for the next collection after the batch."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# glibc gives a block above its mmap threshold (128 KiB at first) a mapping of its own, unmapped when freed. But each
# such block freed raises the threshold to its size (up to 32 MiB), and a backlog's large tables (the window's dict of
# every key read, tens of MiB, resized as it grows) then lifted it: the next ones came from the heap, where freed they
# stayed fragments malloc_trim returned only in part. A rebuilt node held 5-25 MiB more than a restarted one at the
# same state, varying from run to run; with the threshold fixed at 1 MiB, 2-3 MiB. Fixing it also stops the dynamic
# adjustment, for the whole process: a block of 1 MiB or more is then always mapped afresh (its page faults, about
# 50 us a MiB, beside the I/O such buffers are for).
_MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _fix_mmap_threshold() -> None:
    """Fix glibc's mmap threshold, unless the process was started with one (MALLOC_MMAP_THRESHOLD_); a no-op off
    glibc (musl's mallopt does nothing)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def _clear_decode_caches() -> None:
    for module in (codec, events, vf):
        module.clear_caches()


def _release_free_memory(collect: bool = False) -> None:
    """Hand the memory a backlog's fetch buffers and decoding left free back to the OS (glibc keeps it in each
    thread's arena otherwise: about 160 MiB after a 200k-event rebuild; nothing is trimmed off glibc).

    With `collect` (once a backlog ended), a full collection first, though it finds next to nothing to collect:
    only a full one empties the interpreter's free lists (tuples, floats, lists and dicts kept for reuse), and their
    few thousand objects, spread over the backlog's freed objects, kept Python's allocator from returning the arenas
    they sit in: 20-30 MiB after a rebuild at 1M live segments. Not after every window: a collection then walks the
    next window's records too, and one per window made a rebuild at 1M live segments 7% slower."""
    if collect:
        gc.collect()
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)
