"""Snapshot format 2: the materialized view written entry by entry, loaded as it is and checked against the digest
it states; format 1 (archive records, replayed) still loads."""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import random
import threading
from pathlib import Path
from typing import Any

import fastavro
import pytest
from rlmm_testkit import LogWriter, make_tp, workload

import rlmm.snapshot
import rlmm.view
from rlmm import archive, codec, state
from rlmm import view_format as vf
from rlmm.archive import (
    RECORDS_FORMAT,
    TABLES_FORMAT,
    VIEW_FORMAT,
    SnapshotHeader,
    read_snapshot,
    stream_snapshot,
    to_archived,
    view_chunk_schema,
    view_entries,
    write_chunked_view_snapshot,
    write_snapshot,
)
from rlmm.bootstrap import TopicPosition, bootstrap_from_snapshot, snapshot_key, why_not_trusted
from rlmm.errors import SnapshotError, ViewFormatError
from rlmm.lineage import pending_checkpoint
from rlmm.snapshot import apply_archived, load_into, load_snapshot, snapshot_entries, write_view_snapshot
from rlmm.view import MetadataView
from rsm.snapshot_source import BucketSnapshotSource
from tierlog.pipeline.locations import open_store

TOPIC = "meta"


def _archived_log(seed: int, partitions: int = 4) -> list[dict[str, Any]]:
    """A metadata log as the manager writes it (segments, checkpoints, tombstones), as archive datums."""
    rng = random.Random(seed)
    writer = LogWriter()
    for number in range(partitions):
        writer.write(workload(rng, make_tp(f"snap-{seed}", number), uploads=15, delete_partition=number == 0))
    return [to_archived(TOPIC, 0, offset, 0, key.encode(), None if event is None else codec.encode(event))
            for offset, (key, event) in enumerate(writer.log)]


def _replayed(path: Path, datums: list[dict[str, Any]]) -> MetadataView:
    """A view that applied the whole log in order, as a node that rebuilt from the topic."""
    view = MetadataView(path)
    apply_archived(view, TOPIC, datums)
    return view


def _view_snapshot(view: MetadataView) -> bytes:
    out = io.BytesIO()
    write_view_snapshot(out, TOPIC, snapshot_entries(view), view.applied_offsets(TOPIC), view.digest())
    return out.getvalue()


def _load(path: Path, data: bytes) -> MetadataView:
    view = MetadataView(path)
    header, datums = read_snapshot(io.BytesIO(data))
    try:
        load_into(view, header, datums)
    except Exception:
        view.close()
        raise
    return view


def test_a_format_2_snapshot_round_trips_its_header_and_entries_across_chunks() -> None:
    entries = [(vf.EPOCH_INDEX, i.to_bytes(8, "big"), b"x" * (i % 7)) for i in range(45_000)]
    entries += [(vf.PARTITION_META, b"k", b"v"), (vf.SEGMENTS, b"a", b""), (vf.SEGMENTS, b"b", b"2")]
    out = io.BytesIO()
    write_chunked_view_snapshot(out, TOPIC, entries, {0: 7, 3: 9}, "d" * 64)

    header, datums = read_snapshot(io.BytesIO(out.getvalue()))

    assert (header.metadata_topic, dict(header.end_offsets), header.format) == (TOPIC, {0: 7, 3: 9}, VIEW_FORMAT)
    assert (header.view_format, header.view_digest) == (vf.FORMAT_VERSION, "d" * 64)
    assert list(view_entries(datums)) == entries


