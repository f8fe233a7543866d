"""Upload throughput of `copy_log_segment_data` against raw boto3 `upload_file` (TransferConfig with the rsm's part
size and concurrency) to the same S3 server, the same file, taking turns in one run; raw boto3 both without request
checksums and with botocore's default (a CRC32 per part, as the rsm sends); where the rsm's time goes (its CRC32C
chunk pass, the store's multipart put); and one upload under `upload.rate.limit.bytes.per.second`.

Usage: python bench/rsm_upload.py [--size-mib N] [--repeats N] [--limit-mib-s N]; prints JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from rsm_common import CountingClient, emit, remove_prefix, rsm_s3_config, services_env

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from rsm import LogSegmentData, RemoteStorageManager, chunk_index

MIB = 1 << 20
THRESHOLD = 32 * MIB
PART_SIZE = 16 * MIB
CONCURRENCY = 4


def _mib_s(size: int, seconds: float) -> float:
    return round(size / MIB / seconds, 1)


def _segment(workdir: Path, size: int) -> LogSegmentData:
    log = workdir / "00000000000000000000.log"
    log.write_bytes(os.urandom(size))
    small = workdir / "00000000000000000000.index"
    small.write_bytes(os.urandom(4096))
    return LogSegmentData(log, small, small, None, small, b"0\n1\n0 0\n")


def _metadata(size: int) -> RemoteLogSegmentMetadata:
    tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), 0, 99, 0, 0, 0, size, {0: 0})


def _default_client(env: dict[str, str]) -> Any:
    """A boto3 client as it comes (request_checksum_calculation=when_supported: a CRC32 on every part)."""
    return boto3.client(
        "s3", endpoint_url=env["S3_ENDPOINT"], aws_access_key_id=env["S3_ACCESS_KEY"],
        aws_secret_access_key=env["S3_SECRET_KEY"], region_name=env.get("S3_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=CONCURRENCY),
    )


def _timed(action: Any, *args: Any, **kwargs: Any) -> float:
    started = time.perf_counter()
    action(*args, **kwargs)
    return time.perf_counter() - started


def run(size: int, repeats: int, limit: int, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    prefix = f"bench/rsm-upload/{uuid.uuid4().hex[:8]}"
    multipart = {"s3.multipart.threshold.bytes": THRESHOLD, "s3.multipart.part.size.bytes": PART_SIZE,
                 "s3.multipart.concurrency": CONCURRENCY}
    raw = CountingClient(env, max_pool_connections=CONCURRENCY)
    transfer = TransferConfig(multipart_threshold=THRESHOLD, multipart_chunksize=PART_SIZE,
                              max_concurrency=CONCURRENCY, use_threads=True)
    clients = {"raw_boto3": raw.client, "raw_boto3_crc32": _default_client(env)}
    data = _segment(workdir, size)
    sides = ("rsm", *clients)
    times: dict[str, list[float]] = {who: [] for who in (*sides, "rsm_crc32c_pass", "rsm_backend_put")}
    ratios: dict[str, list[float]] = {who: [] for who in clients}
    try:
        with RemoteStorageManager(rsm_s3_config(env, prefix, **multipart)) as rsm:
            for i in range(repeats):
                # Take turns going first, so no side always meets a warmer server or page cache.
                run_times = {}
                for who in sides[i % len(sides):] + sides[:i % len(sides)]:
                    if who == "rsm":
                        run_times[who] = _timed(rsm.copy_log_segment_data, _metadata(size), data)
                    else:
                        run_times[who] = _timed(
                            clients[who].upload_file, str(data.log_segment), raw.bucket,
                            f"{prefix}/raw/{uuid.uuid4()}.log", Config=transfer,
                        )
                    times[who].append(run_times[who])
                for who in clients:
                    ratios[who].append(run_times[who] / run_times["rsm"])
                times["rsm_crc32c_pass"].append(_timed(chunk_index.build, data.log_segment, 4 * MIB))
                times["rsm_backend_put"].append(
                    _timed(rsm.backend.put, f"{prefix}/put/{uuid.uuid4()}.log", data.log_segment)
                )
        with RemoteStorageManager(rsm_s3_config(env, prefix, **multipart, **{
            "upload.rate.limit.bytes.per.second": limit,
        })) as limited:
            limited_s = _timed(limited.copy_log_segment_data, _metadata(size), data)
            throttled_ms = limited.metrics()["counters"].get("upload.throttled_ms", 0)
    finally:
        remove_prefix(raw, prefix)
    return {
        "size_mib": size // MIB,
        "median_mib_s": {who: _mib_s(size, statistics.median(t)) for who, t in times.items()},
        "best_mib_s": {who: _mib_s(size, min(t)) for who, t in times.items()},
        # Per run, raw time / rsm time: >= 1.0 means the rsm was as fast as boto3 or faster.
        "ratio_rsm_to_raw_per_run": {who: [round(r, 3) for r in rs] for who, rs in ratios.items()},
        "ratio_rsm_to_raw_median": {who: round(statistics.median(rs), 3) for who, rs in ratios.items()},
        "rate_limited": {
            "limit_mib_s": round(limit / MIB, 1),
            "mib_s": _mib_s(size, limited_s),
            # The first second's worth comes from the full bucket.
            "lower_bound_s": round(max(size - limit, 0) / limit, 2),
            "seconds": round(limited_s, 2),
            "throttled_ms": throttled_ms,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit-mib-s", type=int, default=16)
    args = parser.parse_args()
    env = services_env()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.size_mib * MIB, args.repeats, args.limit_mib_s * MIB, env, Path(tmp))
    emit({
        "benchmark": "rsm_upload",
        "s3_endpoint": env["S3_ENDPOINT"],
        "repeats": args.repeats,
        "multipart": {"threshold_bytes": THRESHOLD, "part_size_bytes": PART_SIZE, "concurrency": CONCURRENCY},
        "load_average": os.getloadavg(),
        **result,
    })


if __name__ == "__main__":
    main()
