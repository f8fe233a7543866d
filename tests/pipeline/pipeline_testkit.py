"""Helpers shared by the pipeline tests: the generated history's record and S3 settings from the services.

Kept out of conftest.py so test modules import them by a name no other test package uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierlog.pipeline.generate import HistoryGenerator, RawRecord

ARCHIVE_EVENTS = 100_000
METADATA_TOPIC = "__tierlog_metadata"


@dataclass(frozen=True)
class ArchivedHistory:
    generator: HistoryGenerator
    records: list[RawRecord]
    location: str  # s3://bucket/prefix holding audit/<METADATA_TOPIC>/...
    metadata_topic: str