def test_chunks_read_in_c_are_those_fastavro_reads_and_other_blocks_are_left_to_fastavro(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = [(vf.SEGMENTS, i.to_bytes(8, "big"), bytes(range(i % 200))) for i in range(30_000)]
    entries += [(vf.PARTITION_META, b"k\xff", b"")]
    out = io.BytesIO()
    write_chunked_view_snapshot(out, TOPIC, entries, {0: 7}, "d" * 64)
    read_in_c: list[int] = []
    read_plain = archive.read_plain

    def counted(program: Any, data: bytes) -> Any:
        read_in_c.append(len(data))
        return read_plain(program, data)

    monkeypatch.setattr(archive, "read_plain", counted)
    chunks = list(read_snapshot(io.BytesIO(out.getvalue()))[1])
    assert chunks == list(fastavro.reader(io.BytesIO(out.getvalue())))
    assert len(read_in_c) == len(chunks) > 1  # every chunk, one block each, in C
    # Blocks of several chunks (another writer's choice), and a block the C reader refuses: fastavro reads them.
    several = io.BytesIO()
    fastavro.writer(several, fastavro.parse_schema(view_chunk_schema()), chunks, codec="deflate", sync_interval=1 << 30,
                    metadata={k: v for k, v in fastavro.reader(io.BytesIO(out.getvalue())).metadata.items()
                              if not k.startswith("avro.")})
    read_in_c.clear()
    assert list(read_snapshot(io.BytesIO(several.getvalue()))[1]) == chunks and read_in_c == []

    def refusing(program: Any, data: bytes) -> Any:
        raise ValueError("not read exactly")

    monkeypatch.setattr(archive, "read_plain", refusing)
    assert list(view_entries(read_snapshot(io.BytesIO(out.getvalue()))[1])) == entries


def test_format_2_snapshots_are_written_with_zstd_and_those_of_earlier_releases_in_deflate_still_load(
    tmp_path: Path
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(2))
    out = io.BytesIO()
    write_chunked_view_snapshot(out, TOPIC, snapshot_entries(replayed), replayed.applied_offsets(TOPIC),
                                replayed.digest())
    written = out.getvalue()
    assert fastavro.reader(io.BytesIO(written)).codec == "zstandard"
    header, chunks = read_snapshot(io.BytesIO(written))
    earlier = io.BytesIO()  # the same file as releases before zstd wrote it
    stated = fastavro.reader(io.BytesIO(written)).metadata
    header_fields = {k: v for k, v in stated.items() if not k.startswith("avro.")}
    fastavro.writer(earlier, fastavro.parse_schema(view_chunk_schema()), list(chunks), codec="deflate",
                    metadata=header_fields)
    assert fastavro.reader(io.BytesIO(earlier.getvalue())).codec == "deflate"
    loaded = _load(tmp_path / "loaded", earlier.getvalue())
    try:
        assert header.view_digest == loaded.digest() == replayed.digest()
        assert list(snapshot_entries(loaded)) == list(snapshot_entries(replayed))
    finally:
        loaded.close()
        replayed.close()


def test_a_snapshot_without_a_format_is_format_1() -> None:
    out = io.BytesIO()
    write_snapshot(out, TOPIC, [], {0: 3})
    header, _ = read_snapshot(io.BytesIO(out.getvalue()))
    assert (header.format, header.view_format, header.view_digest) == (RECORDS_FORMAT, None, None)


def test_a_loaded_view_snapshot_equals_the_view_it_was_taken_of_bookkeeping_included(tmp_path: Path) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(1))
    loaded = _load(tmp_path / "loaded", _view_snapshot(replayed))
    try:
        assert list(snapshot_entries(loaded)) == list(snapshot_entries(replayed))
        assert loaded.applied_offsets(TOPIC) == replayed.applied_offsets(TOPIC)
        # The partition bookkeeping decides the checkpoint a node's next write appends: the same on both.
        tps = replayed.user_partitions()
        assert tps and loaded.user_partitions() == tps
        assert [pending_checkpoint(loaded, tp, 5, 0) for tp in tps] == \
            [pending_checkpoint(replayed, tp, 5, 0) for tp in tps]
        assert [loaded.lineage_position(tp) for tp in tps] == [replayed.lineage_position(tp) for tp in tps]
    finally:
        loaded.close()
        replayed.close()


