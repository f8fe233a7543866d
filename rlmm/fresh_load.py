"""A new node's windows that load fresh, folded on two cores.

A rebuild's window that loads fresh (MetadataApplier._load_fresh: the first, or one of a group of metadata
partitions never applied) is decoded and folded into a FreshState, one core's Python work: about 20 us per record
kept. The user partitions of different metadata partitions never share state (all of a user partition's records are
on the metadata partition its id hashes to), so the window splits by metadata partition: a worker process (`python
-m rlmm.fresh_load`, started as a new node's large backlog begins, so that its interpreter is up when the first
window ends, and kept for the backlog's other windows) folds one share into a FreshState of its own and writes it as
RocksDB tables, while the applier folds the other and writes its own. The applier ingests both into the view; the
read model reads the worker's partitions from RocksDB when first asked for, as after a restart.

A new node's large backlog of metadata partitions never applied goes further (MetadataApplier._load_in_workers):
two workers each read groups of metadata partitions from Kafka themselves (`read_group`: the newest record of each
key, as a window keeps them, up to the topic's end offsets when the backlog began), fold them and write their
tables; the applier only ingests them. So both cores read and fold, and the node's own process never holds the
backlog's records: after a rebuild it holds what a restarted node holds. A worker folds the plain records of its
share without building their events (rlmm.lean_fold), into the tables a FreshState would write.

The worker is an optimisation only. If it cannot start, fails, answers late, speaks another version, or its records
name a user partition the applier's records name too (records on the wrong metadata partition), the applier folds
its share itself, with a log line; the view is then the one a single process builds. A record whose rule raises in
the worker sends the window through the commits, as in the applier's own share.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rlmm import codec, raw_fetch, record_batches, state
from rlmm import view_format as vf
from rlmm.backlog_window import CompactedWindow, holds_nothing
from rlmm.errors import InvalidArgumentError
from rlmm.events import SEGMENT_KEY_PREFIX, MetadataEvent, RecordKey
from rlmm.lean_fold import LeanFold
from rlmm.types import RemotePartitionDeleteMetadata
from rlmm.view import FreshState, write_tables

if TYPE_CHECKING:  # imported where the consumer reads: a worker that reads raw batches starts without it
    from rlmm.event_log import EventConsumer

log = logging.getLogger(__name__)

# A window keeping fewer records is folded by the applier alone: the worker's start (about 0.1 s of the other core)
# and the records' trip to it would cost more than folding half of them (about 10 us per record) saves.
WORKER_MIN_KEPT = 20_000
# How long the applier waits for the worker's share once its own is folded: the worker folds at most half of a
# window (WINDOW_MAX_KEPT records, about 2 s), so this is a stall, not a slow fold.
WORKER_ANSWER_S = 60.0
# A worker reading a group of metadata partitions gives up when none of them sent a record for this long (a
# partition without a leader), and the applier reads that group itself; the applier waits at most GROUP_ANSWER_S for
# a group's answer (a group keeps at most GroupRequest.max_kept records: seconds of work).
GROUP_IDLE_S = 10.0
GROUP_ANSWER_S = 300.0
_GROUP_BATCH = 10_000
_PROTOCOL = 2
_FRAME = struct.Struct(">Q")

# A window's record: (metadata partition, offset, key, value, request, skipped_before), a WindowRecord's fields.
Record = tuple[int, int, bytes, bytes | None, str | None, bool]


@dataclass
class Folded:
    """What folding a share of a window's records found, beside the state it built."""

    applied: int = 0  # records applied that nothing else need hear of
    # (index in the share, key, event, outcome) of the records the applier must hear of one by one: its own writes',
    # dropped ones, partition deletions. The worker sends no key nor event: the applier decodes these few again.
    noted: list[tuple[int, RecordKey | None, MetadataEvent | None, state.Outcome]] = field(default_factory=list)
    unreadable: dict[int, tuple[int, str]] = field(default_factory=dict)  # partition -> first unreadable offset, why
    failed: str | None = None  # a record whose rule raised, and the traceback: the window goes through the commits
    # The user partitions (topic id as an int, partition) its records name, whatever they left: two shares naming
    # one are not independent (records on the wrong metadata partition), and must be folded in one process.
    touched: set[tuple[int, int]] = field(default_factory=set)


