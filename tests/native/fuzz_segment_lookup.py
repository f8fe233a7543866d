"""Fuzz target of rlmm/_segment_lookup.c (run by run_fuzz.py).

A random run of what the manager and the read model do to a ReadableTable (partitions found readable, stopped,
cleared; snapshots published; metadata partitions halted) with lookups in between, each answered by the C lookup and
by its Python reference (the read model's snapshot: PartitionSnapshot.answer_for_offset behind the manager's
checks), which must be the same object. Mixed in, what no manager does but code in the process could: readables of
other layouts (another class's slot descriptors set on a class without them, properties), a lookup over a
TopicIdPartition look-alike of that kind, a published snapshot changed in place (its answers then freed), and
attribute reads or comparisons that run code which grows, shrinks or clears the table, republishes the snapshot or
looks up again. For partitions so treated any answer the reference could give is taken; none may crash.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable
from typing import Any

import atheris

from rlmm._segment_lookup import ReadableTable, SegmentLookup
from rlmm.read_model import EpochFloors, PartitionSnapshot, SnapshotSlot
from rlmm.types import TopicIdPartition

IDS = [uuid.UUID(int=value) for value in (0, 1, 2**64, 2**128 - 1)]
TOPICS = ("orders", "payments")
REFUSED = "refused"  # the manager raises, or answers through its full checks
FAILED = "failed"  # the reference itself met an object not as a manager keeps it


class _Readable(SnapshotSlot):
    """rlmm.manager._Readable's layout (importing the manager would double the target's start-up)."""

    __slots__ = ("key", "metadata_partition", "topic")

    def __init__(self, topic: str, key: bytes, metadata_partition: int) -> None:
        super().__init__()
        self.topic = topic
        self.key = key
        self.metadata_partition = metadata_partition


class Answer:
    """Stands in for a segment: an object only the snapshot holds (freed with it)."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


class _MoreSlots(_Readable):
    __slots__ = ("extra",)


class _Tiny:
    """Another class's slot descriptors on a class whose instances have no room for them."""

    __slots__ = ()


for _name in ("topic", "metadata_partition", "key"):
    setattr(_Tiny, _name, _Readable.__dict__[_name])
_Tiny.snapshot = _Readable.__mro__[1].__dict__["snapshot"]  # type: ignore[attr-defined]


class _TinyTp:
    """A TopicIdPartition look-alike of that kind."""

    __slots__ = ()


for _name in ("topic_id", "topic", "partition"):
    setattr(_TinyTp, _name, TopicIdPartition.__dict__[_name])


class _Properties:
    """A readable whose attributes are properties, not slots."""

    def __init__(self, topic: str, metadata_partition: int, snapshot: Any) -> None:
        self._values = (topic, metadata_partition)
        self.snapshot = snapshot

    topic = property(lambda self: self._values[0])
    metadata_partition = property(lambda self: self._values[1])


class _Hostile:
    """A snapshot whose first read of a lookup attribute runs `action` (then reads as `inner`)."""

    WATCHED = frozenset({"deleted", "sole_epoch", "sole_segments", "sole_bounds", "floors"})

    def __init__(self, inner: PartitionSnapshot, action: Callable[[], None]) -> None:
        self.inner = inner
        self.action: Callable[[], None] | None = action

    def __getattribute__(self, name: str) -> Any:
        if name in _Hostile.WATCHED:
            action, self.action = object.__getattribute__(self, "action"), None
            if action is not None:
                action()
            return getattr(object.__getattribute__(self, "inner"), name)
        if name == "answer_for_offset":
            return object.__getattribute__(self, "inner").answer_for_offset
        return object.__getattribute__(self, name)


class _Weird:
    """A topic name or metadata partition whose first comparison or hash runs `action`."""

    def __init__(self, value: object, action: Callable[[], None]) -> None:
        self.value = value
        self.action: Callable[[], None] | None = action

    def _act(self) -> None:
        action, self.action = self.action, None
        if action is not None:
            action()

    def __eq__(self, other: object) -> bool:
        self._act()
        return self.value == other

    def __hash__(self) -> int:
        self._act()
        return hash(self.value)


SLOTTED = (_Readable, _MoreSlots)


def _snapshot_of(readable: Any) -> Any:
    """A readable's snapshot, or None for one without (a _Tiny's descriptors refuse it)."""
    return readable.snapshot if type(readable) in (*SLOTTED, _Properties) else None


