"""rlmm.raw_fetch on the real broker: a new node's workers fetch metadata partitions as raw record batches, and get
exactly what librdkafka's consumer gives (offsets, keys, values, tombstones, whatever codec the producer used, a
fetch cut mid-batch, a start inside a batch). What the consumer would read differently (a transaction's batches, an
offset no longer on the log) or settings it does not honour make the reader unusable, and the worker's group is then
read with the consumer: the same answer."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rlmm_testkit import produce_to

from rlmm import fresh_load, raw_fetch, record_batches
from rlmm import view_format as vf
from rlmm.backlog_window import CompactedWindow, holds_nothing
from rlmm.events import SEGMENT_KEY_PREFIX, RecordKey

Records = list[tuple[int, bytes | None, bytes | None]]


def _consumed(bootstrap: str, topic: str, partition: int, start: int, end: int) -> Records:
    """What the consumer reads of [start, end), as a worker's consumer is set up (read committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tierlog-test-unused",
                         "enable.partition.eof": True, "enable.auto.commit": False, "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(topic, partition, start)])
    got: Records = []
    deadline = time.monotonic() + 30
    try:
        while True:
            assert time.monotonic() < deadline, f"the consumer did not reach the end of {topic}[{partition}] in 30 s"
            for message in consumer.consume(1000, 0.2):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    return [record for record in got if record[0] < end]
                got.append((message.offset(), message.key(), message.value()))  # type: ignore[arg-type]
    finally:
        consumer.close()


def _raw(bootstrap: str, topic: str, starts: dict[int, int], ends: dict[int, int]) -> dict[int, Records]:
    reader = raw_fetch.RawReader(topic, {"bootstrap.servers": bootstrap}, 10)
    try:
        got: dict[int, Records] = {p: [] for p in starts}
        for partition, records in reader.read(starts, ends, 10):
            got[partition] += records
        return got
    finally:
        reader.close()


Headers = list[tuple[str, str | bytes | None]]


def _read_group(bootstrap: str, topic: str, ends: dict[int, int], directory: Path) -> fresh_load.GroupShare:
    """What a worker answers for a group of `topic`'s partitions read from 0 to `ends`."""
    request = fresh_load.GroupRequest(topic, {"bootstrap.servers": bootstrap}, dict.fromkeys(ends, 0), ends, 1000,
                                      str(directory))
    try:
        answer = fresh_load.read_group(request)
    finally:
        fresh_load._close_consumer()
        fresh_load._close_raw_reader()
    assert isinstance(answer, fresh_load.GroupShare), answer
    return answer