@dataclass
class WorkerShare:
    """The worker's answer: its fold, the table files it wrote (by column family) and the partitions they hold."""

    folded: Folded
    tables: dict[str, Path]
    partitions: list[bytes]


def fold(fresh: FreshState, records: Sequence[Record], skip: Container[int], lean: LeanFold | None = None) -> Folded:
    """Decode and fold `records` (in replay order) into `fresh`, passing over the metadata partitions in `skip`
    (halted). A partition's first unreadable record ends its share; a record whose rule raises ends the fold. With
    `lean` (a worker's, over `fresh`), the records of its plain forms are folded there, without their events."""
    folded = Folded()
    unreadable, noted, touch = folded.unreadable, folded.noted, folded.touched.add
    # Runs of the commonest record are folded in C, a run at a time (LeanFold.fold_run), and the loop takes the
    # first record after each run.
    in_runs = lean is not None and not skip and isinstance(records, list)
    index, count = 0, len(records)
    while index < count:
        if in_runs:
            assert lean is not None
            index, applied = lean.fold_run(records, index, unreadable, folded.touched)  # type: ignore[arg-type]
            folded.applied += applied
            if index >= count:
                break
        partition, offset, raw_key, value, request, skipped_before = records[index]
        index += 1
        if partition in skip or partition in unreadable:
            continue
        if lean is not None and request is None:
            try:
                taken = lean.fold_record(offset, raw_key, value, skipped_before)
            except Exception:
                folded.failed = _failure(partition, offset)
                return folded
            if taken is not None:
                touch(taken)
                folded.applied += 1
                continue
        try:
            key, event = codec.decode_record(raw_key, value)
        except (codec.DecodeError, InvalidArgumentError) as exc:
            unreadable[partition] = (offset, str(exc))
            continue
        touch((key.topic_id.int, key.partition))  # an int's hash is C code, a UUID's is not
        if lean is not None:
            lean.before_rules(key.topic_id, key.partition)
        try:
            outcome = fresh.fold(key, event, offset, skipped_before, value)
        except Exception:
            folded.failed = _failure(partition, offset)
            return folded
        if outcome.applied and request is None and not isinstance(event, RemotePartitionDeleteMetadata):
            folded.applied += 1
        else:
            noted.append((index - 1, key, event, outcome))
    return folded


def _failure(partition: int, offset: int) -> str:
    """What `Folded.failed` says of the record whose fold is raising now."""
    return f"metadata partition {partition} offset {offset}: {traceback.format_exc()}"


