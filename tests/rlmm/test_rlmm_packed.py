"""The read model holds hosted segments packed (rlmm.packed): unpacked, a segment is equal to what was packed, every
field and the topic-partition it names; packed segments sort in listing order by their bytes; and a partition read
from the view packs its stored segments as it would pack them decoded."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmm import codec, packed, state
from rlmm import view_format as vf
from rlmm.errors import DecodeError
from rlmm.types import (
    INT32_MAX,
    INT64_MAX,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

TP = TopicIdPartition(uuid.UUID(int=7), "packed", 3)


@st.composite
def segments(draw: st.DrawFn) -> RemoteLogSegmentMetadata:
    start = draw(st.integers(0, INT64_MAX - 1_000))
    end = start + draw(st.integers(0, 1_000))
    starts = sorted(draw(st.sets(st.integers(start, end), min_size=1, max_size=4)) | {start})
    epochs = dict(zip(sorted(draw(st.sets(st.integers(0, INT32_MAX), min_size=len(starts), max_size=len(starts)))),
                      starts, strict=True))
    tp = draw(st.sampled_from([TP, TopicIdPartition(TP.topic_id, "renamed-é", TP.partition)]))
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(tp, uuid.UUID(int=draw(st.integers(0, (1 << 128) - 1)))), start, end,
        draw(st.integers(-1, INT64_MAX)), draw(st.integers(0, INT32_MAX)), draw(st.integers(0, INT64_MAX)),
        draw(st.integers(0, INT32_MAX)), epochs, draw(st.none() | st.binary(max_size=40)),
        draw(st.sampled_from(list(RemoteLogSegmentState))), draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(segments())
def test_a_packed_segment_unpacks_equal_naming_its_own_topic(md: RemoteLogSegmentMetadata) -> None:
    found = packed.pack(md, TP)
    for unpack in (packed.unpack, packed._unpack):  # in C where rlmm._slots was built (plain layouts), and in Python
        unpacked = unpack(found, TP)
        assert unpacked == md
        assert unpacked.remote_log_segment_id.topic_id_partition == md.remote_log_segment_id.topic_id_partition
        assert dict(unpacked.segment_leader_epochs) == dict(md.segment_leader_epochs)
    assert packed.size_of(found) == md.segment_size_in_bytes


@settings(max_examples=200, deadline=None)
@given(segments(), segments())
def test_packed_segments_sort_as_listings_go(first: RemoteLogSegmentMetadata, second: RemoteLogSegmentMetadata
                                             ) -> None:
    by_bytes = sorted([first, second], key=lambda md: packed.pack(md, TP))
    assert [state.listing_order(md) for md in by_bytes] == sorted(map(state.listing_order, (first, second)))


@settings(max_examples=300, deadline=None)
@given(segments(), st.sampled_from([TP, TopicIdPartition(TP.topic_id, "?", TP.partition)]))
def test_a_stored_segment_packs_from_its_bytes_as_from_its_metadata(md: RemoteLogSegmentMetadata,
                                                                   tp: TopicIdPartition) -> None:
    """read_partition packs the view's values without building their metadata (codec.decode_packed_segment); for a
    partition whose name is known or not ("?": no bookkeeping)."""
    found = codec.decode_packed_segment(vf.encode_segment(md), tp)
    assert found == (md.remote_log_segment_id.id.int, packed.pack(md, tp))


@pytest.mark.parametrize("field, value", [("start_offset", -1), ("end_offset", -1), ("broker_id", -2),
                                          ("segment_size_in_bytes", -3), ("event_timestamp_ms", -4)])
def test_a_stored_segment_out_of_kafkas_ranges_is_refused_naming_it(field: str, value: int) -> None:
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(TP, uuid.UUID(int=5)), 10, 20, -1, 1, 2, 3, {0: 10})
    name, datum = codec.to_datum(md)
    datum[field] = value
    with pytest.raises(DecodeError, match=field):
        codec.decode_packed_segment(codec.encode_with(codec.registry().current[name], datum), TP)


def test_a_stored_value_that_is_no_segment_is_refused() -> None:
    raw = vf.encode_partition_delete(RemotePartitionDeleteMetadata(
        TP, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1_700_000_000_000, 1))
    with pytest.raises(DecodeError, match="expected a stored segment"):
        codec.decode_packed_segment(raw, TP)
