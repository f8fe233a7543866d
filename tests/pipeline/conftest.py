"""Fixtures of the pipeline tests: a generated history per module (the SparkSession is tests/conftest.py's).

The history (100k records) is archived into a fresh prefix of the shared S3 bucket, read back through s3a.
"""

from __future__ import annotations

import uuid

import pytest
from pipeline_testkit import ARCHIVE_EVENTS, METADATA_TOPIC, ArchivedHistory
from support.spark import s3_settings

from dev.s3 import S3Endpoint
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, write_archive
from tierlog.pipeline.locations import open_store


# Module scope, though only test_pipeline_jobs.py uses it: a session-scoped history kept its 100k records (~800k
# objects) alive through every later test, and each full garbage collection (one per view closed) took 0.5 s.
@pytest.fixture(scope="module")
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