def test_entries_that_do_not_make_the_stated_digest_are_refused_by_the_writer_and_in_format_2_by_the_reader(
    tmp_path: Path
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(2))
    entries = list(snapshot_entries(replayed))
    family, key, value = entries[0]
    entries[0] = (family, key, value + b"\x00")
    out = io.BytesIO()
    with pytest.raises(SnapshotError, match=r"digest .* not the stated"):
        write_view_snapshot(out, TOPIC, entries, replayed.applied_offsets(TOPIC), replayed.digest())
    assert out.getvalue() == b""
    write_chunked_view_snapshot(out, TOPIC, entries, replayed.applied_offsets(TOPIC), replayed.digest())
    replayed.close()

    with pytest.raises(SnapshotError, match="digest"):
        _load(tmp_path / "loaded", out.getvalue())


def test_a_view_snapshot_of_another_view_format_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(3))
    monkeypatch.setattr(vf, "FORMAT_VERSION", vf.FORMAT_VERSION + 1)  # written by a tierlog with a newer view
    data = _view_snapshot(replayed)
    replayed.close()
    monkeypatch.undo()

    with pytest.raises(SnapshotError, match="view format"):
        _load(tmp_path / "loaded", data)


def test_a_format_1_snapshot_still_loads_by_replaying_its_records(tmp_path: Path) -> None:
    datums = _archived_log(4)
    replayed = _replayed(tmp_path / "replayed", datums)
    expected = replayed.digest()
    replayed.close()
    snapshot = tmp_path / "v1.avro"
    with snapshot.open("wb") as out:
        write_snapshot(out, TOPIC, datums, {0: len(datums)})

    assert load_snapshot(snapshot, tmp_path / "node") == (TOPIC, {0: len(datums)})
    view = MetadataView.open(tmp_path / "node")
    try:
        assert view.digest() == expected
    finally:
        view.close()


def test_load_snapshot_materializes_a_view_snapshot_file(tmp_path: Path) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(5))
    expected, ends = replayed.digest(), replayed.applied_offsets(TOPIC)
    snapshot = tmp_path / "v2.avro"
    snapshot.write_bytes(_view_snapshot(replayed))
    replayed.close()

    assert load_snapshot(snapshot, tmp_path / "node") == (TOPIC, ends)
    view = MetadataView.open(tmp_path / "node")
    try:
        assert (view.digest(), view.applied_offsets(TOPIC)) == (expected, ends)
    finally:
        view.close()


def test_a_snapshots_tables_are_smaller_than_the_views_own_and_load_into_an_equal_view(
    tmp_path: Path
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(6, partitions=8))
    expected, ends = replayed.digest(), replayed.applied_offsets(TOPIC)
    entries = list(snapshot_entries(replayed))
    data = _view_snapshot(replayed)
    replayed.close()
    header, parts = read_snapshot(io.BytesIO(data))
    assert header.format == TABLES_FORMAT
    snapshot_bytes: dict[str, int] = {}
    for part in parts:
        snapshot_bytes[part["family"]] = snapshot_bytes.get(part["family"], 0) + len(part["part"])
    (tmp_path / "own").mkdir()
    own = rlmm.view.write_tables(archive.entry_runs(entries), tmp_path / "own", tmp_path / "own")
    # zstd, where the view's own tables are snappy: the segments' table is the bulk of a snapshot.
    assert snapshot_bytes[vf.SEGMENTS] < 0.9 * own[vf.SEGMENTS].stat().st_size
    assert snapshot_bytes.keys() == own.keys()

    snapshot = tmp_path / "v3.avro"
    snapshot.write_bytes(data)
    assert load_snapshot(snapshot, tmp_path / "node") == (TOPIC, ends)
    view = MetadataView.open(tmp_path / "node")
    try:
        assert (view.digest(), list(snapshot_entries(view))) == (expected, entries)
    finally:
        view.close()