def _history(rng: random.Random, count: int) -> list[tuple[bytes | None, bytes | None, Headers]]:
    """Records of every shape a metadata partition may hold: repeated keys, tombstones, a null key, headers."""
    shapes: list[tuple[bytes | None, bytes | None, Headers]] = []
    for number in range(count):
        key = None if number % 97 == 5 else f"segment:{rng.randrange(40)}".encode()
        value = None if number % 7 == 3 else rng.randbytes(rng.randrange(0, 300))
        headers: Headers = [("h", rng.randbytes(3))] if number % 11 == 0 else []
        shapes.append((key, value, headers))
    return shapes


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_raw_batches_give_what_the_consumer_gives_for_every_codec(
    kafka_bootstrap: str, create_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    topic = create_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": codec, "linger.ms": 20,
                         "batch.size": 4000})
    rng = random.Random(codec)
    for number, (key, value, headers) in enumerate(_history(rng, 1500)):
        producer.produce(topic, key=key, value=value, headers=headers, partition=number % 2)
        if number % 300 == 0:
            producer.flush(30)  # batches of many sizes
    assert producer.flush(30) == 0
    # A fetch's byte limit cuts batches in two: each is read whole by the next fetch.
    monkeypatch.setattr(raw_fetch, "_PARTITION_MAX_BYTES", 5000)
    ends = {0: 750, 1: 700}
    for starts in ({0: 0, 1: 0}, {0: 1, 1: 333}):  # from a log's start, and from inside a batch
        expected = {p: _consumed(kafka_bootstrap, topic, p, starts[p], ends[p]) for p in starts}
        assert _raw(kafka_bootstrap, topic, starts, ends) == expected
        assert [offset for offset, _, _ in expected[1]] == list(range(starts[1], ends[1]))


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_read_and_kept_in_one_pass_as_the_consumers_records_are_kept(
    kafka_bootstrap: str, create_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    # A worker reads each partition's bytes and keeps them in one pass (record_batches.read_keep, making no object of
    # a record its `only` passes by): the same window as the consumer's records kept, whether it keeps every record,
    # a few user partitions' or the others'. (Gaps in the offsets, the cleaner's: tests/native/fuzz_record_batches.py.)
    topic = create_topic(partitions=2)
    rng = random.Random(codec)
    users = [(uuid.UUID(int=rng.getrandbits(128)), number) for number in range(6)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": codec, "linger.ms": 20,
                         "batch.size": 4000})
    segments = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(60)]
    for number in range(1200):  # a user partition's records on one metadata partition, as ever
        topic_id, user = users[number % len(users)]
        kind: Any = rng.choice(["segment", "segment", "epochs", "partition-delete"])
        key = RecordKey(kind, topic_id, user, rng.choice(segments) if kind == "segment" else None).encode()
        value = None if number % 9 == 4 else rng.randbytes(rng.randrange(1, 200))
        producer.produce(topic, key=b"x%d" % (number % 2) if number % 101 == 7 else key, value=value,
                         partition=number % 2)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 1, 40)]).values():
        future.result(30)
    monkeypatch.setattr(raw_fetch, "_PARTITION_MAX_BYTES", 5000)
    starts, ends = {0: 0, 1: 40}, {0: 600, 1: 590}
    consumed = {p: _consumed(kafka_bootstrap, topic, p, starts[p], ends[p]) for p in starts}
    hosted = frozenset(vf.tp_key(topic_id, user) for topic_id, user in users[:2])
    only: record_batches.Only | None
    for only in (None, (hosted, {}, fresh_load._user_partition_key, True),
                 (hosted, {}, fresh_load._user_partition_key, False)):
        expected = CompactedWindow(fresh_load._no_own_write, holds_nothing)
        kept = fresh_load._Kept(expected, starts, only and (only[0], {}, only[2], only[3]))
        for partition, records in consumed.items():
            kept.next_offsets[partition], cleaned = record_batches.keep(
                kept.newest, kept.superseded_tombstones, partition, records, kept.next_offsets[partition],
                partition in kept.after_cleaning, SEGMENT_KEY_PREFIX, kept.only)
            if cleaned:
                kept.after_cleaning.add(partition)
        window = CompactedWindow(fresh_load._no_own_write, holds_nothing)
        taken = fresh_load._Kept(window, starts, only)
        reader = raw_fetch.RawReader(topic, {"bootstrap.servers": kafka_bootstrap}, 10)
        try:
            read = sum(count for _, count in reader.take(starts, ends, 10, taken.take))
        finally:
            reader.close()
        assert read == sum(ends[p] - starts[p] for p in starts)
        assert taken.next_offsets == kept.next_offsets == ends and not taken.after_cleaning
        replayed = window.replay_entries()
        assert replayed == expected.replay_entries()
        assert 0 < len(replayed) < 200 if only is not None and only[3] else len(replayed) > 200