def split(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """The window's records as two shares of whole metadata partitions, of about as many records each: the
    applier's and the worker's, each in replay order."""
    counts = Counter(record[0] for record in records)
    theirs: set[int] = set()
    mine_count = theirs_count = 0
    for partition, count in counts.most_common():
        if theirs_count < mine_count:
            theirs.add(partition)
            theirs_count += count
        else:
            mine_count += count
    mine: list[Record] = []
    their_records: list[Record] = []
    for record in records:
        if record[0] in theirs:
            their_records.append(tuple(record))  # type: ignore[arg-type]  # plain, for the trip (no class to import)
        else:
            mine.append(record)
    return mine, their_records


@dataclass(frozen=True)
class GroupRequest:
    """A group of metadata partitions for a worker to read from Kafka and load fresh: each from its start (the first
    offset on its log) to its end (the topic's end offset when the backlog began; records past it are the applier's
    to read). The node has no write pending below those ends, so no record read is one of its own writes."""

    topic: str
    client_config: dict[str, Any]
    starts: dict[int, int]
    ends: dict[int, int]
    # The most records its window may keep (the memory a worker needs follows it); a group that keeps more is the
    # applier's to read, in windows of its own bound.
    max_kept: int
    directory: str = ""  # where its tables go (FoldWorker.submit_group sets it)
    # The user partitions (view keys) the node hosts: only their records are loaded (GroupShare.ahead), and the group
    # is handed out again with them as `rest_of`.
    first: frozenset[bytes] = frozenset()
    # The group handed out again: its records of these partitions (loaded ahead) are passed over, the rest loaded.
    rest_of: frozenset[bytes] | None = None


@dataclass
class GroupShare:
    """A worker's answer for a group: its fold and tables (`share`), how many records it read, and the records its
    fold noted (`share.folded.noted` indexes these), which the applier never read itself."""

    share: WorkerShare
    read: int
    kept: int
    noted: list[Record]
    how: str = "as raw batches"  # how it read them: "as raw batches", or "with the consumer: <why>"
    ahead: bool = False  # its tables hold the request's `first` partitions only (see GroupRequest)
    partitions_named: int = 0  # how many user partitions the group's records name (known where `first` or `rest_of`)
    first_named: int = 0  # how many of them are of the request's `first`


class FoldWorker:
    """The applier's handle on one worker process, used for the windows of one backlog that load fresh: `submit`,
    then `answer`, for each; then `close`."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._directory: Path | None = None
        self._buffer = b""
        self._greeted = False  # its hello was read (the first answer)
        self._handed = 0  # requests handed to it, each with a directory of its own

    @classmethod
    def start(cls) -> FoldWorker | None:
        """Start a worker, or None where there is no second core or no interpreter to start."""
        if not has_second_core():
            return None
        # The worker imports this very tierlog (not one another path would find first): its package's parent first,
        # and not the current directory (-P).
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        try:
            process = subprocess.Popen([sys.executable, "-P", "-m", "rlmm.fresh_load"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            log.info("cannot start a worker to fold a rebuild's windows on a second core (%s); folding them in "
                     "this process", exc)
            return None
        log.info("a large backlog to load: a worker process (pid %d) folds its metadata partitions on another core",
                 process.pid)
        return cls(process)

    def submit(self, records: Sequence[Record], under: Path) -> bool:
        """Hand the worker its share, through a file in a directory of its own under `under` (its tables go there
        too: never where a worker of a node that stopped mid-load may still write); False, with the worker closed,
        when that fails (the disk is full)."""
        try:
            directory = self._new_directory(under)
            with open(directory / "records.pickle", "wb") as out:
                pickle.dump(records, out, protocol=pickle.HIGHEST_PROTOCOL)
            assert self._process.stdin is not None
            _send(self._process.stdin, (str(directory / "records.pickle"), str(directory)))
        except OSError as exc:
            log.info("cannot hand a share of the window to the fold worker (%s); folding it in this process", exc)
            self.close()
            return False
        return True

    def submit_group(self, request: GroupRequest, under: Path) -> bool:
        """Hand the worker a group of metadata partitions to read and load itself (`read_group`), its tables to go
        in a directory of its own under `under`; False, with the worker closed, when that fails."""
        try:
            directory = self._new_directory(under)
            assert self._process.stdin is not None
            _send(self._process.stdin, dataclasses.replace(request, directory=str(directory)))
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:  # a setting pickle cannot carry
            log.info("cannot hand a group of metadata partitions to a worker (%s); reading it in this process", exc)
            self.close()
            return False
        return True

    def _new_directory(self, under: Path) -> Path:
        # Its own, under `under`: never where a worker of a node that stopped mid-load may still write.
        self._handed += 1
        directory = under / f"{self._process.pid}.{self._handed}"
        directory.mkdir(parents=True)
        self._directory = directory
        return directory

    def fileno(self) -> int:
        """Readable when the worker has answered (or exited): for select."""
        assert self._process.stdout is not None
        return self._process.stdout.fileno()

    def take(self) -> tuple[bool, Any]:
        """Read what the worker sent so far (call when `fileno` is readable): (True, its answer) once the whole
        answer arrived, else (False, None). _WorkerError when it exited or is another tierlog."""
        self._read_more()
        return self._next_answer()

    def _read_more(self) -> None:
        chunk = os.read(self.fileno(), 1 << 20)
        if not chunk:
            raise _WorkerError(f"it exited (status {self._process.wait(1)})")
        self._buffer += chunk

    def _next_answer(self) -> tuple[bool, Any]:
        """(True, the next whole answer in the buffer), past the worker's hello, which must be this tierlog's; else
        (False, None)."""
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            frame = pickle.loads(self._buffer[_FRAME.size:_FRAME.size + size])
            self._buffer = self._buffer[_FRAME.size + size:]
            if self._greeted:
                return True, frame
            if frame != (_PROTOCOL, str(Path(__file__).resolve())):
                raise _WorkerError(f"it is another tierlog ({frame!r})")
            self._greeted = True
        return False, None

    def answer(self, stop: threading.Event) -> WorkerShare | None:
        """The worker's share, or None (logged) if it failed, spoke another version, or did not answer within
        WORKER_ANSWER_S."""
        deadline = time.monotonic() + WORKER_ANSWER_S
        try:
            while not (answered := self._next_answer())[0]:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    raise _WorkerError("the applier stopped" if stop.is_set() else "it did not answer in time")
                readable, _, _ = select.select([self], [], [], min(left, 0.1))
                if readable:
                    self._read_more()
            share = answered[1]
            if isinstance(share, str):
                raise _WorkerError(share)
            if not isinstance(share, WorkerShare):
                raise _WorkerError(f"it answered {type(share).__name__}")
            return share
        except Exception as exc:  # whatever went wrong with it, the applier can fold the share itself
            log.warning("the worker folding a share of a rebuild's window failed: %s; folding its share in "
                        "this process", exc)
            self.close()
            return None

    def tidy(self) -> None:
        """Remove what the worker was given and wrote for its last request (the applier ingested its tables)."""
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def close(self) -> None:
        """Stop the worker (if still running) and remove what it was given and wrote."""
        if self._process.poll() is None:
            self._process.kill()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("the fold worker (pid %d) did not exit when killed", self._process.pid)
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                pipe.close()
        self.tidy()


def has_second_core() -> bool:
    """Whether this process may run on two cores, and an interpreter is there to start workers with."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores >= 2 and bool(sys.executable)


class _WorkerError(Exception):
    pass


def _send(out: IO[bytes], message: object) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_FRAME.pack(len(payload)) + payload)
    out.flush()


