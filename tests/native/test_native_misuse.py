"""Misuse of the C extensions that once corrupted memory (issue 24's sanitizer findings) now raises, falls back to
Python, or answers from memory the extension holds: one test per finding, over the checkout's normal build.

Each runs in a fresh interpreter (with CPython's debug allocator, which fills freed memory), so that a regression (a
segfault, or freed memory read back) fails that test, not the whole pytest process; the fuzz targets of
tests/native/test_native_fuzz.py reach these shapes too, under the sanitizers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from sanitizer import REPO_ROOT

# Every script starts from the same partition, looked up through the manager's readable type.
LOOKUP_PREAMBLE = """
import gc, uuid
from rlmm._segment_lookup import ReadableTable, SegmentLookup
from rlmm.manager import _Readable
from rlmm.read_model import EpochFloors, PartitionSnapshot
from rlmm.types import TopicIdPartition

class Answer:
    __slots__ = ("name",)
    def __init__(self, name):
        self.name = name

TP = TopicIdPartition(uuid.UUID(int=7), "orders", 3)
KEY = (TP.topic_id.int, TP.partition)

def snapshot(name):  # one epoch (0) whose floor [0, 99] answers a fresh object only the snapshot holds
    return PartitionSnapshot(floors={0: EpochFloors.of([0], [Answer(name)], [99])})

def readable(snapshot):
    made = _Readable(TP.topic, b"key", 0)
    made.snapshot = snapshot
    return made