def test_entries_load_only_into_an_empty_view(tmp_path: Path) -> None:
    view = _replayed(tmp_path / "replayed", _archived_log(6))
    try:
        with pytest.raises(ViewFormatError, match="not empty"):
            view.load_entries(TOPIC, [], {0: 1})
    finally:
        view.close()


def test_the_view_digest_rule_is_unchanged_by_chunked_hashing() -> None:
    # Snapshots state the digest of the view they hold: the rule must give every tierlog the same digest (this one
    # was computed by hashing entry by entry), whether entries arrive one by one or in runs of a family.
    entries = [(vf.EPOCH_INDEX, b"\x00\x01", b"\xff" * 16), (vf.EPOCH_INDEX, b"\x00\x02", b""),
               (vf.SEGMENTS, b"a", b"segment-a"), (vf.EPOCH_STATE, b"x" * 24, b"lin")]
    expected = "9f109778ea08b075db933db3f74003e91a13a5814a9a41783c893ff1155c2616"
    assert state.view_digest_of(entries) == expected
    digest = state.ViewDigest()
    digest.add(vf.EPOCH_INDEX, [b"\x00\x01"], [b"\xff" * 16])
    digest.add(vf.EPOCH_INDEX, [b"\x00\x02"], [b""])
    digest.add(vf.EPOCH_STATE, [b"x" * 24], [b"lin"])
    digest.add(vf.SEGMENTS, [b"a"], [b"segment-a"])
    assert digest.hexdigest() == expected


@pytest.mark.parametrize("native", [True, False], ids=["C", "Python"])
def test_the_digest_frames_entries_alike_in_c_and_in_python(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(state, "_digest", None)
    rng = random.Random(7)
    keys = sorted({rng.randbytes(rng.randrange(1, 40)) for _ in range(3000)})
    values = [rng.randbytes(rng.choice((0, 1, 16, 300))) for _ in keys]
    entry_by_entry = hashlib.sha256()
    for key, value in zip(keys, values, strict=True):
        for part in (vf.SEGMENTS.encode(), key, value):
            entry_by_entry.update(len(part).to_bytes(4, "big") + part)
    digest = state.ViewDigest()
    digest.add(vf.SEGMENTS, keys[:1000], values[:1000])
    digest.add(vf.SEGMENTS, tuple(keys[1000:]), tuple(values[1000:]))  # not lists: framed in Python either way
    assert digest.hexdigest() == entry_by_entry.hexdigest()


def test_the_c_framing_refuses_what_it_cannot_frame() -> None:
    from rlmm import _digest

    with pytest.raises(TypeError, match="as many keys as values"):
        _digest.frame(b"f", [b"a"], [])
    with pytest.raises(TypeError, match="entry 1: keys and values must be bytes"):
        _digest.frame(b"f", [b"a", "b"], [b"1", b"2"])  # type: ignore[list-item]
    assert _digest.frame(b"f", [], []) == b""
    assert _digest.frame(b"", [b""], [b"v"]) == bytes(4) + bytes(4) + b"\x00\x00\x00\x01v"


def test_entries_whose_digest_is_not_the_stated_one_leave_the_view_empty(tmp_path: Path) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(7))
    runs = [(family, [key], [value]) for family, key, value in snapshot_entries(replayed)]
    ends = replayed.applied_offsets(TOPIC)
    replayed.close()
    view = MetadataView(tmp_path / "loaded")
    try:
        with pytest.raises(SnapshotError, match="digest"):
            view.load_entries(TOPIC, runs, ends, "0" * 64)
        assert not view.holds_entries()
    finally:
        view.close()


