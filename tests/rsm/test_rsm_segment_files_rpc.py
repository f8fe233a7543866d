"""FetchLogSegmentFiles, used as the JVM adapter uses it (rsm/README.md, "Segment bytes as files"): ask for a
range, open every returned file, release the lease, read the ranges; the bytes equal the segment's. The lease
keeps files in place against eviction until they are open; an open file stays readable after eviction. A chunk file
the agent just wrote from checked bytes comes with its chunk's checksum, which the reader checks; others the agent
checks before answering. On the filesystem backend an untransformed segment is answered with the backend's own
file, unpinned, each range with its chunk's checksum, which the reader checks.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import prometheus_client
import pytest
from support.agent_segments import copy_segment

from rlmm.types import RemoteLogSegmentMetadata
from rsm.chunk_index import checksum
from tierlog.agent import messages
from tierlog.agent.components import ComponentName
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer

CHUNK = 16 << 10
SEGMENT = 200_000


def _cached(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A disk chunk cache whose files are handed out (not the filesystem backend's own)."""
    return {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": tmp_path / "cache",
            "fetch.files.direct": False, **extra}


class ChunkDamaged(Exception):
    """A chunk the answer said to check failed its check (the adapter's error)."""


class Agent:
    """An in-process agent on a Unix socket, its rsm on the filesystem backend, and the adapter's stubs."""

    def __init__(
        self, tmp_path: Path, rsm_config: dict[str, Any] | None = None, metrics_port: int | None = None
    ) -> None:
        socket = tmp_path / f"agent-{uuid.uuid4().hex[:6]}.sock"
        self.server = AgentServer({}, socket, metrics_port).start()
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.storage = pb_grpc.RemoteStorageStub(self.channel)
        config = {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote"),
                  "chunk.size": str(CHUNK), **{k: str(v) for k, v in (rsm_config or {}).items()}}
        pb_grpc.AgentStub(self.channel).Configure(
            pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=config), timeout=30
        )
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir(exist_ok=True)

    def copy(self, data: bytes) -> RemoteLogSegmentMetadata:
        return copy_segment(self.storage, self.log_dir, data)

    def files(self, metadata: RemoteLogSegmentMetadata, start: int, max_bytes: int = 0) -> Any:
        request = pb.FetchSegmentFilesRequest(
            metadata=messages.segment_metadata_msg(metadata), start_position=start, max_bytes=max_bytes
        )
        return self.storage.FetchLogSegmentFiles(request, timeout=30)

    def release(self, answer: Any) -> None:
        self.storage.ReleaseSegmentFiles(pb.SegmentFilesLease(lease_id=answer.lease_id), timeout=30)

    def read_like_the_adapter(self, metadata: RemoteLogSegmentMetadata, start: int, max_bytes: int) -> bytes:
        """Window by window: open every file, release the lease if there is one, check the chunks the answer says to
        check, then read the ranges from the open files."""
        out = bytearray()
        while start < metadata.segment_size_in_bytes:
            answer = self.files(metadata, start, max_bytes)
            assert not answer.stream_instead and (answer.lease_ms > 0) == bool(answer.lease_id)
            descriptors = [os.open(r.path, os.O_RDONLY) for r in answer.ranges]
            if answer.lease_id:
                self.release(answer)
            try:
                for fd, piece in zip(descriptors, answer.ranges, strict=True):
                    if piece.HasField("check"):
                        check = piece.check
                        if checksum(os.pread(fd, check.length, check.offset)) != check.crc32c:
                            raise ChunkDamaged(f"chunk {check.chunk} of {piece.path} fails its CRC32C")
                    out += os.pread(fd, piece.length, piece.offset)
            finally:
                for fd in descriptors:
                    os.close(fd)
            start = answer.end_position + 1
        return bytes(out)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace=1)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    running = Agent(tmp_path, _cached(tmp_path))
    yield running
    running.close()


@pytest.mark.parametrize("max_bytes", [0, 40_000, CHUNK], ids=["agent-chooses", "40000", "one-chunk"])
def test_the_files_of_a_whole_segment_read_as_the_adapter_does_equal_its_bytes(
    agent: Agent, max_bytes: int
) -> None:
    data = random.Random(1).randbytes(SEGMENT)
    metadata = agent.copy(data)
    assert agent.read_like_the_adapter(metadata, 0, max_bytes) == data
    assert agent.read_like_the_adapter(metadata, 12_345, max_bytes) == data[12_345:]  # warm, from mid-chunk


def test_an_end_position_bounds_the_answer(agent: Agent) -> None:
    data = random.Random(2).randbytes(SEGMENT)
    metadata = agent.copy(data)
    request = pb.FetchSegmentFilesRequest(
        metadata=messages.segment_metadata_msg(metadata), start_position=1000, end_position=50_000
    )
    answer = agent.storage.FetchLogSegmentFiles(request, timeout=30)
    assert answer.end_position == 50_000
    assert b"".join(Path(r.path).read_bytes()[r.offset : r.offset + r.length] for r in answer.ranges) == data[
        1000:50_001
    ]
    agent.release(answer)


