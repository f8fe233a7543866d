"""Shared helpers of the RSM benchmarks: the services of `dev/services`, raw boto3 clients, request counting.

Each bench/rsm_*.py script prints one JSON document on stdout.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dev.env import services_env as dev_services_env  # noqa: E402


def services_env() -> dict[str, str]:
    """The dev services' addresses; exits with advice when none are running."""
    values = dev_services_env()
    if "S3_ENDPOINT" not in values:
        sys.exit("no S3 known: run `dev/services up` first")
    return values


def rsm_s3_config(env: dict[str, str], prefix: str, **extra: Any) -> dict[str, Any]:
    return {
        "storage.backend": "s3",
        "s3.endpoint.url": env["S3_ENDPOINT"],
        "s3.access.key.id": env["S3_ACCESS_KEY"],
        "s3.secret.access.key": env["S3_SECRET_KEY"],
        "s3.bucket": env["S3_BUCKET"],
        "s3.region": env.get("S3_REGION", "us-east-1"),
        "s3.prefix": prefix,
        **extra,
    }


class CountingClient:
    """A raw boto3 S3 client whose HTTP requests (retries included) are counted per operation."""

    def __init__(self, env: dict[str, str], max_pool_connections: int = 16) -> None:
        import boto3
        from botocore.config import Config

        self.client = boto3.client(
            "s3",
            endpoint_url=env["S3_ENDPOINT"],
            aws_access_key_id=env["S3_ACCESS_KEY"],
            aws_secret_access_key=env["S3_SECRET_KEY"],
            region_name=env.get("S3_REGION", "us-east-1"),
            config=Config(
                s3={"addressing_style": "path"},
                max_pool_connections=max_pool_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self.bucket = env["S3_BUCKET"]
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.client.meta.events.register("before-send.s3", self._count)

    def _count(self, event_name: str = "", **_: Any) -> None:
        with self._lock:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())


def remove_prefix(raw: CountingClient, prefix: str) -> None:
    """Delete every object under `prefix` (a bench's own), so that runs do not fill the dev services' S3."""
    keys = [o["Key"] for page in raw.client.get_paginator("list_objects_v2").paginate(
        Bucket=raw.bucket, Prefix=prefix) for o in page.get("Contents", [])]
    for start in range(0, len(keys), 1000):
        raw.client.delete_objects(Bucket=raw.bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]]})


def wire_requests(metrics: dict[str, Any]) -> int:
    """HTTP requests an RSM sent, from its `s3.http_attempts.*` counters."""
    return sum(v for k, v in metrics["counters"].items() if k.startswith("s3.http_attempts."))


def summary_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def emit(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
