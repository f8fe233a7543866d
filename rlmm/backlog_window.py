"""A backlog's window: the records a reader consumed, kept as Kafka's log cleaner would leave them (the newest of each
key), to be replayed in (metadata partition, offset) order. The applier reads its windows (rlmm.applier); a new
node's worker processes read theirs (rlmm.fresh_load.read_group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from rlmm import codec
from rlmm.events import SEGMENT_KEY_PREFIX, segment_key_ids
from rlmm.view import ConsumedRecord, MetadataView

if TYPE_CHECKING:  # a fold worker reads without the consumer, and does not import it (rlmm.fresh_load)
    from confluent_kafka import Message


class WindowRecord(NamedTuple):
    """One consumed record of a backlog window, undecoded."""

    metadata_partition: int
    offset: int
    key: bytes
    value: bytes | None
    request: str | None
    skipped_before: bool = False  # older records of its key may be missing (skipped by the window or the cleaner)

    def decoded(self) -> ConsumedRecord:
        """The record decoded (DecodeError or InvalidArgumentError for bytes no tierlog wrote)."""
        key, event = codec.decode_record(self.key, self.value)
        return ConsumedRecord(self.metadata_partition, self.offset, key, event, self.value, self.skipped_before)


def holds_segment(view: MetadataView, raw_key: bytes) -> bool:
    """Whether the committed view holds the segment a segment record key names (True for a key that does not
    parse, so that its record is kept and halts its partition like any unreadable record)."""
    try:
        topic_id, number, segment_id = segment_key_ids(raw_key)
    except (UnicodeDecodeError, ValueError):
        return True
    return view.holds_segment(topic_id, number, segment_id)


def holds_nothing(raw_key: bytes) -> bool:
    """For a window over a view that holds no segment yet (a new node's)."""
    return False


class CompactedWindow:
    """A window of a backlog as Kafka's log cleaner would leave it: the newest record of each key (by its raw bytes;
    superseded records are never decoded), replayed in (metadata partition, offset) order. DESIGN.md "Compaction
    invariance": a log that keeps the newest record of every key replays to the view every record replays to.

    A key one of this node's pending writes touched keeps every record from that write on (and the newest before
    it), so the writer sees its record applied with the outcome a full replay gives it. A segment tombstone for a
    segment the view does not hold leaves nothing to replay of its key: applied, it would change nothing. A tombstone
    a later record of its key supersedes (the id used again) is replayed too, before it: the later record then
    applies to nothing, as in a full replay, not to the state the tombstone removed.
    """

    def __init__(self, is_own_pending: Callable[[str], bool], holds_segment: Callable[[bytes], bool]) -> None:
        self._is_own_pending = is_own_pending
        self._holds_segment = holds_segment
        # Plain tuples (metadata partition, offset, key, value, request, skipped_before): most records are
        # superseded, so adding one must cost little; only the records replayed become WindowRecords.
        self._newest: dict[bytes, _Entry] = {}
        self._every: dict[bytes, list[_Entry]] = {}
        self._superseded_tombstones: list[_Entry] = []
        self.ends: dict[int, int] = {}  # metadata partition -> the offset after its last record in the window
        self.records = 0

    def add(self, partition: int, offset: int, key: bytes, value: bytes | None, request: str | None,
            after_cleaning: bool = False) -> None:
        """Add a consumed record; `after_cleaning`: Kafka's log cleaner removed records before it since its partition
        was last read to the end, so older records of its key may be missing too."""
        self.records += 1
        self.ends[partition] = offset + 1
        self.keep(partition, offset, key, value, request, after_cleaning)

    def keep(self, partition: int, offset: int, key: bytes, value: bytes | None, request: str | None,
             after_cleaning: bool) -> None:
        """`add`, for a reader that notes `records` and `ends` itself, a batch at a time (the applier)."""
        every = self._every.get(key)
        if every is not None:
            every.append((partition, offset, key, value, request, False))
        elif request is not None and self._is_own_pending(request):
            before = self._newest.pop(key, None)
            entry = (partition, offset, key, value, request, after_cleaning and before is None)
            self._every[key] = [entry] if before is None else [before, entry]
        elif value is None and key.startswith(SEGMENT_KEY_PREFIX) and not self._holds_segment(key):
            self._newest.pop(key, None)
        else:
            before = self._newest.get(key)
            if before is not None and before[3] is None:
                self._superseded_tombstones.append(before)
            self._newest[key] = (partition, offset, key, value, request, skipped_since(before, after_cleaning))

    def plain_tables(self) -> tuple[dict[bytes, _Entry], list[_Entry], Callable[[bytes], bool]] | None:
        """What `keep`'s plain path (no record of this node's writes) changes, for a reader that inlines it; None
        once the window holds records of this node's writes, which every later record of their keys must join."""
        return None if self._every else (self._newest, self._superseded_tombstones, self._holds_segment)

    def kept(self) -> int:
        """How many keys the window holds records of."""
        return len(self._newest) + len(self._every) + len(self._superseded_tombstones)

    def clear(self) -> None:
        """Drop the records held (once replay_order has taken them)."""
        self._newest, self._every, self._superseded_tombstones = {}, {}, []

    def replay_order(self) -> list[WindowRecord]:
        """The records to apply, in (metadata partition, offset) order."""
        return [WindowRecord(*entry) for entry in self.replay_entries()]

    def replay_entries(self) -> list[_Entry]:
        """`replay_order`'s records as plain tuples of a WindowRecord's fields (a fold worker's records)."""
        kept = [*self._newest.values(), *(entry for every in self._every.values() for entry in every),
                *self._superseded_tombstones]
        kept.sort()  # (partition, offset) come first and are unique
        return kept


_Entry = tuple[int, int, bytes, bytes | None, str | None, bool]


def skipped_since(before: _Entry | None, after_cleaning: bool) -> bool:
    """Whether a record that supersedes `before` (the newest record of its key the window held, if any) may stand for
    records of its key the window does not replay: `before` and whatever it stood for, unless `before` is a tombstone,
    which is replayed (nothing of the key comes between the two); with nothing before it, whatever the log cleaner
    removed."""
    if before is None:
        return after_cleaning
    return before[3] is not None


def position(message: Message) -> tuple[int, int]:
    """A consumed record's (metadata partition, offset)."""
    partition, offset = message.partition(), message.offset()
    assert partition is not None and offset is not None, "consumed records always have a position"
    return partition, offset
