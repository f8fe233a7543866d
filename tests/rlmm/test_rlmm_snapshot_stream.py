"""A snapshot object is read through rlmm.bootstrap.VerifiedStream: downloaded and hashed by a thread of its own ahead
of the reader. The reader gets the object's bytes exactly, the source's errors, a bounded wait when the source stalls,
and a verdict on the object's sha256; closing the stream stops its thread."""

from __future__ import annotations

import hashlib
import random
import threading
import time

import pytest

from rlmm import bootstrap
from rlmm.bootstrap import SnapshotRef, VerifiedStream
from rlmm.errors import SnapshotError

DATA = random.Random(7).randbytes(5 * (1 << 20) + 12_345)  # several of the download's reads, the last one short


class _Source:
    """An object's bytes, read at most `piece` at a time; `fail_at` raises once that many bytes were read, `stall_at`
    blocks there until `release` is set (or 10 s)."""

    def __init__(self, data: bytes, piece: int = 300_000, fail_at: int | None = None, stall_at: int | None = None):
        self.data, self.piece, self.fail_at, self.stall_at = data, piece, fail_at, stall_at
        self.at = 0
        self.release = threading.Event()

    def read(self, size: int = -1) -> bytes:
        if self.fail_at is not None and self.at >= self.fail_at:
            raise ConnectionResetError("connection reset by the bucket")
        if self.stall_at is not None and self.at >= self.stall_at:
            self.release.wait(10)
            return b""
        found = self.data[self.at:self.at + min(size, self.piece)]
        self.at += len(found)
        return found

    def close(self) -> None:
        self.release.set()


def _ref(data: bytes) -> SnapshotRef:
    return SnapshotRef("snapshots/t/id/00000000000000000001-x.avro", 1, hashlib.sha256(data).hexdigest())


def _read_all(stream: VerifiedStream, size: int) -> bytes:
    parts = []
    buffer = bytearray(size)
    while taken := stream.readinto(buffer):
        parts.append(bytes(buffer[:taken]))
    return b"".join(parts)


@pytest.mark.parametrize("size", [1000, 4096, 1 << 20, 3 << 20])
def test_the_reader_gets_the_objects_bytes_exactly_and_its_hash_verifies(size: int) -> None:
    stream = VerifiedStream(_Source(DATA), _ref(DATA))
    try:
        assert _read_all(stream, size) == DATA
        stream.verify()
    finally:
        stream.close()


def test_chunks_as_they_arrived_after_a_read_give_the_rest_of_the_object_exactly() -> None:
    stream = VerifiedStream(_Source(DATA), _ref(DATA))
    try:
        first = bytearray(1000)
        taken = stream.readinto(first)  # part of the first chunk: read_chunk gives what it left, then the others
        chunks = [bytes(first[:taken])]
        while chunk := stream.read_chunk():
            chunks.append(bytes(chunk))
        assert b"".join(chunks) == DATA and len(chunks) > 2
        assert stream.read_chunk() == b""
        stream.verify()
    finally:
        stream.close()


def test_a_partly_read_object_is_verified_whole_and_a_changed_byte_is_corruption() -> None:
    changed = bytearray(DATA)
    changed[len(DATA) // 2] ^= 1
    stream = VerifiedStream(_Source(bytes(changed)), _ref(DATA))
    try:
        stream.readinto(bytearray(1000))
        with pytest.raises(SnapshotError, match="is corrupt: its sha256 is"):
            stream.verify()
    finally:
        stream.close()


def test_the_sources_error_reaches_the_reader_and_verify_names_the_unread_object() -> None:
    stream = VerifiedStream(_Source(DATA, fail_at=2 << 20), _ref(DATA))
    try:
        with pytest.raises(ConnectionResetError):
            _read_all(stream, 1 << 20)
        with pytest.raises(SnapshotError, match="could not be read whole: ConnectionResetError"):
            stream.verify()
    finally:
        stream.close()


def test_a_stalled_source_is_an_error_after_the_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "READ_STALL_S", 0.3)
    source = _Source(DATA, stall_at=1 << 20)
    stream = VerifiedStream(source, _ref(DATA))
    started = time.monotonic()
    try:
        with pytest.raises(SnapshotError, match=r"no bytes arrived in 0\.3 s"):
            _read_all(stream, 1 << 20)
        assert time.monotonic() - started < 5
    finally:
        source.close()  # what the opener does after closing the stream: the stalled read returns
        stream.close()
    assert not stream._thread.is_alive()


def test_closing_a_stream_read_only_in_part_stops_its_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "READ_AHEAD_BYTES", 1 << 20)  # one read ahead: the download then waits for room
    stream = VerifiedStream(_Source(DATA), _ref(DATA))
    stream.readinto(bytearray(100))
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 2
    assert not stream._thread.is_alive()
