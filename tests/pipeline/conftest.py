"""Fixtures of the pipeline tests: one local[2] SparkSession for the session and a generated history.

The history (100k records) is archived into a fresh prefix of the shared S3 bucket, read back through s3a.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pipeline_testkit import ARCHIVE_EVENTS, METADATA_TOPIC, ArchivedHistory, s3_settings
from pyspark.sql import SparkSession

from dev.s3 import S3Endpoint
from pipeline.generate import HistoryGenerator, HistorySpec, write_archive
from pipeline.locations import open_store
from pipeline.session import get_spark


@pytest.fixture(scope="session")
def spark(s3_endpoint: S3Endpoint) -> Iterator[SparkSession]:
    session = get_spark("tierlog-tests", master="local[2]", s3=s3_settings(s3_endpoint))
    session.sparkContext.setLogLevel("ERROR")
    # Two cores: a handful of shuffle partitions keeps per-task overhead below the work.
    session.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def archived_history(s3_endpoint: S3Endpoint) -> ArchivedHistory:
    generator = HistoryGenerator(HistorySpec(events=ARCHIVE_EVENTS, seed=11))
    records = list(generator.records())
    location = f"s3://{s3_endpoint.bucket}/pipeline-tests/{uuid.uuid4().hex[:12]}"
    store = open_store(location, s3_settings(s3_endpoint))
    try:
        write_archive(records, store, METADATA_TOPIC, records_per_file=10_000)
    finally:
        store.close()
    return ArchivedHistory(generator, records, location, METADATA_TOPIC)
