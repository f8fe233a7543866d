"""Snapshot bootstrap: a node with an empty state dir loads the newest verified snapshot, then tails the topic.

Snapshots live at `<snapshot.location>/<metadata topic>/<topic id>/<created ms:020d>-<sha256>.avro` (the format
is `rlmm.archive`'s); rlmm reads them through `SnapshotSource`, so it never imports a storage client.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlmm.archive import RECORDS_FORMAT, SnapshotHeader, read_snapshot, stream_snapshot
from rlmm.config import ConfigKey, parse_int, parse_str
from rlmm.errors import SnapshotError
from rlmm.event_log import OffsetReader, TopicInfo
from rlmm.snapshot import load_into
from rlmm.view import MetadataView

log = logging.getLogger(__name__)

LOCATION_KEY = "snapshot.location"
MAX_AGE_KEY = "snapshot.max.age.ms"
CONFIG_KEYS = (
    # Prefix in the bucket the agent's storage backend serves; empty: a new node rebuilds from the topic.
    ConfigKey(LOCATION_KEY, parse_str, ""),
    # Oldest snapshot a node may start from. By default the topic's delete.retention.ms: past it, compaction may
    # have dropped tombstones the snapshot's records still need to see.
    ConfigKey(MAX_AGE_KEY, parse_int, None, check=lambda v: v >= 0, requirement=">= 0"),
)
_NAME = re.compile(r"^(?P<created>\d{20})-(?P<sha256>[0-9a-f]{64})\.avro$")


class ObjectStream(Protocol):
    """An object's bytes from the start: `read(n)` returns at most n bytes, fewer only at the end or as they arrive."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class SnapshotSource(Protocol):
    """Read access to the snapshots in the bucket: list keys under a prefix, open one object as a stream (closing
    it releases the connection)."""

    def list_keys(self, prefix: str) -> Iterable[str]: ...

    def open(self, key: str) -> ObjectStream: ...


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """One snapshot object, as its key names it."""

    key: str
    created_ms: int
    sha256: str


@dataclass(frozen=True, slots=True)
class TopicPosition:
    """What decides whether a snapshot of the metadata topic is still usable."""

    topic_id: str
    delete_retention_ms: int
    log_start_offsets: Mapping[int, int]


def snapshot_prefix(location: str, metadata_topic: str, topic_id: str) -> str:
    # Topic ids print as standard base64, which may hold "/": keep the id one path segment.
    return f"{location.strip('/')}/{metadata_topic}/{topic_id.replace('/', '_').replace('+', '-')}/"


def snapshot_key(location: str, metadata_topic: str, topic_id: str, created_ms: int, data: bytes | Path) -> str:
    """The key a snapshot's bytes (or the file holding them) are stored under: newest sorts last, and the name
    carries the digest."""
    return f"{snapshot_prefix(location, metadata_topic, topic_id)}{created_ms:020d}-{sha256_hex(data)}.avro"


def sha256_hex(data: bytes | Path) -> str:
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    with data.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def list_snapshots(source: SnapshotSource, location: str, metadata_topic: str, topic_id: str) -> list[SnapshotRef]:
    """The snapshots of one metadata topic (this incarnation of it: its topic id), newest first."""
    refs = []
    for key in source.list_keys(snapshot_prefix(location, metadata_topic, topic_id)):
        match = _NAME.match(key.rsplit("/", 1)[-1])
        if match is not None:
            refs.append(SnapshotRef(key, int(match["created"]), match["sha256"]))
    return sorted(refs, key=lambda r: r.created_ms, reverse=True)


def read_verified(source: SnapshotSource, ref: SnapshotRef) -> bytes:
    """The snapshot's bytes, or SnapshotError when they do not match the digest its name carries."""
    with contextlib.closing(source.open(ref.key)) as body:
        data = body.read()
    if sha256_hex(data) != ref.sha256:
        raise SnapshotError(f"snapshot {ref.key} is corrupt: its sha256 is {sha256_hex(data)}, its name says "
                            f"{ref.sha256}")
    return data


