"""The SparkSession the pipeline, CLI and ops tests share: local[2], with s3a pointed at the test S3 server.

tests/conftest.py's session-scoped `spark` fixture builds it from here, so a run starts one Spark, set up once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from dev.s3 import S3Endpoint
from tierlog.pipeline.session import S3Settings, get_spark


def s3_settings(endpoint: S3Endpoint) -> S3Settings:
    return S3Settings(endpoint.endpoint, endpoint.access_key, endpoint.secret_key, endpoint.region)


@contextmanager
def local_spark(endpoint: S3Endpoint) -> Iterator[SparkSession]:
    path_before = set(sys.path)
    session = get_spark("tierlog-tests", master="local[2]", s3=s3_settings(endpoint))
    # pyspark puts every --packages jar on sys.path, in case one holds Python code (none of these do). A later
    # importlib.metadata lookup (prompt_toolkit's, when pyspark imports IPython) then lists each jar, 400k names
    # in the AWS SDK bundle, and caches them for the life of the process: every garbage collection of the rest of
    # the suite, one per RocksDB view closed, walked them, 0.5 s each.
    sys.path[:] = [p for p in sys.path if p in path_before or not p.endswith(".jar")]
    session.sparkContext.setLogLevel("ERROR")
    # Two cores: a handful of shuffle partitions keeps per-task overhead below the work.
    session.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        yield session
    finally:
        session.stop()
