"""Helpers shared by the test packages: the dev services, Kafka topics and records, S3 buckets.

`tests/` is on sys.path (tests/conftest.py), so test modules import these as `support.<module>`.
"""

from dev.process import wait_until

__all__ = ["wait_until"]