table = ReadableTable()
lookup = SegmentLookup(table, {}, TopicIdPartition, lambda *args: "fallback")
"""


def _run_isolated(script: str, preamble: str = "") -> list[str]:
    """The lines `script` prints, run after `preamble` in a fresh interpreter; a crash fails the test with what it
    printed."""
    source = preamble + textwrap.dedent(script)
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", source], cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONMALLOC": "debug"},
                            capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, (f"the script ended with status {result.returncode} (a negative status is the "
                                    f"signal that ended it)\n{result.stdout}\n{result.stderr[-4000:]}")
    return result.stdout.splitlines()


def test_a_published_snapshot_changed_in_place_is_answered_from_objects_the_lookup_holds() -> None:
    # The flat floors borrowed the answers of the snapshot's sole_segments tuple: replacing the snapshot's
    # attributes freed them, and the next lookup returned freed memory.
    assert _run_isolated(preamble=LOOKUP_PREAMBLE, script="""
        published = snapshot("first")
        table[KEY] = readable(published)
        print(lookup(TP, 0, 5).name)  # copies the floors
        fresh = snapshot("second")
        for name in ("sole_segments", "sole_floors", "floors"):  # no reference to the first answer is left here
            object.__setattr__(published, name, getattr(fresh, name))
        gc.collect()
        garbage = [Answer("reused") for _ in range(1000)]  # would take the freed memory
        print(lookup(TP, 0, 5).name)  # the copy's answer: the published snapshot is never changed, as documented
        table[KEY].snapshot = fresh  # republished the documented way: the new answer
        print(lookup(TP, 0, 5).name)
    """) == ["first", "first", "second"]


def test_a_snapshot_whose_attribute_read_grows_the_table_is_answered_and_the_table_stays_whole() -> None:
    # A slot pointer was held across the snapshot's attribute reads: Python code they ran grew the table (moving
    # its slots), and the flat floors were written to the freed slot array.
    assert _run_isolated(preamble=LOOKUP_PREAMBLE, script="""
        class Growing:
            def __init__(self, inner):
                self.inner, self.grown, self.reads = inner, False, 0
            def __getattr__(self, name):
                self.reads += 1
                if not self.grown:
                    self.grown = True
                    for partition in range(100, 200):
                        table[(KEY[0], partition)] = readable(snapshot(str(partition)))
                return getattr(self.inner, name)

        growing = Growing(snapshot("first"))
        table[KEY] = readable(growing)
        print(lookup(TP, 0, 5).name, len(table), growing.reads)
        print(lookup(TP, 0, 5).name, growing.reads)  # from the floors the first lookup kept in the grown table
        print(all(table[(KEY[0], p)].snapshot.answer_for_offset(0, 5).name == str(p) for p in range(100, 200)))
        for removed in ("removed", "cleared"):  # the partition goes while its snapshot is read: the fallback answers
            class Going(Growing):
                def __getattr__(self, name, removed=removed):
                    if not self.grown:
                        self.grown = True
                        table.pop(KEY) if removed == "removed" else table.clear()
                    return getattr(self.inner, name)
            table[KEY] = readable(Going(snapshot("gone")))
            print(lookup(TP, 0, 5), KEY in table)
    """) == ["first 101 4", "first 4", "True", "fallback False", "fallback False"]


def test_slots_of_another_class_are_not_read_in_instances_without_them() -> None:
    # A member descriptor's offset was used without checking it belongs to the type: another class's descriptors
    # set on a class without those slots made the lookup read past the object.
    assert _run_isolated(preamble=LOOKUP_PREAMBLE, script="""
        from rlmm.read_model import SnapshotSlot

        class Tiny:  # no room for slots, yet the readable's descriptors
            __slots__ = ()
        for name in ("topic", "metadata_partition"):
            setattr(Tiny, name, _Readable.__dict__[name])
        Tiny.snapshot = SnapshotSlot.__dict__["snapshot"]
        table[KEY] = Tiny()
        print(lookup(TP, 0, 5))

        class TinyTp:  # a TopicIdPartition look-alike of that kind
            __slots__ = ()
        for name in ("topic_id", "topic", "partition"):
            setattr(TinyTp, name, TopicIdPartition.__dict__[name])
        print(SegmentLookup(table, {}, TinyTp, lambda *args: "fallback")(TinyTp(), 0, 5))

        table[KEY] = readable(snapshot("first"))  # the right layout again: answered in C
        print(lookup(TP, 0, 5).name)
    """) == ["fallback", "fallback", "first"]


def test_the_avro_reader_refuses_a_program_check_would_refuse() -> None:
    # read() trusted that check() had taken its program: a malformed one made it index past its tuples.
    lines = _run_isolated("""
        from rlmm import _avro_reader as a

        programs = [
            (), (a.OP_ENUM,), (a.OP_UNION,), (a.OP_RECORD,), (a.OP_ARRAY,), [a.OP_LONG], ("long",), (99,), (-1,),
            (1 << 70,), (a.OP_LONG, 1), (a.OP_RECORD, (("name",),)), (a.OP_RECORD, ((1, (a.OP_LONG,)),)),
            (a.OP_RECORD, ("field",)), (a.OP_ENUM, (1,)), (a.OP_ENUM, ["A"]), (a.OP_UNION, ((),)),
            (a.OP_UNION, ([a.OP_LONG],)), (a.OP_ARRAY, (a.OP_RECORD,)), (a.OP_ARRAY, "long"), (a.OP_TUPLE,),
            (a.OP_TUPLE, ("long",)), (a.OP_TUPLE, [(a.OP_LONG,)]), (a.OP_TUPLE, (("name", (a.OP_LONG,)),)),
        ]
        for program in programs:  # the bytes: index 0 of an enum or a union, an array of one item
            try:
                a.read(program, b"\\x02\\x00" if program[:1] == (a.OP_ARRAY,) else b"\\x00\\x00", 0)
            except TypeError as error:
                print(a.check(program), "TypeError", error)
            else:
                print(a.check(program), "read", program)
        for start in (-1, 6, 1 << 70, -(1 << 70)):
            try:
                a.read((a.OP_LONG,), b"\\x02", start)
            except ValueError as error:
                print("ValueError", error)
    """)
    refused = [line for line in lines[:24] if line.startswith("False TypeError not an Avro reader program")]
    assert len(lines) == 28 and refused == lines[:24], lines
    assert lines[24:] == ["ValueError read: start out of range of the data"] * 4


def test_a_maker_refuses_classes_whose_new_does_more_than_object_new() -> None:
    # maker skipped the class's __new__: a dict's or an exception's instance built without it crashed on use.
    lines = _run_isolated("""
        import abc, uuid
        from rlmm import _slots

        class Dict(dict):
            __slots__ = ("a",)
        class Error(Exception):
            __slots__ = ("a",)
        class Listed(list):
            __slots__ = ("a",)
        class OwnNew:
            __slots__ = ("a",)
            def __new__(cls):
                return super().__new__(cls)
        class Abstract(abc.ABC):
            __slots__ = ("a",)
            @abc.abstractmethod
            def method(self): ...
        class Over(uuid.UUID):  # a class statement's class over plain ones: taken
            __slots__ = ("a",)
        for cls in (Dict, Error, Listed, OwnNew, Abstract, Over):
            try:
                made = _slots.maker(cls, ("a",))(1)
            except TypeError as error:
                print(cls.__name__, "TypeError", "not a plain class" in str(error))
            else:
                print(cls.__name__, "made", made.a)
    """)
    assert lines == ["Dict TypeError True", "Error TypeError True", "Listed TypeError True", "OwnNew TypeError True",
                     "Abstract TypeError True", "Over made 1"]