def _read_frame(source: IO[bytes]) -> object | None:
    header = source.read(_FRAME.size)
    if len(header) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(header)
    return pickle.loads(source.read(size))


def fold_share(records: Sequence[Record], directory: Path) -> WorkerShare | str:
    """The worker's work: fold its share into a FreshState of its own and write it as table files in `directory`;
    its answer, or why writing failed."""
    fresh = FreshState()
    lean = LeanFold(fresh)  # no event of the share is wanted after its fold: the node reads its tables
    folded = fold(fresh, records, (), lean)
    # The applier decodes its few noted records again: keys and events need not travel.
    folded.noted = [(index, None, None, outcome) for index, _, _, outcome in folded.noted]
    if folded.failed is not None:
        return WorkerShare(folded, {}, [])
    try:
        tables = write_tables(lean.runs(), directory, directory)
    except Exception as exc:  # rocksdict raises bare Exception for RocksDB I/O errors (a full disk)
        return f"writing its tables failed: {exc}"
    return WorkerShare(folded, tables, lean.partition_keys())


@dataclass(frozen=True)
class GroupTooLarge:
    """A worker's answer for a group whose window would keep more than the request's `max_kept` records: it stopped
    reading the group, loaded nothing of it, and takes the next group it is handed."""

    max_kept: int

    def __str__(self) -> str:
        return f"its window keeps more than {self.max_kept} records"


