"""The audit archive's on-storage layout: file names, the resume point they give, and the file format.

No services: these are the rules the archiver and the jobs share.
"""

from __future__ import annotations

import io

import fastavro

from rlmm.archive import (
    META_PARTITION,
    META_TOPIC,
    ArchiveFile,
    archive_key,
    encode_archive_file,
    from_archived,
    next_offset_to_archive,
    parse_archive_key,
    read_archive_file,
    to_archived,
)
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec


def test_an_archive_key_names_partition_and_offset_range_and_parses_back() -> None:
    key = archive_key("__tierlog_metadata", 7, 120, 4_999)
    assert key == "audit/__tierlog_metadata/7/00000000000000000120-00000000000000004999.avro"
    assert parse_archive_key(key, 10) == ArchiveFile(key, "__tierlog_metadata", 7, 120, 4_999, 10)


def test_temporary_and_foreign_keys_under_audit_are_not_archive_files() -> None:
    good = archive_key("t", 0, 0, 9)
    assert parse_archive_key(good.replace(".avro", ".avro.tmp")) is None
    assert parse_archive_key("audit/t/0/.00000000000000000000-00000000000000000009.avro.tierlog-tmp-1") is None
    assert parse_archive_key("audit/t/x/00000000000000000000-00000000000000000009.avro") is None
    assert parse_archive_key("orders-0/0/00000000000000000000-00000000000000000009.avro") is None


def test_archiving_resumes_one_past_the_highest_archived_offset() -> None:
    files = [parse_archive_key(archive_key("t", 0, first, last)) for first, last in ((0, 99), (100, 180))]
    assert next_offset_to_archive(f for f in files if f is not None) == 181


def test_an_empty_archive_has_no_resume_point() -> None:
    assert next_offset_to_archive([]) is None


def test_an_archive_file_holds_its_records_and_names_topic_and_partition() -> None:
    records = list(HistoryGenerator(HistorySpec(events=50, metadata_partitions=1)).records())
    datums = [to_archived("t", 0, r.offset, r.timestamp_ms, r.key, r.value) for r in records]
    data = encode_archive_file("t", 0, datums)
    metadata = fastavro.reader(io.BytesIO(data)).metadata
    assert (metadata[META_TOPIC], metadata[META_PARTITION]) == ("t", "0")
    back = list(read_archive_file(data))
    assert [d["offset"] for d in back] == [r.offset for r in records]
    assert [from_archived(d) for d in back] == [from_archived(d) for d in datums]