@pytest.mark.parametrize("disorder", ["keys descending", "key repeated", "family split", "content families swapped"])
def test_entries_out_of_the_views_order_are_refused_and_leave_the_view_empty(tmp_path: Path, disorder: str) -> None:
    # The digest is checked over the entries as they arrive, so they must arrive in the order the view keeps them.
    runs = {
        "keys descending": [(vf.SEGMENTS, [b"b", b"a"], [b"", b""])],
        "key repeated": [(vf.SEGMENTS, [b"a"], [b"1"]), (vf.SEGMENTS, [b"a"], [b"2"])],
        "family split": [(vf.EPOCH_INDEX, [b"a"], [b""]), (vf.SEGMENTS, [b"a"], [b""]),
                         (vf.EPOCH_INDEX, [b"b"], [b""])],
        "content families swapped": [(vf.SEGMENTS, [b"a"], [b""]), (vf.EPOCH_INDEX, [b"a"], [b""])],
    }[disorder]
    view = MetadataView(tmp_path / "loaded")
    try:
        with pytest.raises(ViewFormatError, match="order"):
            view.load_entries(TOPIC, runs, {0: 1})
        assert not view.holds_entries()
    finally:
        view.close()


@pytest.mark.parametrize("fmt", [RECORDS_FORMAT, VIEW_FORMAT, TABLES_FORMAT])
def test_the_header_names_the_topic_id_and_creation_time_and_older_files_name_neither(fmt: int) -> None:
    def header_of(**source: Any) -> SnapshotHeader:
        out = io.BytesIO()
        if fmt == RECORDS_FORMAT:
            write_snapshot(out, TOPIC, [], {0: 3}, **source)
        elif fmt == VIEW_FORMAT:
            write_chunked_view_snapshot(out, TOPIC, [], {0: 3}, "d" * 64, **source)
        else:
            write_view_snapshot(out, TOPIC, [], {0: 3}, state.ViewDigest().hexdigest(), **source)
        out.seek(0)
        return read_snapshot(out)[0]

    labelled = header_of(topic_id="Zm9vYmFyYmF6cXV1eA", created_ms=1_700_000_000_000)
    assert (labelled.format, labelled.topic_id, labelled.created_ms) == (fmt, "Zm9vYmFyYmF6cXV1eA", 1_700_000_000_000)
    older = header_of()
    assert (older.format, older.topic_id, older.created_ms) == (fmt, None, None)
    with pytest.raises(ValueError, match="both"):
        header_of(topic_id="Zm9vYmFyYmF6cXV1eA")


def test_load_snapshot_records_the_headers_source_last_so_a_manager_resumes_from_it(tmp_path: Path) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(6))
    ends = replayed.applied_offsets(TOPIC)
    out = io.BytesIO()
    write_view_snapshot(out, TOPIC, snapshot_entries(replayed), ends, replayed.digest(), "dG9waWMtaWQtMDAwMDAwMA",
                        1_700_000_000_000)
    replayed.close()
    (tmp_path / "labelled.avro").write_bytes(out.getvalue())
    (tmp_path / "older.avro").write_bytes(_view_snapshot(_replayed(tmp_path / "again", _archived_log(6))))

    load_snapshot(tmp_path / "labelled.avro", tmp_path / "node")
    load_snapshot(tmp_path / "older.avro", tmp_path / "node-older")
    sources = []
    for node in ("node", "node-older"):
        view = MetadataView.open(tmp_path / node)
        sources.append(view.source(TOPIC))
        view.close()
    assert sources == [("dG9waWMtaWQtMDAwMDAwMA", 1_700_000_000_000), None]


HEADER = SnapshotHeader(TOPIC, {0: 10, 1: 4}, topic_id="id-a", created_ms=1_000_000)