def read_group(request: GroupRequest) -> GroupShare | GroupTooLarge | str:
    """The worker's work for a group: read its metadata partitions from Kafka, keep the newest record of each key
    as the applier's window does (CompactedWindow; a record after a gap in its partition's offsets may stand for
    records the log cleaner removed), fold them and write their tables; its answer, or why it gave up. The records
    come as raw batches (rlmm.raw_fetch) where that reader gives what the consumer would, else from the consumer."""
    window = CompactedWindow(_no_own_write, holds_nothing)  # a new node's view holds no segment yet
    # The records the window keeps: of the node's hosted partitions (`first`), of the others (`rest_of`), or all.
    named: dict[bytes, bytes | None] = {}
    only: record_batches.Only | None = None
    if request.rest_of is not None:
        only = (request.rest_of, named, _user_partition_key, False)
    elif request.first:
        only = (request.first, named, _user_partition_key, True)
    read: int | str | GroupTooLarge | None = None
    reader, how = _raw_reader_for(request)
    if reader is not None:
        try:
            read = _read_raw(reader, request, window, only)
        except Exception as exc:  # RawFetchUnusable, or a fault of the raw reader itself: the consumer reads it
            how = f"with the consumer: {exc}" if isinstance(exc, raw_fetch.RawFetchUnusable) else \
                f"with the consumer: the raw reader failed: {exc!r}"
            _close_raw_reader()
            window = CompactedWindow(_no_own_write, holds_nothing)
    if read is None:
        read = _read_consumed(request, window, only)
    if isinstance(read, (str, GroupTooLarge)):
        return read
    replay = window.replay_entries()
    window.clear()
    ahead = bool(request.first) and request.rest_of is None
    answer = fold_share(replay, Path(request.directory))
    if ahead and isinstance(answer, WorkerShare) and (answer.folded.failed or answer.folded.unreadable):
        # A record that halts its metadata partition: the whole group at once, as ever (read again for it).
        whole = Path(request.directory) / "whole"
        whole.mkdir()
        return read_group(dataclasses.replace(request, first=frozenset(), directory=str(whole)))
    if isinstance(answer, str):
        return answer
    noted = [replay[index] for index, _, _, _ in answer.folded.noted]
    answer.folded.noted = [(number, None, None, outcome) for number, (_, _, _, outcome) in
                           enumerate(answer.folded.noted)]
    return GroupShare(answer, read, len(replay), noted, how, ahead,
                      sum(tp_key is not None for tp_key in named.values()),
                      sum(tp_key in request.first for tp_key in named.values()))


def _user_partition_key(text: bytes) -> bytes | None:
    """The view key of `<topic id>:<partition>` as a record key names it, or None for text naming no partition."""
    try:
        topic_id, partition = text.decode().split(":")
        return vf.tp_key(uuid.UUID(topic_id), int(partition))
    except (UnicodeDecodeError, ValueError, struct.error):
        return None


# A run of records kept in one call, and a partition's Fetch bytes read and kept in one (rlmm/_record_batches.c where it
# is built; rlmm.record_batches is their reference).
_batches: Any = record_batches if raw_fetch._record_batches is None else raw_fetch._record_batches


