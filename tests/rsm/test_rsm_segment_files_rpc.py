"""FetchLogSegmentFiles, used as the JVM adapter uses it (rsm/README.md, "Segment bytes as files"): ask for a
range, open every returned file, release the lease, read the ranges; the bytes equal the segment's. The lease
keeps files in place against eviction until they are open; an open file stays readable after eviction.
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
from tierlog.agent import messages
from tierlog.agent.components import ComponentName
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer

CHUNK = 16 << 10
SEGMENT = 200_000


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
        """Window by window: open every file, release the lease, then read the ranges from the open files."""
        out = bytearray()
        while start < metadata.segment_size_in_bytes:
            answer = self.files(metadata, start, max_bytes)
            assert not answer.stream_instead and answer.lease_ms > 0
            descriptors = [os.open(r.path, os.O_RDONLY) for r in answer.ranges]
            self.release(answer)
            try:
                for fd, piece in zip(descriptors, answer.ranges, strict=True):
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
    running = Agent(tmp_path, {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": tmp_path / "cache"})
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
    agent = Agent(tmp_path, {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": tmp_path / "cache",
                             "fetch.chunk.cache.size": 4 * CHUNK, "fetch.chunk.cache.prefetch.max.size": 0})
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


def test_without_a_disk_cache_the_answer_says_to_stream_instead(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
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
    agent = Agent(tmp_path, {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": tmp_path / "cache"}, 0)
    try:
        metadata = agent.copy(random.Random(8).randbytes(SEGMENT))
        agent.read_like_the_adapter(metadata, 0, 0)
        text = prometheus_client.generate_latest(agent.server.metrics.registry).decode()
    finally:
        agent.close()
    assert f"tierlog_rsm_chunk_cache_bytes {float(SEGMENT)}" in text
    assert 'tierlog_rsm_events_total{counter="chunk_cache.hits"}' in text


def test_a_restarted_agent_answers_from_its_warm_cache(tmp_path: Path) -> None:
    config: dict[str, Any] = {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": tmp_path / "cache"}
    data = random.Random(9).randbytes(SEGMENT)
    before = Agent(tmp_path, config)
    try:
        metadata = before.copy(data)
        assert before.read_like_the_adapter(metadata, 0, 0) == data
    finally:
        before.close()
    after = Agent(tmp_path, config)
    try:
        assert after.read_like_the_adapter(metadata, 0, 0) == data
        rsm = after.server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 5)
        counters = rsm.metrics()["counters"]
        assert "chunk_cache.misses" not in counters and counters["chunk_cache.hits"] == -(-SEGMENT // CHUNK)
    finally:
        after.close()
