"""Scraping an agent as Prometheus does (HTTP, then prometheus_client's text parser), and the broker's rsm
calls the metrics tests drive through the agent's gRPC protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from rlmm import RemoteLogSegmentMetadata
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
