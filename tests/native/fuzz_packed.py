"""Fuzz target of rlmm/_slots.c's unpacker (run by run_fuzz.py).

rlmm.packed.unpack (in C where rlmm._slots was built) must answer every argument as rlmm.packed._unpack (Python)
answers it: an equal segment naming the same topic-partition object, or the same exception type. Arguments: bytes
packed from random segments (every layout: custom metadata, several epochs, a topic name of their own), the same
cut or with bytes changed (a flag, a state out of range), random bytes of any length, and objects that are not
bytes; topic-partitions real or not. An unpacker built over makers that raise now and then must pass their errors
on; one given the wrong arguments must refuse with TypeError.
"""

from __future__ import annotations

import gc
import uuid
from typing import Any

import atheris

from rlmm import _slots, packed
from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

TP = TopicIdPartition(uuid.UUID(int=11), "fuzzed", 2)


def _segment(data: atheris.FuzzedDataProvider) -> RemoteLogSegmentMetadata:
    start = data.ConsumeIntInRange(0, (1 << 63) - 2_000)
    end = start + data.ConsumeIntInRange(0, 1_000)
    epochs = {data.ConsumeIntInRange(0, 10): start}
    for _ in range(data.ConsumeIntInRange(0, 2) if data.ConsumeIntInRange(0, 3) == 0 else 0):
        epochs[max(epochs) + 1 + data.ConsumeIntInRange(0, 5)] = data.ConsumeIntInRange(max(epochs.values()), end)
    tp = TP if data.ConsumeIntInRange(0, 5) else TopicIdPartition(TP.topic_id, "other", TP.partition)
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(tp, uuid.UUID(int=data.ConsumeIntInRange(0, (1 << 128) - 1))), start, end,
        data.ConsumeIntInRange(-1, (1 << 63) - 1), data.ConsumeIntInRange(0, (1 << 31) - 1),
        data.ConsumeIntInRange(0, (1 << 63) - 1), data.ConsumeIntInRange(0, (1 << 31) - 1), epochs,
        None if data.ConsumeIntInRange(0, 3) else data.ConsumeBytes(data.ConsumeIntInRange(0, 20)),
        RemoteLogSegmentState(data.ConsumeIntInRange(0, 3)), data.ConsumeBool())


def _argument(data: atheris.FuzzedDataProvider) -> Any:
    kind = data.ConsumeIntInRange(0, 5)
    if kind <= 2:
        found = packed.pack(_segment(data), TP)
        if kind == 1:  # cut, or a byte changed (a flag, the state, anything)
            damaged = bytearray(found)
            if data.ConsumeBool():
                del damaged[data.ConsumeIntInRange(0, len(damaged)):]
            elif damaged:
                damaged[data.ConsumeIntInRange(0, len(damaged) - 1)] = data.ConsumeIntInRange(0, 255)
            found = bytes(damaged)
        return found
    if kind == 3:
        return data.ConsumeBytes(data.ConsumeIntInRange(0, 100))
    raw = data.ConsumeBytes(70)
    return [bytearray(raw), memoryview(raw), raw.hex(), None, 70][data.ConsumeIntInRange(0, 4)]


def _outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "answer", call(*args)
    except Exception as error:
        return "raised", type(error)


class _Flaky:
    """A maker that raises every `every`-th call, else makes what the real one makes."""

    def __init__(self, real: Any, every: int) -> None:
        self.real, self.every, self.calls = real, every, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.every and self.calls % self.every == 0:
            raise RuntimeError("maker failed")
        return self.real(*args)


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    for _ in range(data.ConsumeIntInRange(1, 8)):
        argument = _argument(data)
        tp = [TP, TopicIdPartition(TP.topic_id, "fuzzed", 2), None, object()][data.ConsumeIntInRange(0, 3)]
        native, python = _outcome(packed.unpack, argument, tp), _outcome(packed._unpack, argument, tp)
        assert native[0] == python[0], (argument, tp, native, python)
        if native[0] == "raised":
            assert native[1] is python[1], (argument, tp, native, python)
        else:
            assert type(native[1]) is RemoteLogSegmentMetadata and native[1] == python[1], (argument, native, python)
            named = native[1].remote_log_segment_id.topic_id_partition
            assert named is tp or named == python[1].remote_log_segment_id.topic_id_partition
    makers = [_Flaky(maker, data.ConsumeIntInRange(0, 3)) for maker in (
        packed._make_segment, packed._make_segment_id, packed._make_uuid, packed._make_one_epoch)]
    flaky = _slots.unpacker(makers[0], makers[1], makers[2], makers[3], packed._STATES, packed._UNKNOWN_SAFETY,
                            packed._unpack)
    segment = _segment(data)
    found = packed.pack(segment, TP)
    outcome = _outcome(flaky, found, TP)
    assert outcome == ("answer", segment) or outcome == ("raised", RuntimeError), outcome
    arguments = [found, TP, None][:data.ConsumeIntInRange(0, 3)]
    if len(arguments) != 2:
        assert _outcome(flaky, *arguments) == ("raised", TypeError)
    wrong = [*makers, packed._STATES, packed._UNKNOWN_SAFETY, packed._unpack]
    wrong[data.ConsumeIntInRange(0, len(wrong) - 1)] = [None, 5, list(packed._STATES)][data.ConsumeIntInRange(0, 2)]
    built = _outcome(_slots.unpacker, *wrong[:data.ConsumeIntInRange(0, 8)])
    assert built[0] == "raised" or callable(built[1])
    if data.ConsumeIntInRange(0, 15) == 0:
        del flaky, makers
        gc.collect(0)