class World:
    """The table, the dict it stands for (the reference reads that), and the lookup over them."""

    def __init__(self, data: atheris.FuzzedDataProvider) -> None:
        self.data = data
        self.table = ReadableTable()
        self.model: dict[tuple[int, int], Any] = {}
        self.halted: dict[Any, Exception] = {}
        self.tainted: set[tuple[int, int]] = set()  # keys whose answers are checked only for not crashing
        self.lookup = SegmentLookup(self.table, self.halted, TopicIdPartition, self.reference)
        self.answers = 0

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """What the manager answers (or REFUSED where it raises or goes through its full checks)."""
        try:
            if kwargs or len(args) != 3:
                return REFUSED
            tp, epoch, offset = args
            if type(tp) is not TopicIdPartition or type(epoch) is not int or type(offset) is not int:
                return REFUSED
            readable = self.model.get((tp.topic_id.int, tp.partition))
            if epoch < 0 or offset < 0 or readable is None or readable.topic != tp.topic:
                return REFUSED
            if self.halted and readable.metadata_partition in self.halted:
                return REFUSED
            snapshot = readable.snapshot
            return REFUSED if snapshot.deleted else snapshot.answer_for_offset(epoch, offset)
        except Exception:
            return FAILED

    def key(self) -> tuple[int, int]:
        return IDS[self.data.ConsumeIntInRange(0, len(IDS) - 1)].int, self.data.ConsumeIntInRange(0, 2)

    def put(self, key: tuple[int, int], readable: Any) -> None:
        self.table[key] = self.model[key] = readable

    def remove(self, key: tuple[int, int]) -> None:
        self.table.pop(key, None)
        self.model.pop(key, None)

    def clear(self) -> None:
        self.table.clear()
        self.model.clear()

    def snapshot(self) -> PartitionSnapshot:
        if self.data.ConsumeIntInRange(0, 9) == 0:
            return PartitionSnapshot(deleted=True)
        floors = {}
        shape = self.data.ConsumeIntInRange(0, 7)  # mostly one epoch with floors, as most partitions have
        epochs = {self.data.ConsumeIntInRange(0, 3) for _ in range(0 if shape == 0 else 1 if shape < 6 else 3)}
        for epoch in sorted(epochs):
            starts, ends, start = [], [], self.data.ConsumeIntInRange(0, 5)
            answers: list[Any] = []  # stand-ins for segments
            for _ in range(self.data.ConsumeIntInRange(0, 6)):
                start += self.data.ConsumeIntInRange(0, 10)
                starts.append(start)
                ends.append(start + self.data.ConsumeIntInRange(-1, 12))
                self.answers += 1
                answers.append(Answer(self.answers) if self.data.ConsumeIntInRange(0, 4) else None)
            floors[epoch] = EpochFloors.of(starts, answers, ends)
        return PartitionSnapshot(floors=floors)

    def readable(self, snapshot: Any) -> Any:
        topic, metadata_partition = TOPICS[self.data.ConsumeIntInRange(0, 1)], self.data.ConsumeIntInRange(0, 2)
        kind = self.data.ConsumeIntInRange(0, 9)
        if kind == 0:
            return _Properties(topic, metadata_partition, snapshot)
        if kind == 1:
            return _Tiny()
        readable = (_MoreSlots if kind == 2 else _Readable)(topic, b"key", metadata_partition)
        readable.snapshot = snapshot
        return readable

    def action(self, key: tuple[int, int]) -> Callable[[], None]:
        """Code an attribute read or a comparison may run: it changes the table, the readable or looks up again."""
        what = self.data.ConsumeIntInRange(0, 4)
        grown = [self.key() for _ in range(8)]
        grown += [(IDS[0].int, 3 + n) for n in range(self.data.ConsumeIntInRange(0, 64))]
        fresh = self.snapshot()
        tp = TopicIdPartition(uuid.UUID(int=key[0]), TOPICS[0], key[1])

        def act() -> None:
            if what == 0:  # grown: the table's slots move
                for other in grown:
                    self.put(other, self.readable(fresh))
            elif what == 1:
                self.remove(key)
            elif what == 2:
                self.clear()
            elif what == 3 and _snapshot_of(self.model.get(key)) is not None:
                self.model[key].snapshot = fresh  # republished
            else:
                self.lookup(tp, 0, 0)

        return act

    def check_lookup(self, key: tuple[int, int], epoch: Any = None) -> None:
        """A lookup (of `key`, else mostly of a partition the table holds, by its name), against the reference."""
        if epoch is None and self.model and self.data.ConsumeIntInRange(0, 3):
            key = sorted(self.model)[self.data.ConsumeIntInRange(0, len(self.model) - 1)]
        topic = getattr(self.model.get(key), "topic", None) if type(self.model.get(key)) in SLOTTED else None
        if type(topic) is not str or self.data.ConsumeIntInRange(0, 7) == 0:
            topic = TOPICS[self.data.ConsumeIntInRange(0, 1)]
        tp = TopicIdPartition(uuid.UUID(int=key[0]), topic, key[1])
        epoch = self.data.ConsumeIntInRange(0, 4) if epoch is None else epoch
        offset: Any = self.data.ConsumeIntInRange(0, 70)
        odd = self.data.ConsumeIntInRange(0, 15)
        if odd == 1:
            epoch = [True, -1, 1 << 63, 1.0, None][self.data.ConsumeIntInRange(0, 4)]
        elif odd == 2:
            offset = [-1, 1 << 63, (1 << 63) - 1, 2.0, "1"][self.data.ConsumeIntInRange(0, 4)]
        found = self.lookup(tp, epoch, offset)
        if key in self.tainted:
            assert found in (REFUSED, FAILED, None) or (type(found) is Answer and found.number > 0), found
            return
        expected = self.reference(tp, epoch, offset)
        assert found is expected, (tp, epoch, offset, found, expected)

    def step(self) -> None:
        op = self.data.ConsumeIntInRange(0, 15)
        key = self.key()
        if op <= 2:
            self.put(key, self.readable(self.snapshot()))
            self.tainted.discard(key)
            readable = self.model[key]
            if type(readable) in SLOTTED and self.data.ConsumeIntInRange(0, 3) == 0:  # comparing runs code
                if self.data.ConsumeBool():
                    readable.topic = _Weird(readable.topic, self.action(key))
                else:
                    readable.metadata_partition = _Weird(readable.metadata_partition, self.action(key))
                self.tainted.add(key)
        elif op == 3 and _snapshot_of(self.model.get(key)) is not None:
            self.model[key].snapshot = self.snapshot()
        elif op == 4:
            self.remove(key)
        elif op == 5 and self.data.ConsumeIntInRange(0, 3) == 0:
            self.clear()
        elif op == 6 and (self.halted or self.data.ConsumeBool()):
            metadata_partition = self.data.ConsumeIntInRange(0, 2)
            if self.halted.pop(metadata_partition, None) is None:
                self.halted[metadata_partition] = RuntimeError("halted")
        elif op == 7 and type(snapshot := _snapshot_of(self.model.get(key))) is PartitionSnapshot:
            # Changed in place after a lookup copied it (its old answers are then freed), and looked up again.
            epoch = snapshot.sole_epoch
            self.check_lookup(key, epoch)
            fresh, whole = self.snapshot(), self.data.ConsumeIntInRange(0, 3) > 0
            for name in ("sole_segments", "sole_bounds", "sole_epoch", "sole_floors", "floors", "deleted"):
                if whole or self.data.ConsumeBool():
                    object.__setattr__(snapshot, name, getattr(fresh, name))
            self.tainted |= {other for other, readable in self.model.items() if _snapshot_of(readable) is snapshot}
            self.check_lookup(key, epoch)
        elif op == 8:
            self.put(key, self.readable(_Hostile(self.snapshot(), self.action(key))))
            self.tainted.add(key)
        elif op == 9:
            lookup = SegmentLookup(self.table, self.halted, _TinyTp, self.reference)
            assert lookup(_TinyTp(), 0, 0) is REFUSED
        elif op == 10:
            gc.collect(0)
        else:
            self.check_lookup(key)


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    world = World(data)
    for _ in range(data.ConsumeIntInRange(1, 40)):
        world.step()
    for key in list(world.model):  # every partition left, once more
        world.check_lookup(key)
    assert len(world.table) == len(world.model)
    assert all(world.table.get(key) is readable for key, readable in world.model.items())
