"""The object-key layout: Kafka's names in the documented order, safe for every legal topic name."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlmm.errors import InvalidArgumentError
from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rsm.keys import normalize_prefix, parse_object_key, partition_prefix, segment_keys

TOPIC_ID = uuid.UUID("0b7c2b6e-1d4c-4b39-9b0e-6c1f4a4f2d11")
SEGMENT = uuid.UUID("6f1d0c86-9b2a-4d7e-8f5a-2a3b4c5d6e7f")


def _segment(topic: str, partition: int = 3) -> RemoteLogSegmentId:
    return RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, topic, partition), SEGMENT)


def test_keys_follow_the_documented_layout() -> None:
    keys = segment_keys(_segment("orders"), 1234, hashed=False)
    stem = f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT}"
    assert (keys.log, keys.indexes) == (stem + ".log", stem + ".indexes")


def test_start_offset_is_zero_padded_to_20_digits_so_keys_sort_by_offset() -> None:
    keys = [segment_keys(_segment("t"), offset, False).log for offset in (9, 10, 2**63 - 1)]
    assert keys == sorted(keys)
    assert keys[-1].split("/")[2].startswith("09223372036854775807-")


def test_hash_prefix_is_one_leading_component_per_partition() -> None:
    hashed = segment_keys(_segment("orders"), 0, hashed=True).log
    plain = segment_keys(_segment("orders"), 0, hashed=False).log
    head, _, rest = hashed.partition("/")
    assert rest == plain
    assert len(head) == 4 and all(c in "0123456789abcdef" for c in head)
    assert partition_prefix(_segment("orders").topic_id_partition, True) == f"{head}/orders-{TOPIC_ID}/3/"


@given(st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True))
def test_no_legal_topic_name_produces_a_dot_or_empty_path_component(topic: str) -> None:
    parts = segment_keys(_segment(topic), 0, hashed=True).log.split("/")
    assert len(parts) == 4
    assert all(part not in ("", ".", "..") for part in parts)


@pytest.mark.parametrize("topic", ["../evil", "a/b", "a\\b", "x" * 250, "tab\t"])
def test_an_illegal_topic_name_is_refused(topic: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a legal Kafka topic name"):
        segment_keys(_segment(topic), 0, hashed=False)


def test_prefix_is_normalized_without_surrounding_slashes() -> None:
    assert normalize_prefix("/tier/cluster-a/", "s3.prefix") == "tier/cluster-a"
    assert normalize_prefix("", "s3.prefix") == ""


@pytest.mark.parametrize("prefix", ["a/../b", "a//b", "./a"])
def test_a_prefix_with_dot_or_empty_parts_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.prefix"):
        normalize_prefix(prefix, "s3.prefix")


@given(
    topic=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
    partition=st.integers(0, 2**31 - 1),
    start=st.integers(0, 2**63 - 1),
    hashed=st.booleans(),
)
def test_parsing_a_key_gives_back_what_built_it(topic: str, partition: int, start: int, hashed: bool) -> None:
    segment = _segment(topic, partition)
    keys = segment_keys(segment, start, hashed)
    for key, suffix in ((keys.log, ".log"), (keys.indexes, ".indexes")):
        parsed = parse_object_key(key)
        assert parsed is not None
        assert (parsed.topic_id_partition, parsed.start_offset, parsed.segment_id, parsed.suffix) == (
            segment.topic_id_partition, start, segment.id, suffix)


@pytest.mark.parametrize("key", [
    "audit/__tierlog_metadata/0/00000000000000000000-00000000000000000009.avro",
    f"orders-{TOPIC_ID}/3/1234-{SEGMENT}.log",
    f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT}.tmp",
    "",
])
def test_keys_of_other_objects_are_not_segment_objects(key: str) -> None:
    assert parse_object_key(key) is None