class VerifiedStream(io.RawIOBase):
    """A snapshot object's bytes as they arrive from the source, hashed on the way: `verify` reads what is left
    unread, then raises SnapshotError unless the object's sha256 is the one its name carries.

    A thread of its own downloads and hashes up to READ_AHEAD_BYTES ahead of the reader, so that the download
    overlaps the reader's work (a bootstrap writes the snapshot's tables to disk as it reads them): both wait on
    I/O or hash without the interpreter's lock. A read waits at most READ_STALL_S for the next bytes; an error of
    the source is raised to the reader. Closing it stops the thread (within its current read of the source), and
    leaves the source's stream open (its opener closes it, after this)."""

    def __init__(self, raw: ObjectStream, ref: SnapshotRef) -> None:
        super().__init__()
        self._raw = raw
        self._ref = ref
        self._hash = hashlib.sha256()
        self._arrived: queue.Queue[bytes | BaseException | None] = queue.Queue(
            maxsize=max(READ_AHEAD_BYTES // _READ_BYTES, 1))
        self._current = memoryview(b"")
        self._ended = False
        self._failed: BaseException | None = None  # what the source raised
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._download, name=f"tierlog-snapshot-read-{ref.key}", daemon=True)
        self._thread.start()

    def _download(self) -> None:
        try:
            while not self._stopping.is_set():
                data = self._raw.read(_READ_BYTES)
                if not data:
                    break
                self._hash.update(data)
                self._hand_over(data)
            self._hand_over(None)
        except BaseException as exc:  # the reader raises it, as if it had read the source itself
            self._hand_over(exc)

    def _hand_over(self, item: bytes | BaseException | None) -> None:
        while not self._stopping.is_set():  # a reader that closed never takes it
            with contextlib.suppress(queue.Full):
                self._arrived.put(item, timeout=_HAND_OVER_POLL_S)
                return

    def _next(self) -> bool:
        """Take the next bytes that arrived into `_current`; False at the object's end."""
        if self._ended:
            return False
        try:
            item = self._arrived.get(timeout=READ_STALL_S)
        except queue.Empty:
            raise SnapshotError(f"snapshot {self._ref.key}: no bytes arrived in {READ_STALL_S:g} s") from None
        if isinstance(item, BaseException):
            self._ended, self._failed = True, item
            raise item
        if item is None:
            self._ended = True
            return False
        self._current = memoryview(item)
        return True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not self._current and not self._next():
            return 0
        taken = min(len(view), len(self._current))
        view[:taken] = self._current[:taken]
        self._current = self._current[taken:]
        return taken

    def read_chunk(self) -> memoryview:
        """The next bytes as they arrived (what a `readinto` left of them first), without copying them; empty at
        the end."""
        if not self._current and not self._next():
            return memoryview(b"")
        chunk, self._current = self._current, memoryview(b"")
        return chunk

    def verify(self) -> None:
        while self._next():  # the rest, hashed as it arrives
            pass
        self._current = memoryview(b"")
        if self._failed is not None:
            raise SnapshotError(f"snapshot {self._ref.key} could not be read whole: {self._failed!r}") \
                from self._failed
        digest = self._hash.hexdigest()  # the thread hashed everything before it handed the end over
        if digest != self._ref.sha256:
            raise SnapshotError(f"snapshot {self._ref.key} is corrupt: its sha256 is {digest}, its name says "
                                f"{self._ref.sha256}")

    def close(self) -> None:
        self._stopping.set()
        # Its current read of the source ends it; a read that hangs ends when the opener closes the source next.
        self._thread.join(_CLOSE_WAIT_S)
        super().close()


# The download's reads of the source, and how far it reads ahead of the reader.
_READ_BYTES = 1 << 20
READ_AHEAD_BYTES = 16 << 20
# How long a read waits for the source's next bytes (the source's own timeouts come first: an S3 read's is 60 s),
# and how often the download checks that its reader is still there while it waits for room.
READ_STALL_S = 120.0
_HAND_OVER_POLL_S = 0.1
_CLOSE_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a snapshot is not used: `stale` (older snapshots are staler still) or foreign."""

    stale: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


def why_not_trusted(header: SnapshotHeader, metadata_topic: str, position: TopicPosition, now_ms: int,
                    max_age_ms: int | None = None) -> Refusal | None:
    """Why a snapshot must not seed a view that then tails the topic from the snapshot's end offsets, or None.

    Foreign: it was taken of another topic, or of another incarnation of this one (its header names another topic
    id; files written before the header named one are checked only by where they are filed). Stale: it is older
    than the topic keeps tombstones (`max_age_ms`, by default delete.retention.ms), so deletions after it may be
    gone, or the topic no longer holds the records after its end offsets."""
    if header.metadata_topic != metadata_topic:
        return Refusal(False, f"it is foreign: it holds topic {header.metadata_topic}, not {metadata_topic}")
    if header.topic_id is not None and header.topic_id != position.topic_id:
        return Refusal(False, f"it is foreign: it was taken of topic id {header.topic_id}, but {metadata_topic} is "
                              f"topic id {position.topic_id} (deleted and recreated, or another cluster)")
    max_age = position.delete_retention_ms if max_age_ms is None else max_age_ms
    if header.created_ms is not None and now_ms - header.created_ms > max_age:
        return Refusal(True, f"it is stale: taken {now_ms - header.created_ms} ms ago, longer than the topic keeps "
                             f"tombstones ({max_age} ms), so deletions after it may be gone")
    behind = {p: e for p, e in sorted(header.end_offsets.items()) if position.log_start_offsets.get(p, 0) > e}
    if behind:
        return Refusal(True, "it is stale: the topic no longer holds the records after its end offsets (partition: "
                             "snapshot end < log start) "
                             + ", ".join(f"{p}: {e} < {position.log_start_offsets[p]}" for p, e in behind.items()))
    return None


def bootstrap_from_snapshot(
    view: MetadataView, source: SnapshotSource, location: str, metadata_topic: str, position: TopicPosition,
    now_ms: int, max_age_ms: int | None = None,
) -> SnapshotRef | None:
    """Load the newest usable snapshot into an empty view; None (with a log line saying why) means the node rebuilds
    from the topic.

    The view records the snapshot as its source last: a load cut short (a crash, an I/O error) leaves a view with
    entries but no source, or no applied offsets, which the manager never resumes from (rlmm.manager)."""
    if view.holds_entries():
        raise SnapshotError(f"view at {view.path} is not empty; a snapshot loads only into an empty view")
    max_age = position.delete_retention_ms if max_age_ms is None else max_age_ms
    try:
        refs = list_snapshots(source, location, metadata_topic, position.topic_id)
    except Exception as exc:  # the source is the agent's bucket; the topic always works, so fall back to it
        log.warning("cannot list snapshots under %s (%s); rebuilding from the topic", location, exc)
        return None
    if not refs:
        log.info("no snapshot of %s under %s; rebuilding from the topic", metadata_topic, location)
    for ref in refs:
        if now_ms - ref.created_ms > max_age:
            # Older ones are older still: compaction may have removed tombstones they would need.
            log.warning("snapshot %s is stale (%d ms old, more than %d ms); rebuilding from the topic",
                        ref.key, now_ms - ref.created_ms, max_age)
            return None
        try:
            return ref if _load(ref, source, view, metadata_topic, position, now_ms, max_age) else None
        except Exception as exc:  # corrupt, foreign, unreadable: any of them leaves the topic, which always works
            if view.holds_entries():  # refused or failed part way through loading: the manager starts afresh
                log.warning("snapshot %s is unusable (%s); rebuilding from the topic", ref.key, exc)
                return None
            log.warning("snapshot %s is unusable (%s); trying an older one, else rebuilding from the topic",
                        ref.key, exc)
    return None


def _load(ref: SnapshotRef, source: SnapshotSource, view: MetadataView, metadata_topic: str,
          position: TopicPosition, now_ms: int, max_age_ms: int) -> bool:
    # Read as it arrives: a view snapshot's tables (or entries) are written beside the view while the object is
    # downloaded and hashed, and enter the view only once all of it is read and its sha256 is the one its name
    # carries (load_into consumes every datum before it ingests anything). An archive snapshot (format 1) is
    # replayed record by record into the view, so it is read and verified whole first.
    with contextlib.closing(source.open(ref.key)) as body, contextlib.closing(VerifiedStream(body, ref)) as raw:
        try:
            header, datums = stream_snapshot(raw.read_chunk, ref.key)
        except Exception:
            raw.verify()  # a header that does not read is blamed on a corrupt object when it is one
            raise
        reason = why_not_trusted(header, metadata_topic, position, now_ms, max_age_ms)
        if reason is not None and reason.stale:  # older ones are staler still
            log.warning("snapshot %s is unusable: %s; rebuilding from the topic", ref.key, reason)
            return False
        if reason is not None:
            raise SnapshotError(str(reason))
        if header.format == RECORDS_FORMAT:
            header, datums = read_snapshot(io.BytesIO(read_verified(source, ref)), ref.key)
        else:
            datums = _verified_at_end(datums, raw)
        load_into(view, header, datums)
    # The view resumes as if it had last applied a batch when the snapshot was taken: the manager's staleness rules
    # (tombstone window, topic id) then hold for it as for any other view. Written last, it marks the load finished.
    view.set_source(metadata_topic, position.topic_id, ref.created_ms)
    log.info("bootstrapped %s from snapshot %s (format %d); tailing the topic from its end offsets", view.path,
             ref.key, header.format)
    return True


def _verified_at_end(datums: Iterator[dict[str, Any]], raw: VerifiedStream) -> Iterator[dict[str, Any]]:
    """The datums, then the object's sha256 checked; a datum that does not read is blamed on a corrupt object when
    the object's bytes are not those its name carries."""
    try:
        yield from datums
    except Exception:
        raw.verify()
        raise
    raw.verify()


def maybe_bootstrap(view: MetadataView, config: Mapping[str, Any], source: SnapshotSource | None, topic: TopicInfo,
                    offsets: OffsetReader, now_ms: int, timeout_s: float) -> SnapshotRef | None:
    """The manager's hook, for a view that holds nothing yet: with a source and a `snapshot.location`, load the
    newest usable snapshot into it."""
    location = config[LOCATION_KEY]
    if source is None or not location:
        return None
    metadata_topic = config["metadata.topic.name"]
    starts = offsets.start_offsets(list(range(config["metadata.topic.num.partitions"])), timeout_s)
    position = TopicPosition(topic.topic_id, topic.delete_retention_ms, starts)
    return bootstrap_from_snapshot(view, source, location, metadata_topic, position, now_ms, config[MAX_AGE_KEY])
