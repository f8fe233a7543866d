"""rlmm.archive.stream_snapshot: a snapshot read as its bytes arrive (a bootstrap's download). A format 3 snapshot's
table parts come as slices of the chunks they arrived in, exactly the bytes of each table whatever the chunking; any
other snapshot is read by fastavro from the same bytes; a container it cannot frame exactly is a SnapshotError."""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fastavro
import pytest
from rlmm_testkit import make_tp

from rlmm import archive, codec
from rlmm import view_format as vf
from rlmm.archive import (
    TABLES_FORMAT,
    read_snapshot,
    stream_snapshot,
    to_archived,
    view_table_schema,
    write_chunked_view_snapshot,
    write_snapshot,
    write_table_snapshot,
)
from rlmm.errors import SnapshotError
from rlmm.types import RemotePartitionDeleteMetadata, RemotePartitionDeleteState

TOPIC = "meta"
ENDS = {0: 7, 3: 9}


def _chunks_of(data: bytes, sizes: Callable[[], int]) -> Callable[[], bytes]:
    """`read_chunk` over `data`, in chunks of the sizes drawn."""
    at = 0

    def read_chunk() -> bytes:
        nonlocal at
        chunk = data[at:at + sizes()]
        at += len(chunk)
        return chunk

    return read_chunk


def _tables(tmp_path: Path, rng: random.Random) -> list[tuple[str, Path]]:
    tables = []
    for family, size in ((vf.EPOCH_INDEX, 2_500), (vf.SEGMENTS, 9_001), (vf.PARTITION_META, 1)):
        path = tmp_path / f"{family}.sst"
        path.write_bytes(rng.randbytes(size))
        tables.append((family, path))
    return tables


def _table_snapshot(tables: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(archive, "_TABLE_PART_BYTES", 1_000)  # several parts, so several blocks, per table
    out = io.BytesIO()
    write_table_snapshot(out, TOPIC, tables, ENDS, "d" * 64, "topic-id", 1234)
    return out.getvalue()


def _joined(datums: Iterable[Any]) -> list[tuple[str, bytes]]:
    """Consecutive parts of one family joined: the tables, in order."""
    tables: list[tuple[str, bytes]] = []
    for datum in datums:
        part = bytes(datum["part"])
        if tables and tables[-1][0] == datum["family"]:
            tables[-1] = (datum["family"], tables[-1][1] + part)
        else:
            tables.append((datum["family"], part))
    return tables


@pytest.mark.parametrize("chunking", ["bytes of 1", "bytes of 7", "bytes of 4096", "whole", "random"])
def test_a_table_snapshot_streamed_in_any_chunks_gives_each_table_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunking: str
) -> None:
    rng = random.Random(chunking)
    tables = _tables(tmp_path, rng)
    data = _table_snapshot(tables, monkeypatch)
    sizes = {"bytes of 1": lambda: 1, "bytes of 7": lambda: 7, "bytes of 4096": lambda: 4096,
             "whole": lambda: len(data), "random": lambda: rng.randint(1, 3_000)}[chunking]

    header, datums = stream_snapshot(_chunks_of(data, sizes), "snap")

    assert header == read_snapshot(io.BytesIO(data))[0]
    assert (header.format, header.metadata_topic, dict(header.end_offsets)) == (TABLES_FORMAT, TOPIC, ENDS)
    assert _joined(datums) == [(family, path.read_bytes()) for family, path in tables]


def test_parts_are_slices_of_the_chunks_they_arrived_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _table_snapshot(_tables(tmp_path, random.Random(1)), monkeypatch)
    arrived: list[memoryview] = []

    def read_chunk() -> memoryview:
        at = sum(map(len, arrived))
        arrived.append(memoryview(data[at:at + 4096]))
        return arrived[-1]

    _header, datums = stream_snapshot(read_chunk, "snap")
    parts = [datum["part"] for datum in datums]
    assert all(isinstance(part, memoryview) and any(part.obj is chunk.obj for chunk in arrived) for part in parts)