@pytest.mark.parametrize("header, position, now_ms, expected", [
    (HEADER, TopicPosition("id-a", 500_000, {0: 10, 1: 0}), 1_400_000, None),
    (HEADER, TopicPosition("id-b", 500_000, {0: 0, 1: 0}), 1_000_000, "it is foreign: it was taken of topic id id-a"),
    (SnapshotHeader("other", {0: 1}), TopicPosition("id-a", 500_000, {}), 0, "it is foreign: it holds topic other"),
    (HEADER, TopicPosition("id-a", 500_000, {0: 0, 1: 0}), 1_500_001, "it is stale: taken 500001 ms ago"),
    (HEADER, TopicPosition("id-a", 500_000, {0: 11, 1: 5}), 1_000_000,
     "it is stale: the topic no longer holds the records after its end offsets (partition: snapshot end < log "
     "start) 0: 10 < 11, 1: 4 < 5"),
    # A file written before the header named its topic id: only where it is filed says which topic it is of.
    (SnapshotHeader(TOPIC, {0: 1}), TopicPosition("id-b", 500_000, {0: 0}), 10**13, None),
])
def test_a_snapshot_is_trusted_only_when_of_this_topic_id_younger_than_the_tombstones_and_at_or_past_the_log_start(
    header: SnapshotHeader, position: TopicPosition, now_ms: int, expected: str | None,
) -> None:
    refusal = why_not_trusted(header, TOPIC, position, now_ms)
    assert (None if refusal is None else str(refusal)[:len(expected or "")]) == expected
    if refusal is not None:
        assert refusal.stale == ("stale" in expected)  # type: ignore[operator]


def test_a_view_snapshot_is_written_as_the_views_tables_in_parts_and_loads_without_hashing_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(8))
    monkeypatch.setattr(archive, "_TABLE_PART_BYTES", 1024)  # several parts per table
    data = _view_snapshot(replayed)
    header, datums = read_snapshot(io.BytesIO(data))
    parts = [(datum["family"], len(datum["part"])) for datum in datums]
    assert header.format == TABLES_FORMAT and header.view_digest == replayed.digest()
    families = [family for family, _ in parts]
    assert sorted(set(families)) == sorted({family for family, _, _ in snapshot_entries(replayed)})
    assert len(parts) > len(set(families))  # a table in several parts, each family's in one stretch
    assert families == sorted(families, key=families.index)
    monkeypatch.setattr(state.ViewDigest, "add", lambda *args: pytest.fail("a table snapshot's entries were hashed"))
    loaded = _load(tmp_path / "loaded", data)
    try:
        monkeypatch.undo()
        assert loaded.digest() == replayed.digest()
        assert list(snapshot_entries(loaded)) == list(snapshot_entries(replayed))
    finally:
        loaded.close()
        replayed.close()


@pytest.mark.parametrize("damage", ["table bytes", "unknown family", "applied offsets family", "family split"])
def test_tables_that_do_not_load_are_refused_naming_what_is_wrong_and_leave_no_offsets(
    tmp_path: Path, damage: str
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(9))
    header, datums = read_snapshot(io.BytesIO(_view_snapshot(replayed)))
    replayed.close()
    parts = [(datum["family"], datum["part"]) for datum in datums]
    family, part = parts[0]
    if damage == "table bytes":
        parts[0] = (family, part[:100] + bytes(len(part) - 100))
    elif damage == "unknown family":
        parts[0] = ("no-such-family", part)
    elif damage == "applied offsets family":
        parts[0] = (vf.APPLIED, part)
    else:
        parts.append((family, part))
    expected = {"table bytes": (SnapshotError, "do not load"), "unknown family": (ViewFormatError, "no-such-family"),
                "applied offsets family": (ViewFormatError, vf.APPLIED),
                "family split": (ViewFormatError, "two stretches")}[damage]
    view = MetadataView(tmp_path / "loaded")
    try:
        with pytest.raises(expected[0], match=expected[1]):
            view.load_tables(TOPIC, parts, header.end_offsets)
        assert view.applied_offsets(TOPIC) == {}
    finally:
        view.close()


