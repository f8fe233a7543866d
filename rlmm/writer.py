"""The write side of the manager: pending writes, their deadlines, and the producer that appends them.

Like Kafka's ProducerManager. A timer thread polls the producer and fails every write past its deadline, so a
future always completes by its deadline whatever the applier is doing. Futures are settled outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message

from rlmm import codec, state
from rlmm.errors import MetadataTimeoutError, RemoteStorageError
from rlmm.event_log import EventProducer
from rlmm.events import MetadataEvent, RecordKey
from rlmm.types import TopicIdPartition
from rlmm.view import ConsumedRecord, MetadataView

log = logging.getLogger(__name__)

REQUEST_HEADER = "tierlog.request"
# How often the timer thread serves delivery reports and checks deadlines.
TICK_S = 0.05
# Corrections one write may append in a row (rlmm.state.corrections_after): each is needed only when another
# writer's record landed first, so a longer chain means two writers keep racing; the next write settles it.
MAX_CORRECTIONS = 3

Record = tuple[RecordKey, MetadataEvent | None]


@dataclass
class PendingWrite:
    """One API write: its primary record and the follow-ups (checkpoint, tombstones) it must see applied."""

    future: Future[None]
    tp: TopicIdPartition
    metadata_partition: int
    deadline: float
    doomed: list[RecordKey] = field(default_factory=list)
    outstanding: set[str] = field(default_factory=set)  # request ids produced, not yet applied
    acked: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)
    primary: str = ""
    corrections: int = 0  # corrections appended for this write, or before it (a restatement's chain)


@dataclass(frozen=True)
class Append:
    """A record registered under a request id, to be produced once the lock is released."""

    pending: PendingWrite
    request: str
    key: RecordKey
    event: MetadataEvent | None


class MetadataWriter:
    """Pending writes keyed by request id (a header on each record), completed on acknowledgement + apply."""

    def __init__(
        self, producer: EventProducer, lock: threading.Condition, broker_id: int, timeout_ms: int,
        timeout_hint: str, apply_problem: Callable[[], str | None], whole_partition_checkpoints: bool = False,
    ) -> None:
        self._producer = producer
        # Checkpoints of every epoch under the partition's key, which releases before per-epoch checkpoints read.
        self.whole_partition_checkpoints = whole_partition_checkpoints
        self._lock = lock
        self._broker_id = broker_id
        self._timeout_ms = timeout_ms
        self._timeout_hint = timeout_hint
        self._apply_problem = apply_problem
        self._pending: dict[str, PendingWrite] = {}
        self._writing: set[TopicIdPartition] = set()
        self._settle: list[tuple[Future[None], BaseException | None]] = []
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._run, name=f"tierlog-rlmm-writer-{broker_id}", daemon=True)
        self._timer.start()

    # --- called under the lock ---------------------------------------------------------------------------

    def has_pending(self) -> bool:
        """Whether any write of this node waits for its records. Safe without the lock (one read of a dict)."""
        return bool(self._pending)

    def is_pending(self, request: str) -> bool:
        """Whether `request` is a record of a write of this node not yet complete. A request id is registered before
        its record is produced, so a consumed record of such a write is always found. Safe without the lock."""
        return request in self._pending

    def busy_locked(self, tp: TopicIdPartition) -> bool:
        return tp in self._writing

    def begin_locked(self, tp: TopicIdPartition, metadata_partition: int, deadline: float) -> PendingWrite:
        self._writing.add(tp)
        return PendingWrite(Future(), tp, metadata_partition, deadline)

    def register_locked(self, pending: PendingWrite, records: Sequence[Record], primary: bool) -> list[Append]:
        """Give each record a request id; the last one is the write's primary record when `primary`."""
        appends = []
        for key, event in records:
            request = uuid.uuid4().hex
            pending.outstanding.add(request)
            self._pending[request] = pending
            appends.append(Append(pending, request, key, event))
        if primary and appends:
            pending.primary = appends[-1].request
        return appends

    def on_applied_locked(
        self, view: MetadataView, request: str | None, record: ConsumedRecord, outcome: state.Outcome
    ) -> list[Append]:
        """Note that this node applied a record it wrote; return the follow-ups to append."""
        pending = self._pending.get(request) if request else None
        if pending is None or request is None:
            return []
        pending.applied.add(request)
        follow_ups: list[Append] = []
        if request == pending.primary:
            if not outcome.applied:
                self._finish_locked(pending, RemoteStorageError(
                    f"metadata write for {pending.tp} was rejected when applied: {outcome.reason}"))
                return self._restate_locked(view, pending, record, outcome)
            if record.event is not None:  # a restated tombstone (rlmm.state.corrections_after) has no follow-ups
                follow_ups = self.register_locked(pending, state.records_after(
                    view, record.key, record.event, pending.doomed, _now_ms(), self._broker_id,
                    self.whole_partition_checkpoints), primary=False)
        elif outcome.stale and record.event is not None and pending.corrections < MAX_CORRECTIONS:
            # Our checkpoint landed after another writer's lineage change: append a current one before the write
            # completes, so the newest checkpoint on the topic describes the lineage again.
            pending.corrections += 1
            follow_ups = self.register_locked(pending, state.corrections_after(
                view, record.event, outcome, _now_ms(), self._broker_id, self.whole_partition_checkpoints),
                primary=False)
        self._maybe_complete_locked(pending)
        return follow_ups

    def _restate_locked(
        self, view: MetadataView, dropped: PendingWrite, record: ConsumedRecord, outcome: state.Outcome
    ) -> list[Append]:
        """After our record was dropped, append its key's current state again (a write of its own, whose caller
        already heard of the rejection), so that the newest record of the key describes the state."""
        if record.event is None or dropped.corrections >= MAX_CORRECTIONS:
            return []
        restated = state.corrections_after(view, record.event, outcome, _now_ms(), self._broker_id,
                                           self.whole_partition_checkpoints)
        if not restated:
            return []
        log.info("metadata record for %s at offset %d was dropped (%s); restating the current state of %s",
                 dropped.tp, record.offset, outcome.reason, record.key.encode().decode(errors="replace"))
        restating = self.begin_locked(dropped.tp, dropped.metadata_partition,
                                      time.monotonic() + self._timeout_ms / 1000)
        restating.corrections = dropped.corrections + 1
        return self.register_locked(restating, restated, primary=True)

    def fail_partition_locked(self, metadata_partition: int, error: BaseException) -> None:
        for pending in self._distinct_pending():
            if pending.metadata_partition == metadata_partition:
                self._finish_locked(pending, error)

    def fail_all_locked(self, error: BaseException) -> None:
        for pending in self._distinct_pending():
            self._finish_locked(pending, error)

    def _distinct_pending(self) -> list[PendingWrite]:
        return list({id(p): p for p in self._pending.values()}.values())

    def _maybe_complete_locked(self, pending: PendingWrite) -> None:
        if pending.outstanding <= pending.acked and pending.outstanding <= pending.applied:
            self._finish_locked(pending, None)

    def _finish_locked(self, pending: PendingWrite, error: BaseException | None) -> None:
        for request in pending.outstanding:
            self._pending.pop(request, None)
        self._writing.discard(pending.tp)
        self._lock.notify_all()
        if not pending.future.done():
            # Settled once the lock is released: a future's callbacks must not run holding it.
            self._settle.append((pending.future, error))

    # --- called without the lock ----------------------------------------------------------------------

    def produce(self, appends: Sequence[Append]) -> None:
        """Append the records in order; a write whose record cannot be queued (by its deadline, or at all) fails at
        once, and its later records are not appended."""
        failed: set[int] = set()  # the writes (by id) that failed here
        for append in appends:
            if id(append.pending) in failed:
                continue
            value = None if append.event is None else codec.encode(append.event)

            def delivered(error: KafkaError | None, message: Message, request: str = append.request) -> None:
                self._on_delivery(request, error)

            try:
                self._producer.append(append.pending.metadata_partition, append.key.encode(), value,
                                      [(REQUEST_HEADER, append.request.encode())], delivered,
                                      append.pending.deadline)
            except RemoteStorageError as exc:
                # Failed now, not at its deadline: until then the partition's next write would wait for it.
                failed.add(id(append.pending))
                with self._lock:
                    self._finish_locked(append.pending, exc)
        self.settle()

    def settle(self) -> None:
        """Complete the futures finished under the lock, now that it is released."""
        with self._lock:
            settle, self._settle = self._settle, []
        for future, error in settle:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _on_delivery(self, request: str, error: KafkaError | None) -> None:
        with self._lock:
            pending = self._pending.get(request)
            if pending is None:
                return
            if error is not None:
                self._finish_locked(pending, RemoteStorageError(
                    f"metadata write for {pending.tp} to the metadata topic failed: {error.str()}"))
            else:
                pending.acked.add(request)
                self._maybe_complete_locked(pending)

    # --- the timer thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._producer.poll(TICK_S)
                self._expire()
            except Exception:  # never let deadlines stop being enforced; the log says what failed
                log.exception("tierlog metadata writer on broker %s: delivery or expiry failed", self._broker_id)
                self._stop.wait(TICK_S)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [p for p in self._distinct_pending() if now > p.deadline]
            if expired:
                problem = self._apply_problem()
                because = f"; this node cannot apply the metadata log: {problem}" if problem else ""
                for pending in expired:
                    self._finish_locked(pending, MetadataTimeoutError(
                        f"metadata write for {pending.tp} was not acknowledged and applied within "
                        f"{self._timeout_ms} ms (write.timeout.ms){because}; {self._timeout_hint}"
                    ))
        self.settle()

    def close(self, timeout_s: float) -> None:
        """Fail what is still pending, stop the timer and flush the producer."""
        with self._lock:
            self.fail_all_locked(RemoteStorageError("RemoteLogMetadataManager closed before the write completed"))
        self.settle()
        self._stop.set()
        self._timer.join(timeout=timeout_s)
        self._producer.close(timeout_s)


def request_of(message: Message) -> str | None:
    headers: Any = message.headers() or ()
    for name, value in headers:
        if name == REQUEST_HEADER and value is not None:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def _now_ms() -> int:
    return int(time.time() * 1000)