def test_a_transactions_batches_make_the_reader_unusable_and_the_group_goes_to_the_consumer(
    kafka_bootstrap: str, create_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = create_topic(partitions=1)
    produce_to(kafka_bootstrap, topic, 0, [(b"segment:a", b"1"), (b"segment:b", b"2")])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"segment:a", value=b"aborted", partition=0)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"segment:c", value=b"3", partition=0)
    producer.commit_transaction(30)
    consumed = _consumed(kafka_bootstrap, topic, 0, 0, 1 << 62)
    assert [value for _, _, value in consumed] == [b"1", b"2", b"3"]  # the aborted record is skipped
    ends = {0: consumed[-1][0] + 1}

    with pytest.raises(raw_fetch.RawFetchUnusable, match="transaction"):
        _raw(kafka_bootstrap, topic, {0: 0}, ends)
    # A worker's group: the consumer reads it, and keeps what it gives.
    assert _read_group(kafka_bootstrap, topic, ends, tmp_path).read == 3


def test_an_offset_no_longer_on_the_log_makes_the_reader_unusable(
    kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=1)
    produce_to(kafka_bootstrap, topic, 0, [(b"k%d" % n, b"v") for n in range(10)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        future.result(30)

    with pytest.raises(raw_fetch.RawFetchUnusable, match="offset 2 of metadata partition 0 is no longer on the log"):
        _raw(kafka_bootstrap, topic, {0: 2}, {0: 10})
    assert _raw(kafka_bootstrap, topic, {0: 6}, {0: 10}) == {0: [(n, b"k%d" % n, b"v") for n in range(6, 10)]}


@pytest.mark.parametrize(("settings", "why"), [
    ({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL"}, "sasl.mechanism GSSAPI"),
    ({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"},
     "sasl.mechanism OAUTHBEARER"),
    ({"bootstrap.servers": "127.0.0.1:9", "sasl.kerberos.service.name": "kafka"},
     "settings it does not carry over: sasl.kerberos.service.name"),
    ({"bootstrap.servers": "127.0.0.1:9", "ssl.ca.pem": "-----BEGIN"}, "settings it does not carry over: ssl.ca.pem"),
    ({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "x"},
     "ssl.endpoint.identification.algorithm x"),
    ({}, "no bootstrap.servers"),
])
def test_settings_it_cannot_carry_over_leave_every_group_to_the_consumer(settings: dict[str, str], why: str) -> None:
    assert why in (raw_fetch.unusable_for(settings) or "")
    with pytest.raises(raw_fetch.RawFetchUnusable, match=why):
        raw_fetch.RawReader("topic", settings, 1)


def test_tls_files_that_do_not_load_make_the_reader_unusable(tmp_path: Path) -> None:
    settings = {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL",
                "ssl.ca.location": str(tmp_path / "missing.pem")}
    assert raw_fetch.unusable_for(settings) is None  # the files are read when the reader starts
    with pytest.raises(raw_fetch.RawFetchUnusable, match="TLS settings do not load"):
        raw_fetch.RawReader("topic", settings, 1)


def test_a_broker_that_does_not_answer_makes_the_reader_unusable_within_its_deadline() -> None:
    with pytest.raises(raw_fetch.RawFetchUnusable, match="did not start"):
        raw_fetch.RawReader("topic", {"bootstrap.servers": "127.0.0.1:9"}, 2)


@pytest.mark.parametrize("fault", ["start", "read"])
def test_a_fault_of_the_raw_reader_itself_leaves_the_group_to_the_consumer(
    kafka_bootstrap: str, create_topic: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    # A bug in the raw path, or its client missing from an install, must cost speed only: the worker's consumer reads
    # the group. (Stood in for here: no real input makes the reader fail this way.)
    topic = create_topic(partitions=1)
    produce_to(kafka_bootstrap, topic, 0, [(b"segment:%d" % n, b"v") for n in range(5)])

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'kafka.client_async'")

    monkeypatch.setattr(raw_fetch.RawReader, "__init__" if fault == "start" else "take", broken)
    answer = _read_group(kafka_bootstrap, topic, {0: 5}, tmp_path)
    assert answer.read == 5
    assert answer.how.startswith("with the consumer: the raw reader") and "kafka.client_async" in answer.how