def test_tables_are_synced_while_written_and_a_failed_sync_refuses_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed = _replayed(tmp_path / "replayed", _archived_log(11))
    header, datums = read_snapshot(io.BytesIO(_view_snapshot(replayed)))
    replayed.close()
    parts = [(datum["family"], bytes(datum["part"])) for datum in datums]
    monkeypatch.setattr(rlmm.view, "_SYNC_BYTES", 100)  # a sync in the thread after every part or two
    synced: list[int] = []
    real_sync = os.fdatasync

    def failing_once(fd: int) -> None:
        # A failed write-back (EIO) is reported once, to the first sync after it: this one, in the thread. The real
        # disk cannot fail on demand, so the sync is stood in for here.
        synced.append(fd)
        real_sync(fd)
        if len(synced) == 2:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(rlmm.view.os, "fdatasync", failing_once)
    view = MetadataView(tmp_path / "loaded")
    try:
        with pytest.raises(OSError, match="Input/output error"):
            view.load_tables(TOPIC, parts, header.end_offsets)
        assert view.applied_offsets(TOPIC) == {} and not view.holds_entries()
        assert not (tmp_path / "loaded.tables").exists()
        threads: list[str] = []

        def counted(fd: int) -> None:
            threads.append(threading.current_thread().name)
            real_sync(fd)

        monkeypatch.setattr(rlmm.view.os, "fdatasync", counted)
        view.load_tables(TOPIC, parts, header.end_offsets)
        assert view.applied_offsets(TOPIC) == header.end_offsets
    finally:
        view.close()
    # Each table synced as it closed, and some while they were written.
    assert threads.count(threading.current_thread().name) == len({family for family, _ in parts})
    assert "tierlog-view-table-sync" in threads


def test_writing_a_snapshot_of_a_view_reads_no_partition_into_memory(tmp_path: Path) -> None:
    # A snapshot writer (the agent's, every snapshot.interval.ms) reads the view's families as stored: decoding every
    # partition's segments through the read model cost 25 s and the cluster's whole state in memory at 1M segments.
    _replayed(tmp_path / "view", _archived_log(10)).close()
    view = MetadataView(tmp_path / "view")
    try:
        assert view.user_partitions() and not view.model.partitions
        data = _view_snapshot(view)
        assert not view.model.partitions
    finally:
        view.close()
    loaded = _load(tmp_path / "loaded", data)
    try:
        assert [loaded.lineage_position(tp) for tp in loaded.user_partitions()] == \
            [lineage_position for lineage_position in _positions(tmp_path / "view")]
    finally:
        loaded.close()


def _positions(path: Path) -> list[int | None]:
    view = MetadataView(path)
    try:
        return [view.lineage_position(tp) for tp in view.user_partitions()]
    finally:
        view.close()