class _Kept:
    """A group's window as its records are read (by either reader): the window's `keep`, a run of records at a time
    (a call per record was a tenth of a worker's read), and where each metadata partition's offsets are. No record is
    one of this node's writes, and a segment tombstone names a segment the new node's view does not hold."""

    def __init__(self, window: CompactedWindow, starts: dict[int, int], only: record_batches.Only | None) -> None:
        plain = window.plain_tables()
        assert plain is not None, "a new window holds no record of this node's writes"
        self.newest, self.superseded_tombstones, _ = plain
        self.only = only  # which user partitions' records it keeps (record_batches.keep), None: all
        self.next_offsets = dict(starts)
        # Metadata partitions where a gap in the offsets showed the log cleaner at work, until read to their end: a
        # record there may stand for older records of its key (CompactedWindow).
        self.after_cleaning: set[int] = set()

    def run(self, partition: int, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
        """Keep the newest record of each key of `records`: consecutive records of `partition`, ascending."""
        self.next_offsets[partition], cleaned = _batches.keep(
            self.newest, self.superseded_tombstones, partition, records, self.next_offsets[partition],
            partition in self.after_cleaning, SEGMENT_KEY_PREFIX, self.only)
        if cleaned:
            self.after_cleaning.add(partition)

    def take(self, partition: int, data: bytes, start: int, end: int) -> tuple[int, int, bool]:
        """`run` of the records a Fetch response's bytes hold for `partition` (raw_fetch.Take), read as they are kept:
        how many were read."""
        read, after, transactional, self.next_offsets[partition], cleaned = _batches.read_keep(
            data, start, end, record_batches.decompress, self.newest, self.superseded_tombstones, partition,
            self.next_offsets[partition], partition in self.after_cleaning, SEGMENT_KEY_PREFIX, self.only)
        if cleaned:
            self.after_cleaning.add(partition)
        return read, after, transactional


def _read_raw(reader: raw_fetch.RawReader, request: GroupRequest, window: CompactedWindow,
              only: record_batches.Only | None) -> int | str | GroupTooLarge:
    """The group's records as raw batches into `window` (those `only` keeps): how many were read, or why the group
    was given up. RawFetchUnusable, with the window part filled, when the consumer must read the group instead."""
    kept = _Kept(window, request.starts, only)
    read = 0
    # Each fetch is answered before the next is sent: given up between two, the reader has nothing in flight.
    for _, count in reader.take(request.starts, request.ends, GROUP_IDLE_S, kept.take):
        read += count
        if window.kept() > request.max_kept:
            return GroupTooLarge(request.max_kept)
    return read


def _read_consumed(request: GroupRequest, window: CompactedWindow, only: record_batches.Only | None
                   ) -> int | str | GroupTooLarge:
    """The group's records from the consumer into `window` (those `only` keeps): how many were read, or why the group
    was given up."""
    from confluent_kafka import KafkaError

    starts, ends = request.starts, request.ends
    consumer = _consumer_for(request)
    try:
        consumer.assign(starts, sorted(starts))
        kept = _Kept(window, starts, only)
        left = {partition for partition in starts if ends[partition] > starts[partition]}
        partition: int
        offset: int
        read = 0
        heard = time.monotonic()
        while left:
            messages = consumer.consume(_GROUP_BATCH, 0.1)
            if messages:
                heard = time.monotonic()
            elif time.monotonic() - heard > GROUP_IDLE_S:
                return f"no record came from metadata partitions {sorted(left)} for {GROUP_IDLE_S:g} s"
            run: list[tuple[int, bytes | None, bytes | None]] = []  # consecutive records of one partition
            run_of = -1
            for message in messages:
                error = message.error()
                partition, offset = message.partition(), message.offset()  # type: ignore[assignment]  # consumed: set
                if run and (partition != run_of or error is not None):
                    kept.run(run_of, run)
                    run = []
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        return f"reading metadata partition {partition} failed: {error.str()}"
                    kept.after_cleaning.discard(partition)
                    if offset >= ends[partition]:
                        left.discard(partition)
                    continue
                end = ends[partition]
                if offset >= end:  # the applier's to read
                    left.discard(partition)
                    continue
                read += 1
                if offset + 1 >= end:
                    left.discard(partition)
                run.append((offset, message.key(), message.value()))
                run_of = partition
            if run:
                kept.run(run_of, run)
            if window.kept() > request.max_kept:
                consumer.assign({}, [])  # ready for the next group
                return GroupTooLarge(request.max_kept)
    except BaseException:
        _close_consumer()
        raise
    consumer.assign({}, [])
    return read


# The worker's consumer, kept for the groups it is handed next (a new one connects and fetches metadata first): the
# (topic, settings) it was opened with, and it.
_consumer: tuple[tuple[str, str], EventConsumer] | None = None


def _consumer_for(request: GroupRequest) -> EventConsumer:
    from rlmm.event_log import EventConsumer

    global _consumer
    wanted = (request.topic, repr(sorted(request.client_config.items())))
    if _consumer is None or _consumer[0] != wanted:
        _close_consumer()
        _consumer = (wanted, EventConsumer(request.topic, request.client_config, max(request.ends) + 1))
    return _consumer[1]


def _close_consumer() -> None:
    global _consumer
    if _consumer is not None:
        consumer, _consumer = _consumer[1], None
        consumer.close()


# The worker's raw reader, kept for the groups it is handed next like its consumer: the (topic, settings) it was
# opened with, and it, or why there is none (their groups go to the consumer).
_raw_reader: tuple[tuple[str, str], raw_fetch.RawReader | None, str] | None = None


def _raw_reader_for(request: GroupRequest) -> tuple[raw_fetch.RawReader | None, str]:
    """The worker's raw reader for the request's topic and settings, and how the group is read."""
    global _raw_reader
    wanted = (request.topic, repr(sorted(request.client_config.items())))
    if _raw_reader is None or _raw_reader[0] != wanted:
        _close_raw_reader()
        try:
            _raw_reader = (wanted, raw_fetch.RawReader(request.topic, request.client_config, GROUP_IDLE_S),
                           "as raw batches")
        except raw_fetch.RawFetchUnusable as exc:
            _raw_reader = (wanted, None, f"with the consumer: {exc}")
        except Exception as exc:  # a fault of the raw reader itself (its client missing, say): the consumer reads
            _raw_reader = (wanted, None, f"with the consumer: the raw reader did not start: {exc!r}")
    return _raw_reader[1], _raw_reader[2]


def _close_raw_reader() -> None:
    global _raw_reader
    if _raw_reader is not None:
        reader, _raw_reader = _raw_reader[1], None
        if reader is not None:
            reader.close()


def _no_own_write(request: str) -> bool:
    return False


def main() -> int:
    """The worker: say hello, then fold each share it is handed and answer; exit at end of input."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the applier's pipe
    gc.disable()  # as the applier folds: many short-lived acyclic objects, and a large state the GC rescans
    try:
        _send(out, (_PROTOCOL, str(Path(__file__).resolve())))
        while True:
            request = _read_frame(sys.stdin.buffer)
            if not isinstance(request, (tuple, GroupRequest)):  # end of input: the backlog ended, or went on
                return 0                                          # without this worker
            records: list[Record] = []
            try:
                answer: WorkerShare | GroupShare | GroupTooLarge | str
                if isinstance(request, GroupRequest):
                    answer = read_group(request)
                else:
                    records_path, directory = request
                    with open(records_path, "rb") as source:
                        records = pickle.load(source)
                    os.unlink(records_path)
                    answer = fold_share(records, Path(directory))
            except Exception:
                answer = f"it failed: {traceback.format_exc()}"
            del records
            _send(out, answer)
            del answer
    except BrokenPipeError:  # the applier is gone (its node stopped); the next load removes what this one wrote
        pass
    finally:
        _close_consumer()
        _close_raw_reader()
    return 0


if __name__ == "__main__":
    # As the module itself, so that what the worker pickles names rlmm.fresh_load, not __main__.
    from rlmm.fresh_load import main as worker_main

    sys.exit(worker_main())