def _other_snapshots() -> dict[str, bytes]:
    """Snapshots the chunk reader leaves to fastavro: formats 1 and 2, and a format 3 file another writer compressed."""
    tp = make_tp("chunks", 0)
    event = RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 5, 0)
    records = [to_archived(TOPIC, 0, 0, 0, b"k", codec.encode(event))]
    format_1, format_2, deflated = io.BytesIO(), io.BytesIO(), io.BytesIO()
    write_snapshot(format_1, TOPIC, records, ENDS)
    write_chunked_view_snapshot(format_2, TOPIC, [(vf.SEGMENTS, b"a", b"1"), (vf.SEGMENTS, b"b", b"")], ENDS, "d" * 64)
    plain = io.BytesIO()
    write_table_snapshot(plain, TOPIC, [], ENDS, "d" * 64)
    fastavro.writer(deflated, fastavro.parse_schema(view_table_schema()),
                    [{"family": vf.SEGMENTS, "part": b"x" * 5_000}], codec="deflate",
                    metadata={k: v for k, v in fastavro.reader(io.BytesIO(plain.getvalue())).metadata.items()
                              if not k.startswith("avro.")})
    return {"format 1": format_1.getvalue(), "format 2": format_2.getvalue(), "format 3, deflated": deflated.getvalue()}


@pytest.mark.parametrize("kind", ["format 1", "format 2", "format 3, deflated"])
def test_other_snapshots_are_read_by_fastavro_from_the_same_bytes(kind: str) -> None:
    data = _other_snapshots()[kind]
    rng = random.Random(kind)
    header, datums = stream_snapshot(_chunks_of(data, lambda: rng.randint(1, 200)), "snap")
    expected_header, expected = read_snapshot(io.BytesIO(data))
    assert header == expected_header
    assert list(datums) == list(expected) != []


def _block_starts(data: bytes) -> list[int]:
    """Where each block of a container begins, and where the file ends."""
    reader = fastavro.block_reader(io.BytesIO(data))
    sync = reader._header["sync"]
    starts, at = [], data.index(sync) + len(sync)
    while at < len(data):
        starts.append(at)
        at = data.index(sync, at) + len(sync)
    return [*starts, len(data)]


def test_a_snapshot_cut_short_is_an_error_unless_cut_between_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = _tables(tmp_path, random.Random(3))
    monkeypatch.setattr(archive, "_TABLE_PART_BYTES", 4_000)
    out = io.BytesIO()
    write_table_snapshot(out, TOPIC, tables, ENDS, "d" * 64)
    data = out.getvalue()
    boundaries = _block_starts(data)
    rng = random.Random(4)
    cuts = sorted({*rng.sample(range(len(data)), 300), *range(0, boundaries[0] + 2), *boundaries[:-1],
                   *(b + 1 for b in boundaries[:-1]), *(b - 1 for b in boundaries[1:])})
    for cut in cuts:
        try:
            _header, datums = stream_snapshot(_chunks_of(data[:cut], lambda: 512), "snap")
            got = _joined(datums)
        except SnapshotError:
            assert cut not in boundaries[1:-1], f"a file cut at block boundary {cut} reads"
            continue
        # An Avro container has no end marker: only a cut between blocks reads, as the blocks before it (the
        # object's sha256 then finds it short: rlmm.bootstrap.VerifiedStream).
        assert cut in boundaries, f"a file cut at byte {cut} read without an error"
        assert got == _joined(fastavro.reader(io.BytesIO(data[:cut])))


def _mended(data: bytes, at: int, replacement: bytes) -> bytes:
    return data[:at] + replacement + data[at + len(replacement):]


def test_a_container_it_cannot_frame_exactly_is_a_snapshot_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data = _table_snapshot(_tables(tmp_path, random.Random(5)), monkeypatch)
    first_block = _block_starts(data)[0]
    second_block = _block_starts(data)[1]
    broken = {
        "not a sync marker": (_mended(data, second_block - 1, bytes([data[second_block - 1] ^ 1])), "sync marker"),
        "a block's size": (_mended(data, first_block + 1, bytes([data[first_block + 1] + 2])), "block says"),
        "no datums": (_mended(data, first_block, b"\x00"), "a block of 0 datums"),
        "a number past ten bytes": (_mended(data, first_block, b"\xff" * 11), "ten bytes"),
    }
    for bad, says in broken.values():
        with pytest.raises(SnapshotError, match=says):
            _joined(stream_snapshot(_chunks_of(bad, lambda: 100), "snap")[1])
    for garbage in (b"", b"Obj", b"not avro at all", data[:4] + b"\x02\x00" + data[6:]):
        with pytest.raises(SnapshotError, match="not a tierlog snapshot"):
            stream_snapshot(_chunks_of(garbage, lambda: 100), "snap")