@pytest.mark.parametrize("where", ["header", "first part", "middle", "last byte"])
def test_a_snapshot_damaged_anywhere_is_refused_as_corrupt_while_streamed_and_leaves_the_view_empty(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # A new node reads a snapshot as it downloads it (rlmm.bootstrap): its tables are written beside the view and
    # enter it only after the whole object matched the sha256 its name carries.
    replayed = _replayed(tmp_path / "replayed", _archived_log(11))
    ends = replayed.applied_offsets(TOPIC)
    out = io.BytesIO()
    write_view_snapshot(out, TOPIC, snapshot_entries(replayed), ends, replayed.digest(), "aWQ", 1_000)
    replayed.close()
    data = bytearray(out.getvalue())
    store = open_store(str(tmp_path / "bucket"))
    key = snapshot_key("snapshots", TOPIC, "aWQ", 1_000, bytes(data))
    data[{"header": 40, "first part": 700, "middle": len(data) // 2, "last byte": len(data) - 1}[where]] ^= 0x55
    store.put(key, bytes(data))
    view = MetadataView(tmp_path / "node")
    try:
        with caplog.at_level(logging.WARNING, logger="rlmm.bootstrap"):
            loaded = bootstrap_from_snapshot(view, BucketSnapshotSource(store), "snapshots", TOPIC,
                                             TopicPosition("aWQ", 86_400_000, {}), 2_000)
        assert loaded is None and not view.holds_entries()
        assert any("corrupt" in r.getMessage() and key in r.getMessage() for r in caplog.records)
        assert not (tmp_path / "node.tables").exists()
    finally:
        view.close()
    # Undamaged, the same object loads as it streams in.
    store.put(key, out.getvalue())
    view = MetadataView(tmp_path / "node-2")
    try:
        assert bootstrap_from_snapshot(view, BucketSnapshotSource(store), "snapshots", TOPIC,
                                       TopicPosition("aWQ", 86_400_000, {}), 2_000) is not None
        assert view.applied_offsets(TOPIC) == ends
    finally:
        view.close()


def _garbled(data: bytes, rng: random.Random) -> bytes:
    """`data` with one to three of its bytes replaced by random ones."""
    garbled = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        garbled[rng.randrange(len(garbled))] = rng.randrange(256)
    return bytes(garbled)


def _snapshots_of_every_format(tmp_path: Path) -> dict[str, bytes]:
    datums = _archived_log(12, partitions=2)
    records = io.BytesIO()
    write_snapshot(records, TOPIC, datums, {0: len(datums)})
    replayed = _replayed(tmp_path / "replayed", datums)
    try:
        chunks = io.BytesIO()
        write_chunked_view_snapshot(chunks, TOPIC, snapshot_entries(replayed), replayed.applied_offsets(TOPIC),
                                    replayed.digest())
        tables = _view_snapshot(replayed)
    finally:
        replayed.close()
    return {"format 1": records.getvalue(), "format 2": chunks.getvalue(), "format 3": tables}


def test_garbled_bytes_in_a_snapshot_of_any_format_are_a_snapshot_error_or_read(tmp_path: Path) -> None:
    # Whatever fastavro or the chunk reader meets in them (a codec, a compressed block, a union branch, a length, an
    # id or a text that does not decode) names the snapshot as corrupt; nothing else escapes. Bytes that still decode
    # (inside a table part, a digest) are left to the object's sha256 and the view digest.
    rng = random.Random(13)
    refused = 0
    for kind, data in _snapshots_of_every_format(tmp_path).items():
        for _ in range(150):
            garbled = _garbled(data, rng)
            for read in ("file", "download"):
                try:
                    if read == "file":
                        _header, datums = read_snapshot(io.BytesIO(garbled), "snap")
                    else:
                        chunks = iter([garbled[at:at + 97] for at in range(0, len(garbled), 97)])
                        _header, datums = stream_snapshot(lambda: next(chunks, b""), "snap")  # noqa: B023
                    for _datum in datums:
                        pass
                except SnapshotError as exc:
                    assert "snap " in str(exc), (kind, str(exc))
                    refused += 1
    assert refused > 300  # most garbled files do not read


def test_a_snapshot_that_fails_to_load_leaves_the_state_dir_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rlmm.snapshot, "_BATCH", 10)  # batches were committed before the bad record
    datums = _archived_log(14)
    good = tmp_path / "good.avro"
    with good.open("wb") as out:
        write_snapshot(out, TOPIC, datums, {0: len(datums)})
    # A record Avro reads whose values no event holds: a node reading it from the topic halts there.
    bad_at = next(i for i, datum in enumerate(datums) if datum["segment"] is not None and i > 25)
    bad_datums = [*datums]
    bad_datums[bad_at] = {**datums[bad_at], "segment": {**datums[bad_at]["segment"], "start_offset": -4}}
    bad = tmp_path / "bad.avro"
    with bad.open("wb") as out:
        write_snapshot(out, TOPIC, bad_datums, {0: len(datums)})
    node = tmp_path / "node"

    with pytest.raises(SnapshotError, match=f"record at offset {bad_at} of {TOPIC} partition 0 does not read"):
        load_snapshot(bad, node)
    assert not (node / "view").exists()
    assert load_snapshot(good, node) == (TOPIC, {0: len(datums)})  # the same state dir takes the good one at once
