"""Scraping an agent as Prometheus does (HTTP, then prometheus_client's text parser), and the broker's rsm
calls the metrics tests drive through the agent's gRPC protocol."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from rlmm import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb


@dataclass(frozen=True)
class Scrape:
    """One parsed /metrics page."""

    families: dict[str, list[Sample]]

    @property
    def sample_names(self) -> set[str]:
        return {s.name for samples in self.families.values() for s in samples}

    def samples(self, name: str, **labels: str) -> list[Sample]:
        return [
            s for samples in self.families.values() for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The value of the one sample `name` with these labels (summed if several match, 0 if none)."""
        return sum(s.value for s in self.samples(name, **labels))


def scrape(url: str) -> Scrape:
    with urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return Scrape({f.name: list(f.samples) for f in text_string_to_metric_families(text)})


def segment_metadata(tp: TopicIdPartition, size: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
        start_offset=0,
        end_offset=99,
        max_timestamp_ms=1,
        broker_id=1,
        event_timestamp_ms=1,
        segment_size_in_bytes=size,
        segment_leader_epochs={0: 0},
    )


def copy_segment(
    storage: Any, directory: Path, log: bytes, metadata: RemoteLogSegmentMetadata | None = None
) -> RemoteLogSegmentMetadata:
    """Copy a segment (without a transaction index) through the agent; return its metadata with the
    custom metadata the copy returned."""
    segment = metadata or segment_metadata(TopicIdPartition(uuid.uuid4(), "orders", 0), len(log))
    # Laid out as a broker's log dir: the agent reads segment files only inside one.
    (directory / "meta.properties").write_text("version=1\n")
    directory = directory / "orders-0"
    directory.mkdir(exist_ok=True)
    files = {}
    for name, data in {"log": log, "index": b"\0" * 16, "timeindex": b"\0" * 24, "snapshot": b"snap"}.items():
        files[name] = directory / f"{segment.remote_log_segment_id.id}.{name}"
        files[name].write_bytes(data)
    answer = storage.CopyLogSegmentData(
        pb.CopyRequest(
            metadata=messages.segment_metadata_msg(segment),
            log_segment=str(files["log"]),
            offset_index=str(files["index"]),
            time_index=str(files["timeindex"]),
            producer_snapshot_index=str(files["snapshot"]),
            leader_epoch_index=b"0\n1\n0 0\n",
        ),
        timeout=60,
    )
    custom = answer.custom_metadata if answer.HasField("custom_metadata") else None
    return dataclasses.replace(segment, custom_metadata=custom)


def fetch(storage: Any, segment: RemoteLogSegmentMetadata) -> bytes:
    chunks = storage.FetchLogSegment(
        pb.FetchSegmentRequest(metadata=messages.segment_metadata_msg(segment), start_position=0), timeout=60
    )
    return b"".join(c.data for c in chunks)


def fetch_index_chunks(storage: Any, segment: RemoteLogSegmentMetadata, index_type: int) -> bytes:
    chunks = storage.FetchIndex(
        pb.FetchIndexRequest(metadata=messages.segment_metadata_msg(segment), index_type=index_type), timeout=30
    )
    return b"".join(c.data for c in chunks)