def test_leased_files_survive_eviction_until_released_and_open_ones_stay_readable(tmp_path: Path) -> None:
    # A cache of four chunks: reading another segment evicts everything that is not pinned.
    agent = Agent(tmp_path, _cached(tmp_path, **{"fetch.chunk.cache.size": 4 * CHUNK,
                                                 "fetch.chunk.cache.prefetch.max.size": 0}))
    try:
        data, other = random.Random(3).randbytes(SEGMENT), random.Random(4).randbytes(SEGMENT)
        metadata, other_metadata = agent.copy(data), agent.copy(other)
        answer = agent.files(metadata, 0, 2 * CHUNK)
        paths = [Path(r.path) for r in answer.ranges]
        agent.read_like_the_adapter(other_metadata, 0, CHUNK)  # floods the cache while the lease holds
        assert all(p.exists() for p in paths)
        fd = os.open(paths[0], os.O_RDONLY)
        try:
            agent.release(answer)
            agent.read_like_the_adapter(other_metadata, 0, CHUNK)
            assert not paths[0].exists()  # evicted once released
            assert os.pread(fd, CHUNK, 0) == data[:CHUNK]  # yet the open file reads on
        finally:
            os.close(fd)
    finally:
        agent.close()


def test_a_damaged_cache_file_is_refetched_before_it_is_handed_out(agent: Agent) -> None:
    data = random.Random(5).randbytes(SEGMENT)
    metadata = agent.copy(data)
    answer = agent.files(metadata, 0, CHUNK)
    agent.release(answer)
    victim = Path(answer.ranges[0].path)
    victim.write_bytes(b"\0" * CHUNK)
    assert agent.read_like_the_adapter(metadata, 0, CHUNK) == data


def test_a_chunk_the_agent_just_cached_is_left_for_its_reader_to_check_and_a_damaged_one_is_refetched_by_the_stream(
    agent: Agent,
) -> None:
    data = random.Random(10).randbytes(SEGMENT)
    metadata = agent.copy(data)
    answer = agent.files(metadata, 0, CHUNK)
    agent.release(answer)
    (piece,) = answer.ranges
    assert (piece.check.chunk, piece.check.offset, piece.check.length, piece.check.crc32c) == (
        0, 0, CHUNK, checksum(data[:CHUNK])
    )
    # Damaged in place, its size and modification time kept: the agent does not see it, the reader's check does.
    victim = Path(piece.path)
    before = victim.stat()
    with victim.open("r+b") as out:
        out.write(b"\xff" if data[0] != 0xFF else b"\0")
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ChunkDamaged, match="chunk 0 "):
        agent.read_like_the_adapter(metadata, 0, CHUNK)
    # What the adapter does then: stream the range, through the agent's own check, which drops the file.
    fetch = pb.FetchSegmentRequest(metadata=messages.segment_metadata_msg(metadata), start_position=0)
    assert b"".join(c.data for c in agent.storage.FetchLogSegment(fetch, timeout=30)) == data
    assert agent.read_like_the_adapter(metadata, 0, CHUNK) == data


def test_without_a_disk_cache_the_answer_says_to_stream_instead(tmp_path: Path) -> None:
    agent = Agent(tmp_path, {"fetch.files.direct": False})
    try:
        answer = agent.files(agent.copy(b"x" * 1000), 0)
        assert "FetchLogSegment" in answer.stream_instead and not answer.ranges
    finally:
        agent.close()


def test_a_request_naming_the_next_segment_prefetches_its_first_chunks(agent: Agent, tmp_path: Path) -> None:
    first, second = random.Random(6).randbytes(SEGMENT), random.Random(7).randbytes(SEGMENT)
    first_md, second_md = agent.copy(first), agent.copy(second)
    request = pb.FetchSegmentFilesRequest(
        metadata=messages.segment_metadata_msg(first_md), start_position=SEGMENT - 100,
        next_segment=messages.segment_metadata_msg(second_md),
    )
    agent.release(agent.storage.FetchLogSegmentFiles(request, timeout=30))
    rsm = agent.server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 5)
    assert rsm.prefetch_idle(30)
    assert (tmp_path / "cache" / str(second_md.remote_log_segment_id.id) / "0").read_bytes() == second[:CHUNK]


