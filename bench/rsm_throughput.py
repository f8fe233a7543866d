"""Upload and fetch throughput of the RSM against raw boto3 on the same S3 server and the same bytes.

Reports MB/s for both and the ratio rsm / raw (1.0 = no overhead). Raw uploads use boto3's own managed
transfer with the RSM's multipart settings. Usage: python bench/rsm_throughput.py [--repeats N]
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

from boto3.s3.transfer import TransferConfig
from rsm_common import CountingClient, emit, remove_prefix, rsm_s3_config, services_env

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from rsm import LogSegmentData, RemoteStorageManager

MIB = 1 << 20
THRESHOLD = 32 * MIB
PART_SIZE = 16 * MIB
CONCURRENCY = 4
CHUNK = MIB
SIZES = {"8MiB_single_put": 8 * MIB, "64MiB_multipart": 64 * MIB}


def _mb_per_s(size: int, seconds: float) -> float:
    return round(size / MIB / seconds, 2)


def _drain(stream: Any) -> int:
    total = 0
    while chunk := stream.read(CHUNK):
        total += len(chunk)
    stream.close()
    return total


def run(size: int, repeats: int, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    prefix = f"bench/rsm-throughput/{uuid.uuid4().hex[:8]}"
    config = rsm_s3_config(env, prefix, **{
        "s3.multipart.threshold.bytes": THRESHOLD, "s3.multipart.part.size.bytes": PART_SIZE,
        "s3.multipart.concurrency": CONCURRENCY,
    })
    raw = CountingClient(env, max_pool_connections=CONCURRENCY)
    transfer = TransferConfig(multipart_threshold=THRESHOLD, multipart_chunksize=PART_SIZE,
                              max_concurrency=CONCURRENCY, use_threads=True)
    log = workdir / "segment.log"
    log.write_bytes(os.urandom(size))
    small = workdir / "index"
    small.write_bytes(os.urandom(4096))
    data = LogSegmentData(log, small, small, None, small, b"0\n1\n0 0\n")
    timings: dict[str, list[float]] = {"rsm_upload": [], "raw_upload": [], "rsm_fetch": [], "raw_fetch": []}
    tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
    with RemoteStorageManager(config) as rsm:
        try:
            for i in range(repeats):
                # Alternate which goes first, so neither always meets a warmer server.
                order = ("rsm", "raw") if i % 2 == 0 else ("raw", "rsm")
                metadata = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), 0, 99, 0, 0, 0, size, {0: 0})
                raw_key = f"{prefix}/raw/{uuid.uuid4()}.log"
                for who in order:
                    started = time.perf_counter()
                    if who == "rsm":
                        custom = rsm.copy_log_segment_data(metadata, data)
                    elif size >= THRESHOLD:
                        raw.client.upload_file(str(log), raw.bucket, raw_key, Config=transfer)
                    else:
                        raw.client.put_object(Bucket=raw.bucket, Key=raw_key, Body=log.read_bytes())
                    timings[f"{who}_upload"].append(time.perf_counter() - started)
                fetched = RemoteLogSegmentMetadata(metadata.remote_log_segment_id, 0, 99, 0, 0, 0, size, {0: 0},
                                                   custom_metadata=custom)
                for who in order:
                    started = time.perf_counter()
                    if who == "rsm":
                        got = _drain(rsm.fetch_log_segment(fetched, 0))
                    else:
                        got = _drain(raw.client.get_object(Bucket=raw.bucket, Key=raw_key)["Body"])
                    timings[f"{who}_fetch"].append(time.perf_counter() - started)
                    if got != size:
                        raise AssertionError(f"{who} fetched {got} bytes of {size}")
        finally:
            remove_prefix(raw, prefix)
    # The machine is shared: the best run shows each side's capability, the median its typical speed.
    result: dict[str, Any] = {}
    for op in ("upload", "fetch"):
        result[op] = {}
        for statistic, pick in (("median", statistics.median), ("best", min)):
            rsm_rate = _mb_per_s(size, pick(timings[f"rsm_{op}"]))
            raw_rate = _mb_per_s(size, pick(timings[f"raw_{op}"]))
            result[op][statistic] = {
                "rsm_mb_s": rsm_rate, "raw_boto3_mb_s": raw_rate, "ratio_rsm_to_raw": round(rsm_rate / raw_rate, 3)
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = services_env()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(size, args.repeats, env, Path(tmp)) for name, size in SIZES.items()}
    emit({
        "benchmark": "rsm_throughput",
        "s3_endpoint": env["S3_ENDPOINT"],
        "repeats": args.repeats,
        "multipart": {"threshold_bytes": THRESHOLD, "part_size_bytes": PART_SIZE, "concurrency": CONCURRENCY},
        "sizes": results,
    })


if __name__ == "__main__":
    main()