def test_the_agent_exports_the_chunk_cache_metrics(tmp_path: Path) -> None:
    agent = Agent(tmp_path, _cached(tmp_path), 0)
    try:
        metadata = agent.copy(random.Random(8).randbytes(SEGMENT))
        agent.read_like_the_adapter(metadata, 0, 0)
        text = prometheus_client.generate_latest(agent.server.metrics.registry).decode()
    finally:
        agent.close()
    assert f"tierlog_rsm_chunk_cache_bytes {float(SEGMENT)}" in text
    assert 'tierlog_rsm_events_total{counter="chunk_cache.hits"}' in text


def test_a_restarted_agent_answers_from_its_warm_cache(tmp_path: Path) -> None:
    config = _cached(tmp_path)
    data = random.Random(9).randbytes(SEGMENT)
    before = Agent(tmp_path, config)
    try:
        metadata = before.copy(data)
        assert before.read_like_the_adapter(metadata, 0, 0) == data
    finally:
        before.close()
    after = Agent(tmp_path, config)
    try:
        # Files it did not write itself: the agent checks them before answering, their reader need not.
        answer = after.files(metadata, 0)
        after.release(answer)
        assert answer.ranges and not any(r.HasField("check") for r in answer.ranges)
        assert after.read_like_the_adapter(metadata, 0, 0) == data
        rsm = after.server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 5)
        counters = rsm.metrics()["counters"]
        assert "chunk_cache.misses" not in counters and counters["chunk_cache.hits"] == 2 * -(-SEGMENT // CHUNK)
    finally:
        after.close()


# -- the filesystem backend's own files ------------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["disk", "none"])
def test_an_untransformed_segment_is_answered_with_the_backends_own_file_and_nothing_copied(
    tmp_path: Path, cache: str
) -> None:
    config = {"fetch.chunk.cache.class": cache, "fetch.chunk.cache.path": tmp_path / "cache"}
    agent = Agent(tmp_path, config if cache == "disk" else {})
    try:
        data = random.Random(10).randbytes(SEGMENT)
        metadata = agent.copy(data)
        assert agent.read_like_the_adapter(metadata, 0, 40_000) == data
        assert agent.read_like_the_adapter(metadata, 12_345, 0) == data[12_345:]
        answer = agent.files(metadata, CHUNK + 7, 2 * CHUNK)
        stored = tmp_path / "remote"
        assert not answer.lease_id and {Path(r.path).parent.parent.parent for r in answer.ranges} == {stored}
        # Each range's check covers its whole chunk, where the chunk lies in the file.
        assert [(r.offset, r.length, r.check.chunk, r.check.offset, r.check.length) for r in answer.ranges] == [
            (CHUNK + 7, CHUNK - 7, 1, CHUNK, CHUNK), (2 * CHUNK, CHUNK, 2, 2 * CHUNK, CHUNK),
            (3 * CHUNK, 7, 3, 3 * CHUNK, CHUNK)]
        assert not list((tmp_path / "cache").rglob("*[0-9]"))  # no chunk was copied into a cache
    finally:
        agent.close()


def test_a_damaged_chunk_of_the_backends_file_fails_the_readers_check_naming_the_chunk(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    try:
        data = random.Random(11).randbytes(SEGMENT)
        metadata = agent.copy(data)
        (log_file,) = (tmp_path / "remote").rglob("*.log")
        damaged = bytearray(log_file.read_bytes())
        damaged[3 * CHUNK + 5] ^= 1
        log_file.write_bytes(bytes(damaged))
        assert agent.read_like_the_adapter(metadata, 4 * CHUNK, 0) == data[4 * CHUNK :]
        with pytest.raises(ChunkDamaged, match="chunk 3 "):
            agent.read_like_the_adapter(metadata, 0, 3 * CHUNK)
    finally:
        agent.close()


def test_a_segment_whose_file_is_gone_is_not_found(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    try:
        metadata = agent.copy(b"y" * 1000)
        for log_file in (tmp_path / "remote").rglob("*.log"):
            log_file.unlink()
        with pytest.raises(grpc.RpcError) as failed:
            agent.files(metadata, 0)
        assert failed.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        agent.close()


# -- a segment's indexes in one call ---------------------------------------------------------------------------


def test_fetch_indexes_answers_each_asked_index_of_a_segment_in_one_call_marking_absent_ones(agent: Agent) -> None:
    metadata = agent.copy(b"z" * 1000)
    asked = [pb.OFFSET, pb.TIMESTAMP, pb.TRANSACTION]
    request = pb.FetchIndexesRequest(metadata=messages.segment_metadata_msg(metadata), index_types=asked)
    pieces = list(agent.storage.FetchIndexes(request, timeout=30))
    assert [p.index_type for p in pieces] == asked
    assert [(p.data, p.absent) for p in pieces] == [(b"\0" * 16, False), (b"\0" * 24, False), (b"", True)]
    rsm = agent.server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 5)
    assert rsm.metrics()["operations"]["backend.get"]["requests"] == 1  # the three from one GET of the packed index
